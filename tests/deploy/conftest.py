"""The agent distribution installed into a fresh venv, once per session (design §18).

The venv is made by ``python -m venv --without-pip`` (never ``--system-site-packages``) and filled by this
suite's pip with ``--python``: ensurepip alone costs ~35 s on a loaded 2-core machine. Dependencies come from a
wheelhouse cached across sessions (``$RECLAIMNET_WHEELHOUSE``, else ``~/.cache/reclaimnet/agent-wheelhouse``),
so the install is offline once the wheelhouse holds them; an incomplete wheelhouse is filled once with
``pip download`` from the configured indexes. The source is a copy of the checkout's three folders the
distribution reads (nodeagent/, scheduler/, bpf/), so the build leaves nothing in the working tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("nodeagent", "scheduler", "bpf")
PIP_TIMEOUT_S = 300


@dataclass(frozen=True)
class AgentVenv:
    root: Path
    python: Path
    bin_dir: Path
    install_s: float

    def run(self, *argv: str, env: dict[str, str] | None = None, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run in the venv with an environment that cannot leak this suite's packages (no PYTHONPATH)."""
        base = {"PATH": f"{self.bin_dir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, env={**base, **(env or {})},
                              **kwargs)  # type: ignore[call-overload]


def wheelhouse_dir() -> Path:
    env = os.environ.get("RECLAIMNET_WHEELHOUSE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "reclaimnet" / "agent-wheelhouse"


def copy_checkout(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for name in SOURCE_DIRS:
        shutil.copytree(REPO / name, dest / name, ignore=ignore, symlinks=True)
    return dest / "nodeagent"


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=PIP_TIMEOUT_S)


@pytest.fixture(scope="session")
def agent_venv(tmp_path_factory: pytest.TempPathFactory) -> AgentVenv:
    work = tmp_path_factory.mktemp("agentpkg")
    project = copy_checkout(work / "checkout")
    venv = work / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    wheels = wheelhouse_dir()
    wheels.mkdir(parents=True, exist_ok=True)
    install = ("--python", str(python), "install", "--no-compile", "--no-index", "--find-links", str(wheels),
               str(project))
    done = _pip(*install)
    if done.returncode != 0:  # the wheelhouse lacks something: fill it once from the configured indexes
        fetched = _pip("download", "-q", "-d", str(wheels), "setuptools>=77", str(project))
        assert fetched.returncode == 0, f"cannot fill the wheelhouse {wheels}:\n{fetched.stderr[-3000:]}"
        shutil.rmtree(project.parent)
        project = copy_checkout(work / "checkout")
        done = _pip(*install)
    assert done.returncode == 0, f"pip install ./nodeagent failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    install_s = time.monotonic() - started
    print(f"\nagent distribution: fresh venv + pip install ./nodeagent in {install_s:.1f} s")
    return AgentVenv(root=venv, python=python, bin_dir=venv / "bin", install_s=install_s)
