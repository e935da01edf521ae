"""P3 (design §4): reservation, admission, max-min sharing, Theorems 3 and 4, multi-bottleneck form."""

import numpy as np
import pytest
import scheduler_literal as literal
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.p3 import DSCP, P3Flows, admit_flows, admit_flows_on_paths, migration_budget_bytes_per_s

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def flow_sets(draw: st.DrawFn) -> P3Flows:
    n = draw(st.integers(0, 10))
    ids = draw(st.lists(st.text("abcdef", min_size=1, max_size=3), min_size=n, max_size=n, unique=True))
    size = st.floats(1e7, 5e10)
    caps = st.one_of(st.none(), st.floats(1e6, 5e8))
    cap = [np.inf if x is None else x for x in draw(st.lists(caps, min_size=n, max_size=n))]
    return P3Flows(
        ids=tuple(ids),
        bytes=np.array(draw(st.lists(size, min_size=n, max_size=n))),
        notice_s=np.array(draw(st.lists(st.sampled_from([0.0, 10.0, 30.0, 60.0, 120.0, 600.0]), min_size=n, max_size=n))),
        restart_s=np.array(draw(st.lists(st.sampled_from([0.0, 5.0, 20.0]), min_size=n, max_size=n))),
        cap_bytes_per_s=np.array(cap, dtype=float),
    )


def check_theorems(flows: P3Flows, d, budget: float) -> None:
    admitted = d.admitted
    slack = flows.notice_s - flows.restart_s
    r_min = np.divide(flows.bytes, slack, out=np.full(len(flows.ids), np.inf), where=slack > 0)
    # Never above the migration budget (Theorem 4 with B_mig <= B - B_min).
    assert d.rate_bytes_per_s.sum() <= budget * (1 + 1e-9) + 1e-6
    # Admitted flows get at least their minimum, within their cap, and finish in time (Theorem 3).
    assert np.all(d.rate_bytes_per_s[admitted] >= r_min[admitted] * (1 - 1e-12))
    assert np.all(d.rate_bytes_per_s[admitted] <= flows.cap_bytes_per_s[admitted] * (1 + 1e-9))
    finish = flows.bytes[admitted] / d.rate_bytes_per_s[admitted] + flows.restart_s[admitted]
    assert np.all(finish <= flows.notice_s[admitted] * (1 + 1e-9))
    assert np.all(d.rate_bytes_per_s[~admitted] == 0)
    reasons = np.array(d.degraded_reason, dtype=object)
    assert np.all((reasons == None) == admitted)  # noqa: E711 (element-wise)
    assert set(reasons[~admitted]) <= {"notice", "cap", "capacity"}
    assert np.all((reasons == "notice") == ~(slack > 0))
    assert np.all(d.dscp[admitted] == DSCP["migration"])


@SETTINGS
@given(flow_sets(), st.floats(1e7, 2e9), st.floats(0, 0.9), st.floats(0, 5e8))
def test_single_bottleneck_properties(flows: P3Flows, capacity: float, beta: float, b_min: float) -> None:
    d = admit_flows(flows, capacity, beta, b_min)
    budget = max(0.0, capacity - max(beta * capacity, b_min))
    assert d.migration_budget_bytes_per_s == pytest.approx(budget)
    assert d.migration_budget_bytes_per_s <= capacity - b_min + 1e-6 or budget == 0
    check_theorems(flows, d, budget)
    ok = np.array([r is None for r in d.degraded_reason])
    slack = flows.notice_s - flows.restart_s
    eligible = (slack > 0) & (flows.bytes / np.where(slack > 0, slack, 1) <= flows.cap_bytes_per_s)
    if (flows.bytes[eligible] / slack[eligible]).sum() <= budget:
        assert np.array_equal(ok, eligible)  # everything fits: admit all
    # Work conserving: the leftover is only unused when every admitted flow is capped.
    if ok.any() and d.rate_bytes_per_s.sum() < budget * (1 - 1e-9):
        assert np.allclose(d.rate_bytes_per_s[ok], flows.cap_bytes_per_s[ok])


@SETTINGS
@given(flow_sets(), st.floats(1e7, 2e9))
def test_single_matches_literal(flows: P3Flows, capacity: float) -> None:
    d = admit_flows(flows, capacity)
    rows = [
        {"id": flows.ids[i], "bytes": flows.bytes[i], "notice_s": flows.notice_s[i], "restart_s": flows.restart_s[i],
         "cap": flows.cap_bytes_per_s[i], "links": [0]}
        for i in range(len(flows.ids))
    ]
    lit = literal.p3_paths(rows, [capacity])
    assert [r["reason"] for r in lit] == list(d.degraded_reason)
    assert np.allclose([r["rate"] for r in lit], d.rate_bytes_per_s, rtol=1e-7)


