"""P1's hazard-aware overhead floor (design §2 Eq. 9, "Hazard-aware overhead floor"): the floor C/(βb) keeps a job
from writing more than β of its time, except where the job's own hazard asks for more (Lemma 1's overhead above β),
where Lemma 1's interval is used; the paper's floor stays available as ``overhead_floor="eq9"``."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.p1 import P1Jobs, optimal_interval_s, overhead_floor_s, plan_checkpoints

SETTINGS = settings(max_examples=80, deadline=None)


@st.composite
def job_sets(draw: st.DrawFn) -> tuple[P1Jobs, float, float, float]:
    n = draw(st.integers(1, 8))
    lam = np.array(draw(st.lists(st.floats(1e-7, 2e-3), min_size=n, max_size=n)))  # 0.0004/h to 7/h
    c = np.array(draw(st.lists(st.floats(1e6, 5e10), min_size=n, max_size=n)))
    loss = np.array(draw(st.lists(st.one_of(st.none(), st.floats(30, 7200)), min_size=n, max_size=n)), dtype=float)
    jobs = P1Jobs.build(ids=tuple(f"j{i}" for i in range(n)), hazard_per_s=lam, ckpt_bytes=c,
                        loss_budget_s=np.where(np.isnan(loss), np.inf, loss))
    return jobs, draw(st.floats(1e6, 1e9)), draw(st.floats(0.05, 1.0)), draw(st.sampled_from([0.0, 60.0]))


@SETTINGS
@given(job_sets())
def test_interval_never_below_the_overhead_floor_nor_above_lemma1_for_the_floor(case: tuple) -> None:
    """Δ ≥ max(min(C/(βb), Δ*), Δ_min) always; and where the loss budget does not bind, a job is never held above
    Lemma 1's Δ* by the overhead floor: Δ = max(Δ*, Δ_min)."""
    jobs, budget, beta, floor_s = case
    plan = plan_checkpoints(jobs, budget, beta, min_interval_s=floor_s)
    b, c = plan.bandwidth_bytes_per_s, jobs.ckpt_bytes
    free = optimal_interval_s(jobs.hazard_per_s, c, b)
    lower = np.maximum(np.minimum(c / (beta * b), free), floor_s)
    assert np.all(plan.interval_s >= lower * (1 - 1e-12))
    upper = 2 * jobs.loss_budget_s
    unbudgeted = np.maximum(free, floor_s) <= upper
    assert np.allclose(plan.interval_s[unbudgeted], np.maximum(free, floor_s)[unbudgeted], rtol=1e-12)
    assert np.array_equal(plan.loss_budget_at_risk, lower > upper)


@SETTINGS
@given(job_sets())
def test_hazard_floor_never_costs_more_than_eq9(case: tuple) -> None:
    """Per job, the model's cost λΔ/2 + C/(bΔ) at the hazard-aware floor's interval is at most Eq. 9's where the
    budget is met by both: the floor only steps aside where stepping aside is cheaper."""
    jobs, budget, beta, floor_s = case
    new = plan_checkpoints(jobs, budget, beta, min_interval_s=floor_s)
    old = plan_checkpoints(jobs, budget, beta, min_interval_s=floor_s, overhead_floor="eq9")
    assert np.array_equal(new.bandwidth_bytes_per_s, old.bandwidth_bytes_per_s)  # the split is Theorem 1's in both
    lam, c, b = jobs.hazard_per_s, jobs.ckpt_bytes, new.bandwidth_bytes_per_s

    def cost(d: np.ndarray) -> np.ndarray:
        return lam * d / 2 + c / (b * d)

    both = ~new.loss_budget_at_risk & ~old.loss_budget_at_risk
    assert np.all(cost(new.interval_s)[both] <= cost(old.interval_s)[both] * (1 + 1e-12))


def test_high_hazard_big_checkpoint_gets_lemma1_not_five_writes():
    """The paper-hazard campus's big job (design §21.4 finding 12): 48 GB at 75 MB/s (a 640 s write), 2 reclaims an
    hour that behave as emergencies. Eq. 9 at β = 0.2 holds it at 5 writes (3,200 s, λΔ ≈ 1.8); Lemma 1 says
    sqrt(2·640·1800) ≈ 1,518 s, and the hazard-aware floor uses it."""
    lam, c, b = 2 / 3600, 48e9, 75e6
    jobs = P1Jobs.build(ids=("big",), hazard_per_s=np.array([lam]), ckpt_bytes=np.array([c]))
    eq9 = plan_checkpoints(jobs, b, overhead_floor="eq9").interval_s[0]
    new = plan_checkpoints(jobs, b).interval_s[0]
    assert eq9 == pytest.approx(c / (0.2 * b))
    assert new == pytest.approx(np.sqrt(2 * c / (lam * b)))
    assert new < eq9 / 2


def test_low_hazard_and_unmeetable_budget_keep_eq9_floor():
    """Where Lemma 1 is above C/(βb) the two rules agree, and a loss budget below the floor still leaves the job at
    C/(βb) flagged (β's guard against chasing a budget it cannot meet), not at 2·L_max."""
    c, b = 48e9, 75e6  # a 640 s write: the floor is 3,200 s at β = 0.2
    jobs = P1Jobs.build(ids=("quiet", "budgeted"), hazard_per_s=np.array([1e-6, 1e-6]), ckpt_bytes=np.array([c, c]),
                        loss_budget_s=np.array([np.inf, 600.0]))
    new = plan_checkpoints(jobs, np.array([b, b]), group=np.array([0, 1]))
    old = plan_checkpoints(jobs, np.array([b, b]), group=np.array([0, 1]), overhead_floor="eq9")
    assert np.array_equal(new.interval_s, old.interval_s)
    assert new.interval_s[1] == pytest.approx(c / (0.2 * b))
    assert new.loss_budget_at_risk.tolist() == [False, True]


def test_async_stall_floor_is_hazard_aware_too():
    """design §2 "Asynchronous snapshots": the floor s/β on the stall steps aside for sqrt(2s/λ) in the same way;
    the transfer floor T stays."""
    lam, s = 2 / 3600, 300.0
    jobs = P1Jobs.build(ids=("a",), hazard_per_s=np.array([lam]), ckpt_bytes=np.array([1e9]),
                        stall_s=np.array([s]), transfer_s=np.array([np.nan]))
    plan = plan_checkpoints(jobs, 1e8)
    assert plan.interval_s[0] == pytest.approx(np.sqrt(2 * s / lam))
    assert plan_checkpoints(jobs, 1e8, overhead_floor="eq9").interval_s[0] == pytest.approx(s / 0.2)


def test_unknown_floor_rule_is_refused():
    with pytest.raises(ValueError, match="overhead_floor"):
        overhead_floor_s(np.array([1.0]), np.array([2.0]), 0.2, "paper")
