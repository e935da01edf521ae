"""P1's minimum interval Δ_min (design §2 "Minimum interval"): the floor on every interval, and the bandwidth
shares that are optimal once the floor is part of the problem (checked against scipy)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from scheduler.contract import decide
from scheduler.p1 import (
    MIN_INTERVAL_S,
    P1Jobs,
    allocate_checkpoint_bandwidth,
    optimal_interval_s,
    plan_checkpoints,
)

SETTINGS = settings(max_examples=60, deadline=None)


def floored_cost(lam: np.ndarray, c: np.ndarray, b: np.ndarray, floor_s: float) -> np.ndarray:
    """min over Δ >= Δ_min of λΔ/2 + C/(bΔ), per job: Lemma 1's cost, or the cost at the floor."""
    free = np.sqrt(2 * c / (lam * b))
    delta = np.maximum(free, floor_s)
    return lam * delta / 2 + c / (b * delta)


@st.composite
def floored_instances(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, float, np.ndarray, float]:
    n = draw(st.integers(1, 8))
    lam = np.array(draw(st.lists(st.floats(1e-6, 1e-2), min_size=n, max_size=n)))
    c = np.array(draw(st.lists(st.floats(1e3, 5e10), min_size=n, max_size=n)))  # 1 KB (a toy job) to 50 GB
    budget = draw(st.floats(1e6, 1e9))
    frac = draw(st.lists(st.one_of(st.none(), st.floats(0.02, 0.6)), min_size=n, max_size=n))
    cap = np.array([np.inf if f is None else f * budget for f in frac])
    return lam, c, budget, cap, draw(st.floats(1, 3600))


def scipy_floored_optimum(lam: np.ndarray, c: np.ndarray, budget: float, cap: np.ndarray, floor_s: float) -> float:
    """min Σ min_{Δ_i >= Δ_min} (λ_i Δ_i/2 + C_i/(b_i Δ_i)) s.t. Σ b = min(budget, Σ caps), 0 < b <= cap (SLSQP
    on the shares, restarted from the best point found; the objective is convex and C¹ in b)."""
    total = min(budget, float(cap.sum()))
    upper = np.minimum(cap / total, 1.0)
    best_x = upper / upper.sum()
    best = float(np.sum(floored_cost(lam, c, best_x * total, floor_s)))
    for _ in range(4):
        res = minimize(
            lambda x: float(np.sum(floored_cost(lam, c, x * total, floor_s))),
            best_x,
            method="SLSQP",
            bounds=list(zip(np.full(len(lam), 1e-12), upper, strict=True)),
            constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0, "jac": lambda x: np.ones_like(x)}],
            options={"ftol": 1e-16, "maxiter": 1000},
        )
        x = np.clip(res.x, 1e-12, upper)
        x = x / x.sum()
        # renormalising can lift a capped share past its cap: price the point with the caps held (feasible,
        # and never cheaper than the point itself), or the reference could beat the optimum by breaking a bound
        value = float(np.sum(floored_cost(lam, c, np.minimum(x * total, cap), floor_s)))
        if value < best:
            best, best_x = value, x
    return best


@SETTINGS
@given(floored_instances())
def test_floored_shares_match_scipy_optimum(inst: tuple) -> None:
    lam, c, budget, cap, floor_s = inst
    b = allocate_checkpoint_bandwidth(lam, c, budget, cap, min_interval_s=floor_s)
    assert np.all(b <= cap * (1 + 1e-12)) and np.all(b > 0)
    assert b.sum() == pytest.approx(min(budget, cap.sum()), rel=1e-9)
    ours = float(np.sum(floored_cost(lam, c, b, floor_s)))
    best = scipy_floored_optimum(lam, c, budget, cap, floor_s)
    # Never worse than a general solver's best of several starts (to rounding: the costs are sums of terms that
    # differ by up to 1e9). SLSQP may stop short of the optimum on badly scaled instances (Hypothesis found one
    # 7 % above ours); being better than it is no failure.
    assert ours <= best * (1 + 1e-7)


@SETTINGS
@given(floored_instances())
def test_floor_that_does_not_bind_leaves_theorem1_unchanged(inst: tuple) -> None:
    lam, c, budget, cap, floor_s = inst
    plain = allocate_checkpoint_bandwidth(lam, c, budget, cap)
    floored = allocate_checkpoint_bandwidth(lam, c, budget, cap, min_interval_s=floor_s)
    if np.all(optimal_interval_s(lam, c, plain) >= floor_s):
        assert np.array_equal(plain, floored)


