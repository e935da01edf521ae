"""Every make target named in the README and in `make help` exists and installs what its code needs.

The walk runs `make -n -B TARGET` (a dry run that treats every file as out of date, as on a fresh clone with no
`.venv`), takes the Python entry points the recipe runs (`scripts/*.py`, `python -m`, pytest paths), follows their
module-level imports through the project's own modules, and asks that each optional part reached be installed by
the same recipe: the torch extra (scripts/install_torch_deps.sh), Debian's chromium for Playwright
(scripts/install_browser_deps.sh), Debian's BCC and headers for the kernel programs (scripts/install_kernel_deps.sh).
Module-level imports only: an import inside a function runs only on the path that needs it.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("portal", "scheduler", "nodeagent", "reclaimnet", "tests")
# an optional part -> the install step a target using it must run (a module reached at module level)
NEEDS = {
    "torch": "install_torch_deps.sh", "transformers": "install_torch_deps.sh", "accelerate": "install_torch_deps.sh",
    "playwright": "install_browser_deps.sh",
    "nodeagent.enforcement.bccshim": "install_kernel_deps.sh",
}
LONG_TARGETS = {"demo"}  # serves until stopped: dry run only (every target here is a dry run)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    env.pop("MFLAGS", None)
    return env


def named_targets() -> set[str]:
    """The targets the README and `make help` name."""
    names = set(re.findall(r"(?:`|^ {4})make ([a-z][a-z0-9-]*)", (REPO / "README.md").read_text(), re.MULTILINE))
    helped = subprocess.run(["make", "--no-print-directory", "help"], cwd=REPO, capture_output=True, text=True,
                            env=_clean_env(), check=True).stdout
    for line in helped.splitlines():
        if line.startswith("other targets:"):
            names.update(line.split(":", 1)[1].split())
        elif line.startswith("make "):
            names.add(line.split()[1])
    return names


def _module_file(name: str, near: Path) -> Path | None:
    """The file of a project module (or of a script beside ``near``), None for third-party modules."""
    parts = name.split(".")
    if parts[0] in PROJECT_PACKAGES:
        base = REPO.joinpath(*parts)
    elif (near.parent / f"{parts[0]}.py").exists():
        base = near.parent.joinpath(*parts)
    else:
        return None
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _top_level_imports(tree: ast.Module) -> list[str]:
    """Modules imported by statements that run at import time (module body, if/try/with blocks, class bodies)."""
    found: list[str] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append(node.module)
                found.extend(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        walk([n for n in inner if isinstance(n, ast.stmt)] +
                             [s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body])
    walk(tree.body)
    return found


@functools.cache
def imports_reached(path: Path) -> frozenset[str]:
    """Every module name reached at import time from ``path``, through the project's own modules."""
    seen: set[Path] = set()
    names: set[str] = set()
    todo = [path]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        for name in _top_level_imports(ast.parse(f.read_text(), str(f))):
            names.add(name)
            target = _module_file(name, f)
            if target is not None:
                todo.append(target)
    return frozenset(names)


def entry_files(dry_run: str) -> list[Path]:
    """The Python files a dry-run recipe runs: scripts, `-m` modules and the test files of pytest paths."""
    files: list[Path] = []
    for line in dry_run.splitlines():
        files += [REPO / m for m in re.findall(r"\b(scripts/[\w/]+\.py)\b", line)]
        for mod in re.findall(r"-m ((?:tests|scheduler|portal|nodeagent|reclaimnet)[\w.]*)", line):
            f = _module_file(mod, REPO / "x.py")
            if f is not None:
                files.append(f.parent / "__main__.py" if f.name == "__init__.py" else f)
        if "pytest" in line:
            for p in re.findall(r"(?<![=\w/])(tests/[\w./-]+)", line):  # not --ignore=tests/...
                target = REPO / p
                files += sorted(target.rglob("*.py")) if target.is_dir() else [target] if target.exists() else []
    return [f for f in files if f.exists()]


def needed_steps(files: list[Path]) -> dict[str, set[str]]:
    """install step -> the entry files that need it."""
    out: dict[str, set[str]] = {}
    for f in files:
        reached = imports_reached(f)
        for module, step in NEEDS.items():
            if any(n == module or n.startswith(module + ".") for n in reached):
                out.setdefault(step, set()).add(str(f.relative_to(REPO)))
    return out


def dry_run(target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-n", "-B", target], cwd=REPO, capture_output=True,
                          text=True, env=_clean_env(), timeout=120, check=False)


def test_the_readme_and_make_help_name_the_targets_the_walk_checks() -> None:
    names = named_targets()
    assert {"demo", "test", "bench-ckpt", "gpu-check", "evaluate", "e2e"} <= names


@pytest.mark.parametrize("target", sorted(named_targets()))
def test_each_named_target_exists_and_installs_what_its_code_imports(target: str) -> None:
    out = dry_run(target)
    assert out.returncode == 0, f"make -n {target}: {out.stderr.strip()}"
    entries = entry_files(out.stdout)
    if entries or ".venv/bin/" in out.stdout:
        assert "pip install" in out.stdout, f"{target} runs the venv's Python but does not set the venv up first"
    missing = {step: users for step, users in needed_steps(entries).items() if step not in out.stdout}
    assert not missing, f"make {target} runs code that needs {missing} but its recipe never runs that step"


def test_the_walk_catches_a_target_without_its_install_step() -> None:
    """The check itself can fail: bench_ckpt.py imports torch at module level, so a recipe that runs it without
    install_torch_deps.sh is reported."""
    recipe = "test -x .venv/bin/python || python3 -m venv .venv\n.venv/bin/python scripts/bench_ckpt.py\n"
    needs = needed_steps(entry_files(recipe))
    assert needs == {"install_torch_deps.sh": {"scripts/bench_ckpt.py"}}
    assert "install_torch_deps.sh" not in recipe
