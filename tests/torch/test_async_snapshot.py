"""Asynchronous snapshot checkpoints (design §2 "Asynchronous snapshots", §17.6): the loop pauses only for the
copy to host memory; the write runs in the background; the final checkpoint on notice stays synchronous.

Orders of events are asserted, never durations: a background write is held open by a gate object in the
checkpointed state (its pickling blocks until the test opens it), so "training went on while the write ran" is a
fact of the order, not of a machine's speed. The crash test SIGKILLs a real process in the middle of its write.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.torch.torch_helpers import REPO, assert_state_dicts_bitwise_equal, require

torch = require("torch")

from nodeagent import jobkit  # noqa: E402
from nodeagent.jobkit_torch import STATE_KEY, TrainingState  # noqa: E402

GATES: dict[str, threading.Event] = {}  # opened by the test
STARTED: dict[str, threading.Event] = {}  # set when the background write reaches the gate
EVENTS: list[str] = []


def _reopen_gate(name: str) -> Gate:
    return Gate(name)


class Gate:
    """Part of a job's state whose serialisation waits until the test opens it (the write stays in flight)."""

    def __init__(self, name: str) -> None:
        self.name = name
        GATES.setdefault(name, threading.Event())
        STARTED.setdefault(name, threading.Event())

    def __deepcopy__(self, memo: dict[int, Any]) -> Gate:  # the snapshot keeps the same gate
        return self

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        EVENTS.append("write started")
        STARTED[self.name].set()
        assert GATES[self.name].wait(60), "gate never opened"
        EVENTS.append("write resumed")
        return (_reopen_gate, (self.name,))


def _training() -> TrainingState:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return TrainingState(model, optimizer, scheduler, extra={"n": 0})


def _step(ts: TrainingState) -> None:
    loss = ts.model(torch.randn(4, 8)).pow(2).sum()
    ts.optimizer.zero_grad()
    loss.backward()
    ts.optimizer.step()
    ts.scheduler.step()
    ts.extra["n"] += 1


def _flat(state: dict[str, Any]) -> dict[str, Any]:
    """Every tensor of a TrainingState.state_dict() by path (model, optimizer moments, RNG)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            out[prefix] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}/{k}", v)

    walk("", state)
    return out


def test_async_checkpoint_restores_bit_for_bit_what_was_snapshotted(tmp_path: Path) -> None:
    ck = jobkit.Checkpointer(tmp_path, install_signals=False)
    ts = _training()
    for _ in range(3):
        _step(ts)
    expected = jobkit.snapshot_state(ts.state_dict())  # the state at the snapshot's step boundary
    assert ck.checkpoint_async(3, {STATE_KEY: ts}) is True
    for _ in range(3):  # the live model moves on while (or after) the copy is written
        _step(ts)
    ck.wait()
    manifest = jobkit.list_manifests(tmp_path)[-1]
    assert (manifest.mode, manifest.step, manifest.format) == ("async", 3, "torch")
    assert manifest.stall_s is not None and manifest.write_s is not None and manifest.stall_s >= 0
    assert jobkit.verify(tmp_path, manifest)

    restored = _training()
    assert restored.restore(jobkit.Checkpointer(tmp_path, install_signals=False)) == 3
    assert_state_dicts_bitwise_equal(_flat(restored.state_dict()), _flat(expected))
    assert restored.extra == {"n": 3}
    assert not torch.equal(restored.model[0].weight, ts.model[0].weight)  # not the live weights (moved on)


def test_training_continues_while_the_background_write_runs(tmp_path: Path) -> None:
    EVENTS.clear()
    ck = jobkit.Checkpointer(tmp_path, install_signals=False, interval_s=0.0)  # due at every step
    ts = _training()
    ts.extra["gate"] = Gate("bg")
    taken_at_step = None
    for step in range(1, 7):
        _step(ts)
        EVENTS.append(f"step {step}")
        ts.maybe_checkpoint(ck, step)
        if taken_at_step is None and ck.writing():
            taken_at_step = step
            assert STARTED["bg"].wait(60)  # the write is under way (and held) before training goes on
        if step == 5:
            assert jobkit.list_manifests(tmp_path) == []  # still being written: nothing published yet
            GATES["bg"].set()
    ck.wait()
    assert taken_at_step == 1
    # The steps after the snapshot ran while its write was held open; the ones due meanwhile were deferred.
    assert EVENTS.index("write started") < EVENTS.index("step 5") < EVENTS.index("write resumed")
    assert ck.deferred >= 3
    published = jobkit.list_manifests(tmp_path)
    assert published[0].step == 1 and published[0].mode == "async"


def test_final_checkpoint_on_notice_is_synchronous_and_holds_the_latest_step(tmp_path: Path) -> None:
    EVENTS.clear()
    ck = jobkit.Checkpointer(tmp_path, install_signals=False, interval_s=0.0)
    ts = _training()
    ts.extra["gate"] = Gate("final")
    _step(ts)
    ts.maybe_checkpoint(ck, 1)  # an asynchronous snapshot, its write held open
    assert ck.writing()
    for _ in (2, 3):
        _step(ts)
    ts.extra["gate"] = "opened"  # the final checkpoint itself is not held
    ck.request(final=True)  # what the agent's SIGUSR2 does
    opener = threading.Timer(0.0, GATES["final"].set)
    opener.start()
    assert ts.maybe_checkpoint(ck, 3) is True  # returns only once everything is on disk
    opener.join()
    assert not ck.writing()
    manifests = jobkit.list_manifests(tmp_path)
    assert [(m.sequence, m.step, m.mode, m.final) for m in manifests] == [(1, 1, "async", False),
                                                                           (2, 3, "sync", True)]
    assert manifests[1].stall_s is not None and manifests[1].stall_s >= manifests[1].write_s
    assert all(jobkit.verify(tmp_path, m) for m in manifests)
    restored = _training()
    assert restored.restore(jobkit.Checkpointer(tmp_path, install_signals=False)) == 3
    assert_state_dicts_bitwise_equal(_flat(restored.state_dict()["model"]), _flat(ts.state_dict()["model"]))


def test_sync_checkpointer_is_unchanged_by_default(tmp_path: Path) -> None:
    """Jobs whose helper cannot snapshot (or that opt out) keep the synchronous checkpoint."""
    ck = jobkit.Checkpointer(tmp_path, install_signals=False, interval_s=0.0)
    state = {"w": np.arange(4.0)}
    assert ck.maybe_checkpoint(1, lambda: state) is False
    assert not ck.writing()
    m = jobkit.list_manifests(tmp_path)[-1]
    assert (m.mode, m.format, m.step) == ("sync", "numpy", 1) and m.stall_s is not None


def test_numpy_async_snapshot_is_a_copy(tmp_path: Path) -> None:
    ck = jobkit.Checkpointer(tmp_path, install_signals=False, async_snapshot=True, interval_s=0.0)
    state = {"w": np.arange(4.0)}
    ck.maybe_checkpoint(1, lambda: state)
    state["w"] += 100.0  # the loop changes its arrays in place right after the snapshot
    ck.wait()
    step, restored = ck.restore()
    assert step == 1 and restored["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert jobkit.list_manifests(tmp_path)[-1].mode == "async"


def test_old_manifest_without_the_new_fields_still_reads(tmp_path: Path) -> None:
    ck = jobkit.Checkpointer(tmp_path, install_signals=False)
    m = ck.checkpoint(1, {"w": np.zeros(2)})
    path = tmp_path / f"{jobkit.ckpt_stem(1)}{jobkit.MANIFEST_SUFFIX}"
    import json

    raw = json.loads(path.read_text())
    for key in ("mode", "stall_s", "write_s"):
        raw.pop(key)
    path.write_text(json.dumps(raw))
    old = jobkit.Manifest.from_path(path)
    assert (old.mode, old.stall_s, old.write_s) == ("sync", None, None) and old.sha256 == m.sha256


CRASH_CHILD = r"""
import os, sys, time
from pathlib import Path
import torch
from nodeagent import jobkit

