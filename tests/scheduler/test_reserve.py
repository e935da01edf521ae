"""The calibrated, work-conserving research reserve (design §4 "Calibrated reserve", "Work-conserving reserve")
and P1's loss budget modes (design §2 "Loss budget modes")."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.p1 import P1Jobs, optimal_interval_s, overhead_floor_s, plan_checkpoints
from scheduler.reserve import (
    RESERVE_FRACTION,
    RESERVE_WINDOW_S,
    borrowable_reserve_bytes_per_s,
    calibrate_reserve_bytes_per_s,
    checkpoint_ceil_bytes_per_s,
    research_shares,
)

SETTINGS = settings(max_examples=80, deadline=None)
B = 125e6  # a 1 Gbit/s access link, bytes/s
DAY_S = 86400.0


@SETTINGS
@given(st.lists(st.floats(0, 1), max_size=60), st.floats(1e3, 1e10))
def test_reserve_never_below_beta_b(shares: list[float], cap: float) -> None:
    t = np.linspace(0, 6 * DAY_S, len(shares))
    b_min, _ = calibrate_reserve_bytes_per_s(cap, np.array(shares), t, now_s=6 * DAY_S)
    assert b_min >= RESERVE_FRACTION * cap * (1 - 1e-12)
    assert b_min <= cap * (1 + 1e-12)


def test_reserve_is_p95_of_research_share() -> None:
    shares = np.r_[np.full(90, 0.1), np.full(10, 0.6)]  # research mostly at 10%, its p95 at 60%
    t = np.linspace(1.0, 6 * DAY_S, shares.size)
    b_min, q = calibrate_reserve_bytes_per_s(B, shares, t, now_s=6 * DAY_S)
    assert q == pytest.approx(np.quantile(shares, 0.95))
    assert b_min == pytest.approx(q * B)
    assert b_min > RESERVE_FRACTION * B


def test_reserve_counts_only_the_last_seven_days() -> None:
    now = 30 * DAY_S
    old = np.full(50, 0.95)  # a busy week long ago must not size today's reserve
    recent = np.full(50, 0.4)
    t = np.r_[np.linspace(now - 20 * DAY_S, now - 8 * DAY_S, 50), np.linspace(now - 6 * DAY_S, now, 50)]
    b_min, q = calibrate_reserve_bytes_per_s(B, np.r_[old, recent], t, now_s=now)
    assert q == pytest.approx(0.4)
    assert b_min == pytest.approx(0.4 * B)
    # just outside the window: excluded; just inside: counted
    _, q_edge = calibrate_reserve_bytes_per_s(B, np.array([0.9, 0.5]), np.array([now - RESERVE_WINDOW_S,
                                                                                     now - RESERVE_WINDOW_S + 1]),
                                                   now_s=now)
    assert q_edge == pytest.approx(0.5)


def test_no_samples_falls_back_to_beta() -> None:
    b_min, q = calibrate_reserve_bytes_per_s(B, np.zeros(0), np.zeros(0), now_s=0.0)
    assert q is None and b_min == pytest.approx(0.3 * B)


def test_research_shares_clip_and_guard() -> None:
    s = research_shares(np.array([0.0, B, 2 * B, 5.0]), np.array([1.0, 2.0, 1.0, 0.0]), B)
    assert s.tolist() == [0.0, 0.5, 1.0, 0.0]


def test_ceil_zero_research_whole_link() -> None:
    assert checkpoint_ceil_bytes_per_s(B, 0.3 * B, 0.0) == pytest.approx(B)


def test_ceil_research_at_reserve_leaves_b_minus_bmin() -> None:
    b_min = 0.4 * B
    assert checkpoint_ceil_bytes_per_s(B, b_min, b_min) == pytest.approx(B - b_min)
    # above its reserve research borrows too, but checkpoints keep their guarantee B − B_res
    assert checkpoint_ceil_bytes_per_s(B, b_min, 0.9 * B) == pytest.approx(B - b_min)
    # unknown research use: no borrowing
    assert checkpoint_ceil_bytes_per_s(B, b_min, float("nan")) == pytest.approx(B - b_min)


@SETTINGS
@given(st.floats(0, 1), st.floats(0, 2))
def test_ceil_between_guarantee_and_link(res_frac: float, use_frac: float) -> None:
    ceil = checkpoint_ceil_bytes_per_s(B, res_frac * B, use_frac * B)
    assert B - res_frac * B - 1e-6 <= ceil <= B + 1e-6
    assert ceil + min(use_frac, res_frac) * B == pytest.approx(B)
    assert borrowable_reserve_bytes_per_s(res_frac * B, use_frac * B) == pytest.approx(
        max(0.0, res_frac - use_frac) * B, abs=1e-3)


# --- P1 loss budget modes (design §2) ---------------------------------------------------------------------------

@st.composite
def bound_jobs(draw: st.DrawFn) -> tuple[P1Jobs, float, float]:
    n = draw(st.integers(1, 6))
    lam = np.array(draw(st.lists(st.floats(1e-6, 1e-2), min_size=n, max_size=n)))
    c = np.array(draw(st.lists(st.floats(1e6, 5e10), min_size=n, max_size=n)))
    lmax = np.array(draw(st.lists(st.floats(30, 7200), min_size=n, max_size=n)))
    transfer = np.array(draw(st.lists(st.one_of(st.just(np.nan), st.floats(0, 600)), min_size=n, max_size=n)))
    budget = draw(st.floats(1e6, 1e9))
    floor = draw(st.sampled_from([0.0, 60.0]))
    jobs = P1Jobs.build(ids=tuple(f"j{i}" for i in range(n)), hazard_per_s=lam, ckpt_bytes=c, loss_budget_s=lmax,
                        transfer_s=transfer, loss_budget_mode=np.array(["bound"] * n, dtype=object))
    return jobs, budget, floor


@SETTINGS
@given(bound_jobs())
def test_bound_never_plans_an_interval_that_can_lose_more_than_lmax(case: tuple[P1Jobs, float, float]) -> None:
    jobs, budget, floor = case
    plan = plan_checkpoints(jobs, budget, min_interval_s=floor)
    b = plan.bandwidth_bytes_per_s
    transfer = np.fmax(jobs.ckpt_bytes / b, jobs.transfer_s)
    worst = plan.interval_s + transfer  # an emergency right before the next copy lands
    ok = ~plan.loss_budget_at_risk
    assert np.all(worst[ok] <= jobs.loss_budget_s[ok] * (1 + 1e-9))
    # where it cannot be met, the interval is the floor (design §2 Eq. 9, the hazard-aware overhead floor) and the
    # job is flagged
    free = optimal_interval_s(jobs.hazard_per_s, jobs.ckpt_bytes, b)
    lower = np.maximum(overhead_floor_s(jobs.ckpt_bytes / b, free, 0.2), floor)
    assert np.allclose(plan.interval_s[~ok], lower[~ok])


def test_bound_is_tighter_than_expected() -> None:
    kw = dict(ids=("a",), hazard_per_s=np.array([1e-5]), ckpt_bytes=np.array([1e9]), loss_budget_s=np.array([600.0]))
    exp = plan_checkpoints(P1Jobs.build(**kw), 50e6)
    bnd = plan_checkpoints(P1Jobs.build(**kw, loss_budget_mode=np.array(["bound"], dtype=object)), 50e6)
    assert exp.interval_s[0] == pytest.approx(1200.0)  # Eq. 9: 2·L_max
    assert bnd.interval_s[0] == pytest.approx(600.0 - 1e9 / 50e6)  # L_max − C/b
    assert not bnd.loss_budget_at_risk[0]


def test_expected_mode_is_bit_identical() -> None:
    rng = np.random.default_rng(7)
    n = 40
    kw = dict(ids=tuple(str(i) for i in range(n)), hazard_per_s=rng.uniform(1e-6, 1e-3, n),
              ckpt_bytes=rng.uniform(1e6, 1e10, n), loss_budget_s=rng.uniform(60, 3600, n),
              notice_s=rng.uniform(0, 900, n))
    group = rng.integers(0, 4, n)
    budgets = rng.uniform(1e6, 1e8, 4)
    plain = plan_checkpoints(P1Jobs.build(**kw), budgets, group=group)
    moded = plan_checkpoints(P1Jobs.build(**kw, loss_budget_mode=np.array(["expected"] * n, dtype=object)),
                             budgets, group=group)
    assert np.array_equal(plain.interval_s, moded.interval_s)
    assert np.array_equal(plain.bandwidth_bytes_per_s, moded.bandwidth_bytes_per_s)
    assert np.array_equal(plain.loss_budget_at_risk, moded.loss_budget_at_risk)
    assert plain.expected_cost == moded.expected_cost


def test_the_p1_contract_takes_the_mode_and_names_a_bad_one() -> None:
    from scheduler.contract import ContractError, decide

    job = {"id": "a", "hazard_per_s": 1e-5, "ckpt_bytes": 1e9, "loss_budget_s": 600}
    req = {"budget_bytes_per_s": 50e6, "min_interval_s": 0, "jobs": [job | {"loss_budget_mode": "bound"}]}
    out = decide("p1", req)
    assert out["jobs"][0]["interval_s"] == pytest.approx(600.0 - 20.0)
    assert decide("p1", {**req, "jobs": [job]})["jobs"][0]["interval_s"] == pytest.approx(1200.0)
    with pytest.raises(ContractError) as err:
        decide("p1", {**req, "jobs": [job | {"loss_budget_mode": "worst"}]})
    assert err.value.field == "jobs[0].loss_budget_mode"


def test_bound_takes_the_transfer_at_the_guaranteed_share_not_the_borrowed_one() -> None:
    """design §2 "Loss budget modes" with §4.2: research takes the borrowed reserve back within a heartbeat, so a
    `bound` job's copy time T is C/b at its share of the guaranteed budget. 1 GB at a guaranteed 50 MB/s (T = 20 s)
    with the reserve borrowed up to 100 MB/s (T would be 10 s): Δ ≤ 600 − 20, not 600 − 10."""
    kw = dict(ids=("a",), hazard_per_s=np.array([1e-5]), ckpt_bytes=np.array([1e9]), loss_budget_s=np.array([600.0]),
              loss_budget_mode=np.array(["bound"], dtype=object))
    borrowed = plan_checkpoints(P1Jobs.build(**kw), 100e6, min_interval_s=0.0)
    assert borrowed.interval_s[0] == pytest.approx(590.0)  # no guaranteed budget given: the whole budget is sure
    plan = plan_checkpoints(P1Jobs.build(**kw), 100e6, min_interval_s=0.0, guaranteed_budget_bytes_per_s=50e6)
    assert plan.interval_s[0] == pytest.approx(580.0)
    assert plan.bandwidth_bytes_per_s[0] == pytest.approx(100e6)  # the share itself still uses what is borrowed
    assert not plan.loss_budget_at_risk[0]
    # an `expected` job is planned exactly as before whatever the guaranteed budget
    exp = dict(kw, loss_budget_mode=None)
    assert np.array_equal(plan_checkpoints(P1Jobs.build(**exp), 100e6).interval_s,
                          plan_checkpoints(P1Jobs.build(**exp), 100e6, guaranteed_budget_bytes_per_s=50e6).interval_s)


@SETTINGS
@given(bound_jobs(), st.floats(0.05, 1.0))
def test_bound_holds_when_research_takes_the_borrowed_reserve_back(case: tuple[P1Jobs, float, float],
                                                                   sure_fraction: float) -> None:
    """Property: every `bound` job not flagged has Δ + T ≤ L_max with T at its share of the guaranteed budget
    (what it keeps once research reclaims what checkpoints borrowed)."""
    jobs, budget, floor = case
    sure = budget * sure_fraction
    plan = plan_checkpoints(jobs, budget, min_interval_s=floor, guaranteed_budget_bytes_per_s=sure)
    from scheduler.p1 import allocate_checkpoint_bandwidth

    b_sure = allocate_checkpoint_bandwidth(jobs.hazard_per_s, jobs.ckpt_bytes, sure, min_interval_s=floor)
    worst = plan.interval_s + np.fmax(jobs.ckpt_bytes / b_sure, jobs.transfer_s)
    ok = ~plan.loss_budget_at_risk
    assert np.all(worst[ok] <= jobs.loss_budget_s[ok] * (1 + 1e-9))
