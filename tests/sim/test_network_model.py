"""Link-share and checkpoint-stall model (design §2 L(Δ), §4 HTB enforcement): one rule for every policy."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.p1 import P1Jobs, plan_checkpoints
from scheduler.sim.engine import Simulator
from scheduler.sim.network import LINE_RATE_BYTES_PER_S, allocate
from scheduler.sim.policies import get_policy

from .helpers import poisson_trace

LAM, C, B = 1 / 3600.0, 4.5e8, 1e8
NOFLOW = ([], np.zeros(0))


def _writers(mode: str, b: float, r: float, cap: list[float], duty: list[float], ceil: float | None = None):
    n = len(cap)
    use = allocate(mode, np.array([b]), np.array([r]), *NOFLOW, np.zeros(n), np.array(cap), np.array(duty),
                   None if ceil is None else np.full(n, ceil))
    return use


def test_same_transfer_conditions_same_rate_in_both_regimes() -> None:
    """A lone writer on an idle 50 MB/s link: TCP and an HTB class whose ceil covers the link give the same
    rate, so both are charged the same C/rate stall."""
    tcp = _writers("tcp", 5e7, 0.0, [LINE_RATE_BYTES_PER_S], [0.01])
    htb = _writers("p3", 5e7, 0.0, [1e7], [0.01], ceil=5e7)
    assert tcp.writer_rate_bytes_per_s[0] == pytest.approx(5e7)
    assert htb.writer_rate_bytes_per_s[0] == pytest.approx(5e7)


def test_presync_borrows_idle_checkpoint_budget() -> None:
    """Two writers each guaranteed half of B_ckpt: while the other is rarely writing, each gets nearly all
    of B_ckpt (work-conserving); when both write all the time, each keeps at least its guarantee."""
    ceil = 7e7
    rare = _writers("p3", B, 0.0, [3.5e7, 3.5e7], [0.02, 0.02], ceil=ceil).writer_rate_bytes_per_s
    assert np.all(rare > 0.95 * ceil) and np.all(rare <= ceil + 1e-6)
    busy = _writers("p3", B, 0.0, [3.5e7, 3.5e7], [1.0, 1.0], ceil=ceil).writer_rate_bytes_per_s
    assert busy == pytest.approx([3.5e7, 3.5e7])


def test_presync_never_takes_the_research_reserve() -> None:
    """Research wanting 50% of the link keeps its 30% reserve while a pre-sync write runs at B_ckpt = 70%;
    research inside its reserve is not degraded at all. TCP takes research bandwidth in proportion."""
    high = _writers("p3", B, 0.5 * B, [7e7], [0.5], ceil=0.7 * B)
    assert high.writer_rate_bytes_per_s[0] == pytest.approx(0.7 * B)
    assert high.deficit_bytes_per_s[0] == pytest.approx(0.2 * B)
    low = _writers("p3", B, 0.2 * B, [7e7], [0.5], ceil=0.7 * B)
    assert low.deficit_bytes_per_s[0] == pytest.approx(0.0)
    tcp = _writers("tcp", B, 0.2 * B, [LINE_RATE_BYTES_PER_S], [0.5])
    assert tcp.deficit_bytes_per_s[0] > 0.0


def test_p1_expected_cost_matches_simulated_rate() -> None:
    """Constant bandwidth, one job, Poisson λ, P1 fed the true λ and B (`informed`; the estimators'
    λ⁺/B⁻ move Δ from period to period): the simulated (expected loss + stall) per running second at P1's
    chosen Δ and b equals P1's expected_cost λΔ/2 + C/(bΔ) within 3% (second-order terms ≈ s/Δ)."""
    policy, tol = "informed", 0.03
    tr = poisson_trace(n_nodes=4, n_jobs=1, hazard_per_s=LAM, horizon_s=10 * 86400.0, ckpt_bytes=C,
                       bw_bytes_per_s=B, seed=5)
    sim = Simulator(tr, get_policy(policy), period_s=3600.0)
    r = sim.run()
    simulated = (r.expected_lost_gpu_s + r.overhead_gpu_s) / r.running_gpu_s
    delta, b = float(sim.delta[0]), float(sim.bplan[0])
    assert float(C / sim.s[0]) == pytest.approx(b, rel=1e-6)  # a lone job writes at its P1 rate
    p1_cost = LAM * delta / 2 + C / (b * delta)
    assert simulated == pytest.approx(p1_cost, rel=tol)
    # no research: the work-conserving reserve (design §4.2) lends its whole 30 %, so P1's budget is all of B
    plan = plan_checkpoints(P1Jobs.build(("j0",), np.array([LAM]), np.array([C])), B, beta=0.2)
    assert delta == pytest.approx(float(plan.interval_s[0]))
    assert simulated == pytest.approx(plan.expected_cost, rel=tol)


def test_two_jobs_on_one_node_write_above_their_guarantee() -> None:
    """ReclaimNet in the simulator: two jobs sharing a node's B_ckpt each get b_i ≈ B_ckpt/2 from P1 but,
    writing rarely at the same time, each checkpoint runs at nearly the whole budget (HTB borrowing)."""
    tr = poisson_trace(n_nodes=2, n_jobs=2, hazard_per_s=1e-7, horizon_s=2 * 86400.0, ckpt_bytes=C,
                       bw_bytes_per_s=B, seed=1)
    tr.tables["nodes"]["gpus"][:] = 2
    sim = Simulator(tr, get_policy("reclaimnet"), period_s=3600.0)
    sim.run()
    assert sim.node[0] == sim.node[1]
    rate = C / sim.s[:2]
    assert np.all(sim.bplan[:2] < 0.6 * sim.ckpt_budget[:2])
    assert np.all(rate > 0.9 * sim.ckpt_budget[:2])