d = Path(sys.argv[1])
ck = jobkit.Checkpointer(d, install_signals=False)
state = {"w": torch.arange(1000, dtype=torch.float32)}
ck.checkpoint(1, state)  # a valid checkpoint
real = jobkit.atomic_write_bytes

def dies_mid_write(path, data):
    if path.suffix == jobkit.DATA_SUFFIX:  # half the data reaches the disk, then the process is killed
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with open(tmp, "wb") as fh:
            fh.write(data[: len(data) // 2]); fh.flush(); os.fsync(fh.fileno())
        (d / "MIDWRITE").touch()
        time.sleep(600)
    real(path, data)

jobkit.atomic_write_bytes = dies_mid_write
state["w"] += 1
assert ck.checkpoint_async(2, state)
step = 2
while True:  # training goes on in the main thread
    state["w"] += 1; step += 1; time.sleep(0.01)
"""


def test_a_crash_mid_background_write_leaves_the_previous_checkpoint_valid(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    child = subprocess.Popen([sys.executable, "-c", CRASH_CHILD, str(ckpt)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 120
        while not (ckpt / "MIDWRITE").exists():
            assert child.poll() is None, "child died before its background write started"
            assert time.monotonic() < deadline, "child never reached the middle of its write"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    manifests = jobkit.list_manifests(ckpt)
    assert [m.sequence for m in manifests] == [1]  # the half-written checkpoint was never published
    assert jobkit.verify(ckpt, manifests[0])
    step, state = jobkit.Checkpointer(ckpt, install_signals=False).restore()
    assert step == 1 and torch.equal(state["w"], torch.arange(1000, dtype=torch.float32))


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "1"])
def test_the_agent_forwards_only_sane_stall_and_write_times(tmp_path: Path, bad: Any) -> None:
    """The agent passes on only finite non-negative stall/write times from a job's manifest (its own file)."""
    from nodeagent.agent import Agent

    m = jobkit.Manifest(job_id="7", sequence=1, step=1, size_bytes=1, sha256="a" * 64, file="ckpt-00000001.ckpt",
                        format="torch", taken_at=1.0, mode="async", stall_s=0.25, write_s=bad)
    msg = Agent._checkpoint_message("7", m)
    assert msg["stall_s"] == 0.25 and msg["mode"] == "async" and "write_s" not in msg
