"""Confined jobs (design §19): fixtures for tests that make real cgroups, as root, on this host (cgroup v1)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.confine import CgroupV1, CgroupV2, cgroup_mounts

JOB_PYTHON = "/usr/bin/python3"  # jobs run as other users: the venv's interpreter under /root is not theirs to run


def cgroups_here() -> str | None:
    """Why real confinement cannot be tested here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (makes cgroups and switches users)"
    v1, v2 = cgroup_mounts()
    if not (CgroupV1.available(v1) or (v2 is not None and CgroupV2.available(v2))):
        return "no cgroup hierarchy with memory, cpu and pids"
    if not os.access(JOB_PYTHON, os.X_OK):
        return f"{JOB_PYTHON} missing"
    return None


@pytest.fixture
def space() -> Iterator[Path]:
    """A directory other users can search (pytest's tmp_path is under a 0700 directory): ``data/`` for the
    agent, ``scripts/`` for the jobs' programs. Removed afterwards."""
    why = cgroups_here()
    if why is not None:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="rn-confine-", dir="/tmp"))
    os.chmod(root, 0o711)
    (root / "scripts").mkdir(mode=0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def script(space: Path, name: str, text: str) -> str:
    """Write a job program readable by any job user; returns its command line."""
    path = space / "scripts" / name
    path.write_text(text)
    os.chmod(path, 0o644)
    return f"{JOB_PYTHON} {path}"
