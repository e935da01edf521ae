"""The node agent installs as its own distribution, without the portal (design §18)."""

from __future__ import annotations

import ast
import json
import re
import sys
import tomllib
from pathlib import Path

from tests.deploy.conftest import REPO, AgentVenv

AGENT_PYPROJECT = REPO / "nodeagent" / "pyproject.toml"
# Third-party modules nodeagent/** imports, and where each comes from.
IMPORT_TO_DISTRIBUTION = {"websockets": "websockets", "numpy": "numpy", "pyroute2": "pyroute2",
                          "pynvml": "nvidia-ml-py"}
NOT_DEPENDENCIES = {
    "bcc": "Debian's python3-bpfcc, found by nodeagent.enforcement.bccshim",
    "torch": "imported lazily by training scripts through jobkit / jobkit_torch, the [torch] extra",
    "transformers": "imported lazily by Hugging Face training scripts through jobkit_torch",
}
OWN_PACKAGES = {"nodeagent", "scheduler"}


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


def _third_party_imports() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted((REPO / "nodeagent").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OWN_PACKAGES:
                    found.setdefault(top, []).append(str(path.relative_to(REPO)))
    return found


def test_every_third_party_import_of_the_agent_is_a_declared_dependency() -> None:
    project = tomllib.loads(AGENT_PYPROJECT.read_text())["project"]
    declared = {_requirement_name(r) for r in project["dependencies"]}
    imports = _third_party_imports()
    unexplained = sorted(set(imports) - set(IMPORT_TO_DISTRIBUTION) - set(NOT_DEPENDENCIES))
    assert not unexplained, f"nodeagent imports {unexplained} ({imports}): declare them in nodeagent/pyproject.toml"
    assert declared == {IMPORT_TO_DISTRIBUTION[m] for m in imports if m in IMPORT_TO_DISTRIBUTION}
    assert "bcc" not in declared and not {"django", "celery", "channels", "daphne"} & declared


def test_agent_dependency_ranges_match_the_portal_distribution() -> None:
    agent = tomllib.loads(AGENT_PYPROJECT.read_text())["project"]["dependencies"]
    root = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    ranges = {_requirement_name(r): r.replace(" ", "") for r in root}
    for requirement in agent:
        assert ranges[_requirement_name(requirement)] == requirement.replace(" ", ""), requirement


def test_fresh_venv_runs_the_console_script(agent_venv: AgentVenv) -> None:
    out = agent_venv.run(str(agent_venv.bin_dir / "reclaimnet-agent"), "--help")
    assert out.returncode == 0, out.stderr
    assert "usage: reclaimnet-agent" in out.stdout and "--check-config" in out.stdout


def test_fresh_venv_has_none_of_the_portal_packages(agent_venv: AgentVenv) -> None:
    for module in ("django", "celery", "rest_framework", "channels", "psycopg", "scipy"):
        out = agent_venv.run(str(agent_venv.python), "-c", f"import {module}")
        assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr, module


def test_fresh_venv_imports_every_agent_module(agent_venv: AgentVenv, tmp_path: Path) -> None:
    """Each module of the installed package imports with the declared dependencies alone (run outside the
    checkout, so only the installed copy can be found)."""
    script = (
        "import importlib, pkgutil, nodeagent, nodeagent.enforcement\n"
        "names = [m.name for p in (nodeagent, nodeagent.enforcement)\n"
        "         for m in pkgutil.iter_modules(p.__path__, p.__name__ + '.')]\n"
        "for name in names: importlib.import_module(name)\n"
        "print(len(names), nodeagent.__file__)\n"
    )
    out = agent_venv.run(str(agent_venv.python), "-c", script, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    count, location = out.stdout.split()
    assert int(count) >= 15 and location.startswith(str(agent_venv.root))


def test_installed_agent_carries_p3_and_the_bpf_sources_from_the_one_checkout(agent_venv: AgentVenv,
                                                                                tmp_path: Path) -> None:
    script = (
        "import scheduler.p3, nodeagent.enforcement.structs as s\n"
        "print(scheduler.p3.DSCP['migration'], s.BPF_DIR, sorted(p.name for p in s.BPF_DIR.iterdir()),"
        " s.header_constants() != {})\n"
    )
    out = agent_venv.run(str(agent_venv.python), "-c", script, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("34 " + str(agent_venv.root)) and out.stdout.rstrip().endswith("True")
    shipped = {p.name for p in (REPO / "bpf").iterdir() if p.suffix in (".c", ".h")}
    assert all(name in out.stdout for name in shipped)
    # Only the scheduler module the agent uses rides along (the rest needs scipy).
    site = agent_venv.run(str(agent_venv.python), "-c", "import scheduler, os; print(sorted(os.listdir("
                          "os.path.dirname(scheduler.__file__))))", cwd=tmp_path)
    assert "'p3.py'" in site.stdout and "estimators.py" not in site.stdout


def test_fresh_venv_checks_a_config(agent_venv: AgentVenv, tmp_path: Path) -> None:
    token = tmp_path / "agent-token"
    token.write_text("rna_example\n")
    token.chmod(0o600)
    config = tmp_path / "agent.json"
    config.write_text(json.dumps({"portal": "wss://portal.example.edu/ws/agent/", "token_file": str(token),
                                  "data_port": 7070}))
    out = agent_venv.run(str(agent_venv.bin_dir / "reclaimnet-agent"), "--check-config", str(config))
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
    token.chmod(0o644)
    out = agent_venv.run(str(agent_venv.bin_dir / "reclaimnet-agent"), "--check-config", str(config))
    assert out.returncode == 2 and out.stderr.startswith("error: token_file:") and "0644" in out.stderr

