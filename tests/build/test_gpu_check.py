"""`make gpu-check` (scripts/gpu_check.py, design §17.7): its no-GPU path, and its bitwise resume check run on the
CPU so the check itself is known to pass on equal runs and to fail on unequal ones."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"


def _load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0() -> None:
    gpu_check = _load_gpu_check()
    if gpu_check.no_gpu_reason() is None:
        pytest.fail("this machine has an NVIDIA GPU: run `make gpu-check` itself, not this no-GPU test")
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("gpu-check: no NVIDIA GPU on this machine (")


def test_resume_check_passes_when_the_restored_run_is_bitwise_equal() -> None:
    pytest.importorskip("torch", reason="make test installs the torch extra (scripts/install_torch_deps.sh)")
    assert _load_gpu_check().check_resume_bitwise("cpu") is True


def test_resume_check_fails_when_the_restore_loads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch", reason="make test installs the torch extra (scripts/install_torch_deps.sh)")
    from nodeagent.jobkit_torch import TrainingState

    gpu_check = _load_gpu_check()
    # a restore that reports the right step but keeps the fresh model: the continued run must differ
    monkeypatch.setattr(TrainingState, "restore", lambda self, ck: gpu_check.RESUME_STEPS // 2)
    assert gpu_check.check_resume_bitwise("cpu") is False
