"""Asynchronous snapshot checkpoints in the simulator (design §2 "Asynchronous snapshots"): the same model as
P1's — the job stalls for a fraction of the write, the copy runs in the background and makes the snapshot durable
only when it ends, the interval is never shorter than the copy — so sync and async can be reported side by side."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scheduler.sim.__main__ import main
from scheduler.sim.cycles import async_durable
from scheduler.sim.engine import Simulator, simulate
from scheduler.sim.metrics import summarise
from scheduler.sim.policies import get_policy, with_ckpt_mode
from scheduler.sim.trace import save
from tests.sim.helpers import poisson_trace


def test_durable_progress_lags_by_the_copy() -> None:
    """Δ = 100 s of work, a 30 s copy: 10 s into a cycle the last snapshot is still being copied (the one before
    is durable); 40 s in it is durable."""
    prog, d, xfer = np.array([510.0, 540.0]), np.array([100.0, 100.0]), np.array([30.0, 30.0])
    newp = np.array([10.0, 40.0])  # positions in the current cycle (its work began at progress 500)
    got = async_durable(prog, np.array([300.0, 300.0]), newp, d, xfer, crossed=np.array([True, True]))
    assert got.tolist() == [400.0, 500.0]
    # No new cycle: the durable progress only moves when the copy of the snapshot ends.
    got = async_durable(prog, np.array([400.0, 400.0]), newp, d, xfer, crossed=np.array([False, False]))
    assert got.tolist() == [400.0, 500.0]


def test_policy_variants_and_names() -> None:
    sync = get_policy("reclaimnet")
    assert with_ckpt_mode(sync, "sync") is sync and sync.ckpt_mode == "sync"
    a = get_policy("reclaimnet+async")
    assert (a.name, a.ckpt_mode, a.stall_fraction) == ("reclaimnet+async", "async", 0.1)
    assert get_policy("slurm-pr+async+fair").queue == "fair"
    assert with_ckpt_mode(sync, "async", 0.02).stall_fraction == 0.02
    with pytest.raises(ValueError):
        with_ckpt_mode(sync, "later")
    with pytest.raises(ValueError):
        with_ckpt_mode(sync, "async", 1.5)


def test_async_stalls_less_and_plans_no_interval_shorter_than_the_copy() -> None:
    # 20 GB checkpoints over a 50 MB/s access link: a 400 s write; one reclaim every ~3 h per node.
    tr = poisson_trace(n_nodes=4, n_jobs=2, hazard_per_s=1e-4, horizon_s=3 * 86400, ckpt_bytes=2e10,
                       bw_bytes_per_s=5e7, seed=3)
    sync = summarise(simulate(tr, get_policy("reclaimnet")), tr.horizon_s)
    asy = summarise(simulate(tr, get_policy("reclaimnet+async")), tr.horizon_s)
    assert asy["overhead_gpu_h"] < 0.5 * sync["overhead_gpu_h"]  # the stall is a tenth of the write
    assert asy["work_lost_gpu_h"] < sync["work_lost_gpu_h"]

    sim = Simulator(tr, get_policy("reclaimnet+async"))
    sim.run()
    ran = np.flatnonzero(sim.xfer != 1.0)  # jobs that started (xfer set)
    assert ran.size
    assert np.all(sim.delta[ran] >= sim.xfer[ran] * (1 - 1e-12))
    assert np.allclose(sim.s[ran], 0.1 * sim.xfer[ran])


def test_cli_takes_a_checkpoint_mode(tmp_path, capsys) -> None:
    tr_rows = poisson_trace(n_nodes=2, n_jobs=1, hazard_per_s=1e-4, horizon_s=86400, ckpt_bytes=1e9,
                            bw_bytes_per_s=5e7)
    path = tmp_path / "t.json"
    save(tr_rows, path)
    assert main(["--trace", str(path), "--policy", "reclaimnet", "--ckpt-mode", "async", "--json"]) == 0
    assert "work_lost_gpu_h" in json.loads(capsys.readouterr().out)
    assert main(["--trace", str(path), "--policy", "reclaimnet", "--ckpt-mode", "later"]) == 2
    assert json.loads(capsys.readouterr().out)["field"] == "ckpt_mode"
