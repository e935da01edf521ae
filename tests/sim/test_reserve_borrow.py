"""Work-conserving research reserve in the simulator (design §4.2, HTB ceil; `scheduler.reserve`).

Under P3, ReclaimNet's pre-sync writes borrow the part of research's reserve that research leaves idle in a
control period, P1 plans with that rate, and research gets its reserve back when it uses it. Policies that model
no reserve (TCP sharing) are bit-identical whether the switch is on or off.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from scheduler.reserve import RESERVE_FRACTION, checkpoint_ceil_bytes_per_s
from scheduler.sim.engine import RUNNING, Simulator, simulate
from scheduler.sim.metrics import summarise
from scheduler.sim.network import allocate
from scheduler.sim.policies import get_policy
from scheduler.sim.trace import Trace, from_rows
from tests.sim.helpers import star_campus

LINK_BYTES_PER_S = 1e8  # below the 1 Gbit/s line rate, so the link, not the line, bounds a write


def _campus(research_share: float | list[tuple[float, float]], horizon_s: float = 3600.0) -> Trace:
    """Two nodes, two long jobs, no reclaims; research a constant share of each access link, or a list of
    (from t_s, share) steps."""
    rows = star_campus(2, LINK_BYTES_PER_S)
    rows["jobs"] = [{"id": f"j{k}", "submit_s": 0, "gpus": 1, "vram_gb": 0, "min_capability": 0, "work_s": 1e12,
                     "ckpt_bytes": 5e9, "restart_s": 10, "loss_budget_s": 1e9} for k in range(2)]
    rows["reclaims"] = []
    steps = [(0.0, research_share)] if isinstance(research_share, float) else research_share
    rows["research"] = [{"link": r["link"], "t_s": t, "bytes_per_s": share * r["bytes_per_s"]}
                        for t, share in steps for r in rows["bandwidth"]]
    return from_rows(rows, horizon_s)


def _end_state(trace: Trace, policy: str, **changes: object) -> Simulator:
    sim = Simulator(trace, replace(get_policy(policy), **changes), seed=0)
    sim.run()
    assert np.all(sim.st == RUNNING)
    return sim


def test_reclaimnet_and_informed_borrow_by_default_and_tcp_baselines_model_no_reserve() -> None:
    assert get_policy("reclaimnet").reserve_borrow and get_policy("informed").reserve_borrow
    assert not get_policy("reclaimnet-fixed-reserve").reserve_borrow
    assert {get_policy(p).traffic for p in ("static", "slurm-pr", "no-migration")} == {"tcp"}
    # design §21.1: `static-budget` honours the same budgets under the same research reserve as ReclaimNet
    sb, rn = get_policy("static-budget"), get_policy("reclaimnet")
    assert (sb.traffic, sb.reserve, sb.reserve_borrow) == (rn.traffic, rn.reserve, rn.reserve_borrow) == (
        "p3", "calibrated", True)


@pytest.mark.parametrize(("share", "expected_fraction"),
                         [(0.0, 1.0), (0.1, 0.9), (RESERVE_FRACTION, 1 - RESERVE_FRACTION),
                          (0.5, 1 - RESERVE_FRACTION)])
def test_informed_checkpoint_rate_is_the_link_less_the_reserve_research_uses(share: float,
                                                                            expected_fraction: float) -> None:
    """Informed P1 knows B: its writer gets B − min(R, β·B) — the whole link with research zero (not 70 %),
    B − B_min with research at (or above) its reserve."""
    sim = _end_state(_campus(share), "informed", reserve="fixed")
    w = sim.use.writer_rate_bytes_per_s
    assert w == pytest.approx(np.full(2, expected_fraction * LINK_BYTES_PER_S), rel=1e-9)
    # P1 planned with the rate the write gets: informed knows B, and the link (below the line) bounds the write
    assert sim.ckpt_budget == pytest.approx(w, rel=1e-9)
    fixed = _end_state(_campus(share), "informed", reserve="fixed", reserve_borrow=False)
    assert fixed.use.writer_rate_bytes_per_s == pytest.approx(np.full(2, 0.7 * LINK_BYTES_PER_S), rel=1e-9)


def test_reclaimnet_plans_with_the_scheduler_reserve_rule_at_its_estimate() -> None:
    """ReclaimNet plans at B⁻ (the estimator's bound): its budget = scheduler.reserve's rule at B⁻, R."""
    for share in (0.0, RESERVE_FRACTION):
        sim = _end_state(_campus(share), "reclaimnet")
        cap = sim.Bcap[sim.access[sim.node]]
        want = checkpoint_ceil_bytes_per_s(cap, RESERVE_FRACTION * cap, share * LINK_BYTES_PER_S)
        assert sim.ckpt_budget == pytest.approx(want, rel=1e-9)
        if share == 0.0:
            assert np.all(sim.ckpt_budget > 0.9 * LINK_BYTES_PER_S)  # whole B⁻, not 0.7·B⁻
        # the write's ceil is the agent's, not the plan's: on the true link it gets all but the reserve research uses
        # (more than planned where B⁻ is below B, less where the estimate is above it), never that reserve
        assert sim.use.writer_rate_bytes_per_s == pytest.approx(np.full(2, (1 - share) * LINK_BYTES_PER_S), rel=1e-9)


def test_borrowed_reserve_is_handed_back_when_research_returns() -> None:
    steps = [(0.0, 0.0), (3000.0, RESERVE_FRACTION)]
    idle = _end_state(_campus(steps, horizon_s=2400.0), "informed")
    back = _end_state(_campus(steps, horizon_s=4800.0), "informed")
    assert idle.use.writer_rate_bytes_per_s == pytest.approx(np.full(2, LINK_BYTES_PER_S), rel=1e-9)
    assert back.use.writer_rate_bytes_per_s == pytest.approx(np.full(2, 0.7 * LINK_BYTES_PER_S), rel=1e-9)
    assert back.res_t.research_deficit_bytes == 0.0  # research at its reserve is always served


def test_borrowing_checkpoints_sooner_and_shorter_with_research_idle() -> None:
    tr = _campus(0.0, horizon_s=2 * 3600.0)
    on = summarise(simulate(tr, get_policy("reclaimnet")), tr.horizon_s)
    off = summarise(simulate(tr, get_policy("reclaimnet-fixed-reserve")), tr.horizon_s)
    assert on["overhead_gpu_h"] < off["overhead_gpu_h"]


@pytest.mark.parametrize("policy", ["static", "slurm-pr", "no-admission", "no-migration"])
def test_policies_without_a_reserve_are_unchanged_by_the_switch(policy: str) -> None:
    tr = _campus(0.2, horizon_s=2 * 3600.0)
    on = summarise(simulate(tr, get_policy(policy)), tr.horizon_s)
    off = summarise(simulate(tr, replace(get_policy(policy), reserve_borrow=False)), tr.horizon_s)
    assert repr(on) == repr(off)


def test_calibrated_reserve_keeps_what_research_uses_above_beta() -> None:
    """Research at half the link: the calibrated reserve (design §4.1) is 0.5, so the writers get the other half,
    where β alone would leave them 0.7 and research short."""
    sim = _end_state(_campus(0.5), "informed")
    assert sim.reserve_fraction == pytest.approx(np.full(sim.n_links, 0.5))
    assert sim.use.writer_rate_bytes_per_s == pytest.approx(np.full(2, 0.5 * LINK_BYTES_PER_S), rel=1e-9)
    assert sim.res_t.research_deficit_bytes == 0.0


def test_admitted_migration_borrows_the_idle_reserve_and_hands_it_back() -> None:
    """An admitted planned migration (AF41) gets its P3 rate plus the part of research's reserve research leaves
    idle — the agent gives it the same HTB ceil as pre-sync — and exactly its P3 rate when research uses it."""
    link = np.array([1e8])
    shaped = np.array([0.5e8])
    for research, want in ((0.0, 0.5e8 + 0.3e8), (0.1e8, 0.5e8 + 0.2e8), (0.3e8, 0.5e8), (0.6e8, 0.5e8)):
        use = allocate("p3", link, np.array([research]), [np.array([0])], shaped, np.zeros(0, np.int64),
                       np.zeros(0), np.zeros(0), np.zeros(0), np.array([RESERVE_FRACTION]), flow_borrow=True)
        assert use.flow_rate_bytes_per_s == pytest.approx([want], rel=1e-12)
        fixed = allocate("p3", link, np.array([research]), [np.array([0])], shaped, np.zeros(0, np.int64),
                         np.zeros(0), np.zeros(0), np.zeros(0), np.array([RESERVE_FRACTION]))
        assert fixed.flow_rate_bytes_per_s == pytest.approx([0.5e8], rel=1e-12)
        assert use.deficit_bytes_per_s[0] <= fixed.deficit_bytes_per_s[0] + 1e-6  # research keeps what it uses
