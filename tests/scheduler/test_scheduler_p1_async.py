"""P1 with asynchronous snapshots (design §2 "Asynchronous snapshots"): the stall is the cost, the interval is
never shorter than the transfer, and synchronous jobs are planned exactly as before."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.contract import ContractError, decide
from scheduler.p1 import P1Jobs, plan_checkpoints

SETTINGS = settings(max_examples=60, deadline=None)


def _jobs(n: int, stall: np.ndarray | None = None, transfer: np.ndarray | None = None) -> P1Jobs:
    rng = np.random.default_rng(n)
    return P1Jobs.build(tuple(f"j{i}" for i in range(n)), rng.uniform(1e-5, 1e-3, n), rng.uniform(1e6, 5e10, n),
                        loss_budget_s=rng.choice([np.inf, 600.0, 7200.0], n), stall_s=stall, transfer_s=transfer)


def _same(a: object, b: object) -> None:
    for name in ("bandwidth_bytes_per_s", "interval_s", "final_checkpoint", "loss_budget_at_risk"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.expected_cost == b.expected_cost


def test_synchronous_jobs_are_planned_bit_for_bit_as_before() -> None:
    """No stall (None), or NaN stalls (no job snapshots): the very same plan, to the last bit."""
    base = plan_checkpoints(_jobs(12), 3e8)
    _same(base, plan_checkpoints(_jobs(12, np.full(12, np.nan), np.full(12, 40.0)), 3e8))
    mixed = plan_checkpoints(_jobs(12, np.r_[np.full(6, np.nan), np.full(6, 2.0)], np.full(12, 40.0)), 3e8)
    assert np.array_equal(mixed.interval_s[:6], base.interval_s[:6])  # the sync half is untouched
    assert np.array_equal(mixed.bandwidth_bytes_per_s, base.bandwidth_bytes_per_s)  # shares unchanged


def test_async_interval_is_lemma_1_at_the_stall_when_nothing_binds() -> None:
    lam, stall = 1e-4, 5.0  # sqrt(2·5/1e-4) = 316 s; C/b tiny, no loss budget
    jobs = P1Jobs.build(("a",), np.array([lam]), np.array([1e6]), stall_s=np.array([stall]))
    plan = plan_checkpoints(jobs, 1e9)
    assert plan.interval_s[0] == pytest.approx(np.sqrt(2 * stall / lam))
    assert plan.expected_cost == pytest.approx(lam * plan.interval_s[0] / 2 + stall / plan.interval_s[0])


def test_async_interval_is_never_shorter_than_the_transfer() -> None:
    jobs = P1Jobs.build(("a", "b"), np.array([1e-3, 1e-3]), np.array([1e9, 1e9]),
                        loss_budget_s=np.array([30.0, np.inf]), stall_s=np.array([0.5, 0.5]),
                        transfer_s=np.array([900.0, np.nan]))
    plan = plan_checkpoints(jobs, 1e7)  # b = 5 MB/s each: C/b = 200 s
    assert plan.interval_s[0] == pytest.approx(900.0)  # the measured transfer, though it breaks the budget
    assert plan.loss_budget_at_risk[0]
    assert plan.interval_s[1] == pytest.approx(1e9 / plan.bandwidth_bytes_per_s[1])  # not measured: C/b


@SETTINGS
@given(st.integers(1, 10), st.floats(0.0, 60.0), st.floats(0.0, 5000.0), st.one_of(st.just(0.0), st.floats(1.0, 600.0)))
def test_async_interval_bounds_hold(n: int, stall_s: float, transfer_s: float, floor_s: float) -> None:
    jobs = _jobs(n, np.full(n, stall_s), np.full(n, transfer_s))
    plan = plan_checkpoints(jobs, 2e8, beta=0.2, min_interval_s=floor_s)
    c_over_b = jobs.ckpt_bytes / plan.bandwidth_bytes_per_s
    lower = np.maximum(np.maximum(stall_s / 0.2, floor_s), np.maximum(transfer_s, c_over_b))
    assert np.all(plan.interval_s >= lower * (1 - 1e-12))
    ok = ~plan.loss_budget_at_risk
    assert np.all(plan.interval_s[ok] <= 2 * jobs.loss_budget_s[ok] * (1 + 1e-12))


def test_the_contract_takes_stall_and_transfer_and_names_a_bad_one() -> None:
    job = {"id": "a", "hazard_per_s": 1e-3, "ckpt_bytes": 1e9}
    sync = decide("p1", {"budget_bytes_per_s": 1e7, "jobs": [job]})
    same = decide("p1", {"budget_bytes_per_s": 1e7, "jobs": [{**job, "stall_s": None, "transfer_s": 900}]})
    assert sync == same  # no stall: the synchronous plan, whatever the transfer
    plan = decide("p1", {"budget_bytes_per_s": 1e7, "jobs": [{**job, "stall_s": 0.5, "transfer_s": 900}]})
    assert plan["jobs"][0]["interval_s"] == pytest.approx(900.0)
    for bad in (-1, "x", True):
        with pytest.raises(ContractError) as err:
            decide("p1", {"budget_bytes_per_s": 1e7, "jobs": [{**job, "stall_s": bad}]})
        assert err.value.field == "jobs[0].stall_s"
    with pytest.raises(ContractError) as err:
        decide("p1", {"budget_bytes_per_s": 1e7, "jobs": [{**job, "stall_s": 1, "transfer_s": -3}]})
    assert err.value.field == "jobs[0].transfer_s"