@SETTINGS
@given(flow_sets(), st.data())
def test_multi_bottleneck_respects_every_link(flows: P3Flows, data: st.DataObject) -> None:
    n_links = data.draw(st.integers(1, 5))
    caps = np.array(data.draw(st.lists(st.floats(1e7, 2e9), min_size=n_links, max_size=n_links)))
    paths = [
        np.array(data.draw(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=3, unique=True)))
        for _ in flows.ids
    ]
    d = admit_flows_on_paths(flows, caps, paths)
    budget = np.maximum(0, caps - 0.3 * caps)
    load = np.zeros(n_links)
    min_load = np.zeros(n_links)
    for k, p in enumerate(paths):
        load[p] += d.rate_bytes_per_s[k]
        min_load[p] += d.min_rate_bytes_per_s[k]
    assert np.all(load <= budget * (1 + 1e-9) + 1e-6)
    assert np.all(min_load <= budget * (1 + 1e-9) + 1e-6)
    check_theorems(flows, d, float(budget.sum()))
    rows = [
        {"id": flows.ids[i], "bytes": flows.bytes[i], "notice_s": flows.notice_s[i], "restart_s": flows.restart_s[i],
         "cap": flows.cap_bytes_per_s[i], "links": paths[i].tolist()}
        for i in range(len(flows.ids))
    ]
    lit = literal.p3_paths(rows, caps.tolist())
    assert [r["reason"] for r in lit] == list(d.degraded_reason)
    assert np.allclose([r["rate"] for r in lit], d.rate_bytes_per_s, rtol=1e-6)


def test_edf_admission_skips_and_continues() -> None:
    # Budget 70 B/s. EDF order a(τ=10), b(τ=20), c(τ=30): a needs 50, b needs 40 (no room), c needs 10.
    flows = P3Flows(
        ids=("c", "b", "a"),
        bytes=np.array([300.0, 800.0, 500.0]),
        notice_s=np.array([30.0, 20.0, 10.0]),
        restart_s=np.zeros(3),
        cap_bytes_per_s=np.full(3, np.inf),
    )
    d = admit_flows(flows, 100.0)
    assert d.degraded_reason == (None, "capacity", None)
    assert d.min_rate_bytes_per_s.tolist() == [10.0, 0.0, 50.0]
    assert d.rate_bytes_per_s.tolist() == pytest.approx([15.0, 0.0, 55.0])  # leftover 10 split equally


def test_deadline_ties_broken_by_smallest_id() -> None:
    flows = P3Flows(("y", "x"), np.array([600.0, 600.0]), np.array([10.0, 10.0]), np.zeros(2), np.full(2, np.inf))
    d = admit_flows(flows, 100.0)  # budget 70: only one of the two (60 each) fits
    assert d.degraded_reason == ("capacity", None)


def test_reasons_notice_and_cap() -> None:
    flows = P3Flows(("n", "k"), np.array([1e9, 1e9]), np.array([10.0, 100.0]), np.array([10.0, 0.0]), np.array([np.inf, 1e6]))
    d = admit_flows(flows, 1e9)
    assert d.degraded_reason == ("notice", "cap")
    assert not d.admitted.any()


def test_reserve_takes_the_larger_of_fraction_and_floor() -> None:
    assert migration_budget_bytes_per_s(100.0, 0.3, 50.0) == 50.0
    assert migration_budget_bytes_per_s(100.0, 0.3, 10.0) == 70.0
    assert migration_budget_bytes_per_s(100.0, 0.3, 200.0) == 0.0


@SETTINGS
@given(flow_sets(), st.floats(1e7, 2e9), st.floats(0, 0.9), st.floats(0, 5e8))
def test_single_form_equals_multi_form_on_one_link(flows: P3Flows, capacity: float, beta: float,
                                                    b_min: float) -> None:
    """One bottleneck, two code paths: the same admissions, reasons and rates (one fit rule for both)."""
    one = admit_flows(flows, capacity, beta, b_min)
    multi = admit_flows_on_paths(flows, np.array([capacity]), [np.array([0])] * len(flows.ids), beta, b_min)
    assert one.degraded_reason == multi.degraded_reason
    assert np.array_equal(one.admitted, multi.admitted)
    assert np.allclose(one.rate_bytes_per_s, multi.rate_bytes_per_s, rtol=1e-9)
    assert np.array_equal(one.dscp, multi.dscp)


def test_exact_fit_is_admitted_despite_rounding() -> None:
    """0.1 + 0.2 > 0.3 in floating point: flows whose minimums sum to the budget all fit."""
    flows = P3Flows(("a", "b", "c"), np.array([10.0, 20.0, 500.0]), np.array([100.0, 100.0, 10.0]), np.zeros(3),
                    np.full(3, np.inf))
    # r_min: c 50 (earliest deadline, skipped: it alone exceeds the budget), then a 0.1 and b 0.2; budget 0.3.
    d = admit_flows(flows, 0.3, reserve_fraction=0.0)
    assert d.degraded_reason[2] == "capacity"
    assert d.admitted[:2].all()
