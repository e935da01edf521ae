"""The portal's modules import each other without loops, at module level, and core services never reach
for a Celery task module (design §9.3: one enqueue seam, the outbox)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PORTAL = REPO / "portal"
# Imported by ``celery beat`` before Django's app registry is ready: model imports must wait for the call.
LATE_IMPORTS_ALLOWED = {"portal.beat"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PORTAL.rglob("*.py") if "migrations" not in p.parts}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, module: str, known: set[str]) -> set[str]:
    """The portal modules an import statement runs (the module itself, or ``from package import module``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert not node.level, f"{module}: relative import (the portal imports absolutely)"
        base = node.module or ""
        names = [base] + [f"{base}.{alias.name}" for alias in node.names]
    found = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name.startswith("portal"):
            found.add(name)
    return found


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []

    def walk(body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                out.append(stmt)
            elif isinstance(stmt, ast.If) and not _is_type_checking(stmt):
                walk(stmt.body)
                walk(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                walk(stmt.body)
                for handler in stmt.handlers:
                    walk(handler.body)

    walk(tree.body)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for stmt in _module_level_imports(ast.parse(path.read_text())):
            edges |= _targets(stmt, name, known)
        graph[name] = edges - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_loop_finder_finds_loops() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_the_imports_it_should() -> None:
    graph = _graph()
    assert "portal.control.reclaim.plan" in graph["portal.control.reclaim.apply"]
    assert "portal.core.campus" in graph["portal.control.reclaim.plan"]
    assert "portal.core.models" in graph["portal.core.campus"]


def test_no_import_loop_among_the_portals_modules() -> None:
    assert _cycles(_graph()) == []


def test_imports_inside_functions_only_where_django_requires_them() -> None:
    late = []
    known = set(_modules())
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            inside_ready = node.name == "ready" and path.name == "apps.py"
            for inner in ast.walk(node):
                late_import = isinstance(inner, ast.Import | ast.ImportFrom) and _targets(inner, name, known)
                if late_import and name not in LATE_IMPORTS_ALLOWED and not inside_ready:
                    late.append(f"{name}:{inner.lineno}")
    assert late == []


def test_core_services_never_import_a_celery_task_module() -> None:
    graph = _graph()
    services = [m for m in graph if m.startswith(("portal.core.services", "portal.core.api", "portal.web"))]
    assert [m for m in services if "portal.control.tasks" in graph[m]] == []
    assert [m for m in graph if m.startswith("portal.core.services") and any(
        t.startswith("portal.control") for t in graph[m])] == []