@SETTINGS
@given(floored_instances())
def test_floored_shares_equalise_the_marginal_cost(inst: tuple) -> None:
    """The optimality conditions of design §2 "Minimum interval": every uncapped job's cost falls at the same
    rate μ per extra byte/s — sqrt(λC/2)·b^(-3/2) off the floor, C/(b²Δ_min) at it — and a capped job's faster."""
    lam, c, budget, cap, floor_s = inst
    b = allocate_checkpoint_bandwidth(lam, c, budget, cap, min_interval_s=floor_s)
    at_floor = optimal_interval_s(lam, c, b) < floor_s
    marginal = np.where(at_floor, c / (b**2 * floor_s), np.sqrt(lam * c / 2) * b**-1.5)
    capped = b >= cap * (1 - 1e-9)
    if (~capped).any():
        mu = marginal[~capped]
        assert mu.max() <= mu.min() * (1 + 1e-6)
        assert np.all(marginal[capped] >= mu.min() * (1 - 1e-6))


@SETTINGS
@given(st.lists(floored_instances(), min_size=1, max_size=4), st.floats(1, 3600))
def test_floored_groups_equal_separate_calls(insts: list, floor_s: float) -> None:
    lam = np.concatenate([i[0] for i in insts])
    c = np.concatenate([i[1] for i in insts])
    cap = np.concatenate([i[3] for i in insts])
    budgets = np.array([i[2] for i in insts])
    group = np.concatenate([np.full(len(i[0]), g) for g, i in enumerate(insts)])
    together = allocate_checkpoint_bandwidth(lam, c, budgets, cap, group, min_interval_s=floor_s)
    for g, (la, cc, bb, cp, _) in enumerate(insts):
        alone = allocate_checkpoint_bandwidth(la, cc, bb, cp, min_interval_s=floor_s)
        # to rounding: the water levels come from cumulative sums over every group at once (one pass, no loop
        # per node), so a group's sums carry the rounding of the groups before it (Hypothesis found 2e-12)
        assert np.allclose(together[group == g], alone, rtol=1e-9)


def test_tiny_checkpoint_is_told_the_floor_not_half_a_second() -> None:
    """The case that needs the floor: a 2.5 KB checkpoint alone on a 1 Gbit/s budget, one reclaim an hour."""
    jobs = P1Jobs.build(("toy",), np.array([1 / 3600]), np.array([2500.0]))
    assert plan_checkpoints(jobs, 37.5e6, min_interval_s=0.0).interval_s[0] < 1.0  # the paper's Eq. 9
    plan = plan_checkpoints(jobs, 37.5e6)
    assert MIN_INTERVAL_S == 60.0
    assert plan.interval_s[0] == 60.0
    assert not plan.loss_budget_at_risk[0]


def test_floor_above_twice_the_loss_budget_flags_the_budget_at_risk() -> None:
    jobs = P1Jobs.build(("a",), np.array([1 / 3600]), np.array([2500.0]), loss_budget_s=np.array([20.0]))
    plan = plan_checkpoints(jobs, 37.5e6, min_interval_s=60.0)
    assert plan.interval_s[0] == 60.0 and plan.loss_budget_at_risk[0]


def test_floored_job_yields_bandwidth_to_a_large_one() -> None:
    """A toy job next to a 10 GB job: at the floor, more bandwidth only shortens its writes, which are already
    tiny; the optimum hands most of its cube-root share to the large job."""
    lam, c = np.array([1 / 3600, 1 / 3600]), np.array([2500.0, 1e10])
    plain = allocate_checkpoint_bandwidth(lam, c, 37.5e6)
    floored = allocate_checkpoint_bandwidth(lam, c, 37.5e6, min_interval_s=60.0)
    assert floored[0] < plain[0] / 2 and floored[1] > plain[1]
    assert floored.sum() == pytest.approx(37.5e6, rel=1e-12)
    assert np.sum(floored_cost(lam, c, floored, 60.0)) < np.sum(floored_cost(lam, c, plain, 60.0))


def test_contract_takes_the_floor_with_the_default_of_p1() -> None:
    job = {"id": "toy", "hazard_per_s": 1 / 3600, "ckpt_bytes": 2500}
    default = decide("p1", {"budget_bytes_per_s": 37.5e6, "jobs": [job]})
    assert default["jobs"][0]["interval_s"] == MIN_INTERVAL_S
    custom = decide("p1", {"budget_bytes_per_s": 37.5e6, "min_interval_s": 300, "jobs": [job]})
    assert custom["jobs"][0]["interval_s"] == 300.0
    none = decide("p1", {"budget_bytes_per_s": 37.5e6, "min_interval_s": 0, "jobs": [job]})
    assert none["jobs"][0]["interval_s"] < 1.0
