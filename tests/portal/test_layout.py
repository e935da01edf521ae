"""The models and the lifecycle import each other one way only (design §9.6 Lifecycles, §9.3).

``portal.core.states`` holds the job and node states and their transition tables and imports no model; the
models take their choices from it and the lifecycle takes the models. Unlike ``test_import_graph`` this counts
``if TYPE_CHECKING:`` imports and the package ``__init__`` an import runs, since a reader (and a type checker)
follows those arrows too: before ``portal.core.states`` they tied ten files into one circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("portal.core.states", "portal.core.models", "portal.core.lifecycle")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    paths = [REPO / "portal/core/states.py", *(REPO / "portal/core/models").rglob("*.py"),
             *(REPO / "portal/core/lifecycle").rglob("*.py")]
    return {_module_name(p): p for p in paths}


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _graph() -> dict[str, set[str]]:
    """Module → the modules of ``LAYERS`` its imports run, anywhere in the file (TYPE_CHECKING blocks included),
    with each package ``__init__`` on the way that is not the importer's own."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for dotted in _imported(node):
                parts = dotted.split(".")
                edges |= {m for i in range(1, len(parts) + 1) if (m := ".".join(parts[:i])) in modules}
        graph[name] = edges - own - {name}
    return graph


def _cycle_from(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path (first module repeated at the end), or [] when there is none."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(v: str) -> list[str]:
        state[v] = "open"
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == "open":
                return [*path[path.index(w):], w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = "done"
        path.pop()
        return []

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return []


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycle_from({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle_from({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_graph_sees_the_arrows_it_should() -> None:
    graph = _graph()
    assert "portal.core.states" in graph["portal.core.models.jobs"]
    assert "portal.core.states" in graph["portal.core.models.nodes"]
    # The type-only import of the models is an arrow too.
    assert "portal.core.models" in graph["portal.core.lifecycle.jobs"]
    assert "portal.core.states" in graph["portal.core.lifecycle.jobs"]
    assert "portal.core.lifecycle.labels" in graph["portal.core.lifecycle.base"]


def test_states_models_and_lifecycle_import_without_a_cycle() -> None:
    assert _cycle_from(_graph()) == []


def test_the_arrow_runs_states_to_models_to_lifecycle() -> None:
    graph = _graph()
    states = graph["portal.core.states"]
    models_up = {t for m, ts in graph.items() if m.startswith("portal.core.models") for t in ts
                 if t.startswith("portal.core.lifecycle")}
    assert states == set()
    assert models_up == set()


def test_the_lifecycle_moves_the_states_the_models_store() -> None:
    from portal.core.lifecycle import jobs, nodes
    from portal.core.models import Job, Node
    from portal.core.states import JOB_ALLOWED, NODE_ALLOWED, JobState, NodeState

    assert jobs.ALLOWED is JOB_ALLOWED and nodes.ALLOWED is NODE_ALLOWED
    assert jobs.JobState is JobState and nodes.NodeState is NodeState
    assert Job._meta.get_field("state").choices == JobState.choices
    assert Node._meta.get_field("state").choices == NodeState.choices
