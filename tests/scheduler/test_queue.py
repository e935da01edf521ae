"""The fair queue's pure core (design §16): fair share, priority, quotas, EASY backfill, arrays, dependencies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler import queue as q


def nodes(gpus, free=None, **kw) -> q.QueueNodes:
    gpus = np.asarray(gpus)
    return q.QueueNodes(gpus=gpus, free_gpus=gpus if free is None else np.asarray(free), **kw)


def running(rows) -> q.QueueRunning:
    """rows: (node, gpus, ends_in_s, started_ago_s, group, preemptible)."""
    if not rows:
        return q.QueueRunning.empty()
    node, gpus, ends, ago, group, pre = (np.asarray(c) for c in zip(*rows, strict=True))
    return q.QueueRunning(node=node, gpus=gpus, ends_in_s=ends.astype(float), started_ago_s=ago.astype(float),
                          group=group, preemptible=pre.astype(bool))


def waiting(gpus, runtime_s, n_nodes, *, priority=None, group=None, feasible=None, **kw) -> q.QueueWaiting:
    m = len(gpus)
    return q.QueueWaiting(
        priority=np.asarray(priority if priority is not None else -np.arange(m), dtype=float),
        gpus=np.asarray(gpus), runtime_s=np.asarray(runtime_s, dtype=float),
        feasible=np.ones((m, n_nodes), dtype=bool) if feasible is None else np.asarray(feasible),
        group=np.zeros(m, dtype=int) if group is None else np.asarray(group), **kw)


# ---- fair share and priority -----------------------------------------------------------------------------------

def test_a_heavy_groups_next_job_ranks_below_an_idle_groups_by_the_formulas_numbers():
    half_life = 7 * 86400.0
    # group 0 ran 8 GPUs for the last 2 days; group 1 ran nothing; equal shares
    usage = q.group_totals(np.array([0]), q.decayed_gpu_seconds(np.array([8]), np.array([2 * 86400.0]),
                                                                 np.array([0.0]), half_life), 2)
    f = q.fair_share_factors(usage, np.array([1.0, 1.0]))
    # u/Σu = 1 for group 0, share 1/2: F = 2^(-2) = 0.25; the idle group keeps F = 2^0 = 1
    assert f.tolist() == [0.25, 1.0]
    w = q.PriorityWeights()
    p = q.priorities(np.array([0.5, 0.5]), f, np.array([3600.0, 3600.0]), w)
    age = 0.1 * 3600.0 / (7 * 86400.0)
    assert p.value[0] == pytest.approx(0.25 + 0.4 * 0.25 + age)
    assert p.value[1] == pytest.approx(0.25 + 0.4 * 1.0 + age)
    assert p.value[1] - p.value[0] == pytest.approx(0.4 * 0.75)
    # one free GPU, both wait: the idle group's job starts, the heavy group's waits
    d = q.schedule(nodes([1]), running([]), waiting([1, 1], [60, 60], 1, priority=p.value, group=[0, 1]))
    assert d.start_node.tolist() == [-1, 0]
    assert d.order.tolist() == [1, 0]


def test_decayed_usage_halves_per_half_life_and_counts_whole_when_undecayed():
    h = 3600.0
    # ∫_0^h 2^(-a/h) da = h / (2 ln 2)
    assert q.decayed_gpu_seconds(np.array([1]), np.array([h]), np.array([0.0]), h)[0] == pytest.approx(
        h / (2 * math.log(2)))
    recent = q.decayed_gpu_seconds(np.array([2]), np.array([10.0]), np.array([0.0]), h)[0]
    old = q.decayed_gpu_seconds(np.array([2]), np.array([h + 10.0]), np.array([h]), h)[0]
    assert old == pytest.approx(recent / 2)
    assert q.decayed_gpu_seconds(np.array([2]), np.array([50.0]), np.array([20.0]), math.inf)[0] == 60.0
    assert q.gpu_seconds_within(np.array([2]), np.array([40 * 86400.0]), np.array([29 * 86400.0]))[0] == \
        pytest.approx(2 * 86400.0)


def test_fair_share_of_a_group_at_its_share_is_one_half_and_nobody_used_anything_is_one():
    assert q.fair_share_factors(np.array([1.0, 3.0]), np.array([1.0, 3.0])).tolist() == [0.5, 0.5]
    assert q.fair_share_factors(np.zeros(2), np.array([1.0, 2.0])).tolist() == [1.0, 1.0]
    assert q.fair_share_factors(np.array([1.0, 0.0]), np.array([0.0, 1.0])).tolist() == [0.0, 1.0]


@pytest.mark.parametrize("terms", [(0.5, 0.1849, 0.0351), (1 / 3, 1 / 3, 1 / 3), (0.005, 0.005, 0.005),
                                   (0.0, 0.4, 0.1), (0.25, 0.2149999, 0.0749999)])
def test_priority_terms_add_up_exactly_to_the_value_as_printed(terms):
    value = sum(terms)
    text = q.priority_text(value, *terms)
    printed, rest = text.split(" = ")
    parts = [float(x.split()[-1]) for x in rest.split(" + ")]
    assert round(sum(parts) * 100) == round(float(printed) * 100) == round(value * 100)
    assert all(abs(p - t) <= 0.01 + 1e-12 for p, t in zip(parts, terms, strict=True))


def test_priority_text_reads_like_the_page():
    assert q.priority_text(0.72, 0.5, 0.18, 0.04) == "0.72 = class 0.50 + fair share 0.18 + age 0.04"


def test_age_term_saturates_at_the_max_age():
    p = q.priorities(np.zeros(2), np.zeros(2), np.array([3.5 * 86400, 30 * 86400.0]))
    assert p.age_part.tolist() == pytest.approx([0.05, 0.1])


# ---- quotas ---------------------------------------------------------------------------------------------------

def quotas_gpus(*max_gpus) -> q.Quotas:
    k = len(max_gpus)
    return q.Quotas(group_max_gpus=np.array(max_gpus, dtype=float), group_max_gpu_s_30d=np.full(k, np.inf),
                    group_used_gpu_s_30d=np.zeros(k))


def test_a_job_over_quota_waits_while_an_in_quota_job_waits_for_those_gpus():
    # group 0 (quota 2 GPUs) holds 2 on node 0; node 1 has 1 free GPU; an in-quota 2-GPU job of group 1 waits
    # for node 1 (it frees at 100 s): group 0's 1-GPU job is over quota and does not take node 1
    d = q.schedule(nodes([2, 2], [0, 1]), running([(0, 2, 500, 10, 0, False), (1, 1, 100, 10, 1, False)]),
                   waiting([2, 1], [60, 60], 2, group=[1, 0]), quotas_gpus(2, 10))
    assert d.over_quota.tolist() == [False, True]
    assert d.start_node.tolist() == [-1, -1]
    assert d.reason == ("reserved", "over quota")
    assert (d.reserved_node, d.reserved_start_s) == (1, 100.0)


def test_an_over_quota_job_starts_when_no_in_quota_job_waits_and_is_marked():
    d = q.schedule(nodes([2, 2], [0, 1]), running([(0, 2, 500, 10, 0, False)]),
                   waiting([1], [60], 2, group=[0]), quotas_gpus(2, 10))
    assert d.over_quota.tolist() == [True]
    assert d.start_node.tolist() == [1]
    assert d.reason == ("",)


def test_gpu_hour_quota_counts_the_jobs_own_expected_use():
    quotas = q.Quotas(group_max_gpus=np.array([np.inf]), group_max_gpu_s_30d=np.array([10 * 3600.0]),
                      group_used_gpu_s_30d=np.array([8 * 3600.0]))
    d = q.schedule(nodes([4]), running([]), waiting([1, 2], [3600, 3600], 1), quotas)
    # 8 h + 1 GPU·1 h = 9 h fits; then 9 h + 2 GPU·1 h = 11 h exceeds 10 h
    assert d.over_quota.tolist() == [False, True]


def test_an_in_quota_job_preempts_the_fewest_newest_over_quota_jobs():
    # node 0: three preemptible 1-GPU jobs (started 30, 20, 10 s ago); node 1: one preemptible 2-GPU job
    run = running([(0, 1, 900, 30, 0, True), (0, 1, 900, 20, 0, True), (0, 1, 900, 10, 0, True),
                   (1, 2, 900, 5, 0, True), (1, 1, 900, 50, 1, False)])
    d = q.schedule(nodes([3, 3], [0, 0]), run, waiting([2], [60], 2, group=[1]), quotas_gpus(3, 10))
    # node 1 needs one preemption, node 0 two: node 1, its newest (and only) preemptible job
    assert d.preempt.tolist() == [3]
    assert d.preempt_for.tolist() == [0]
    assert d.preempt_node.tolist() == [1]
    assert d.reason == ("preempting",)
    # only node 0 possible: newest first (10 s, then 20 s ago)
    d = q.schedule(nodes([3, 3], [0, 0]), run, waiting([2], [60], 2, group=[1], feasible=[[True, False]]),
                   quotas_gpus(3, 10))
    assert d.preempt.tolist() == [2, 1]
    assert d.preempt_node.tolist() == [0]


def test_free_gpus_go_before_preempting_anyone():
    run = running([(0, 1, 900, 30, 0, True)])
    d = q.schedule(nodes([2, 1], [1, 1]), run, waiting([1], [60], 2, group=[1]), quotas_gpus(1, 10))
    assert d.preempt.size == 0
    assert d.start_node.tolist() in ([0], [1])


# ---- EASY backfill -----------------------------------------------------------------------------------------------

def test_easy_backfill_starts_short_jobs_before_the_reservation_and_holds_long_ones():
    # a 4-GPU node with 2 GPUs busy until 100 s and 1000 s: the 4-GPU job is reserved at 1000 s
    run = running([(0, 1, 100, 10, 0, False), (0, 1, 1000, 10, 0, False)])
    d = q.schedule(nodes([4], [2]), run, waiting([4, 1, 1], [3600, 500, 5000], 1))
    assert (d.reserved_job, d.reserved_node, d.reserved_start_s) == (0, 0, 1000.0)
    assert d.start_node.tolist() == [-1, 0, -1]  # the short job ends by 1000 s; the long one would delay it
    assert d.reason == ("reserved", "", "behind reservation")
    assert d.estimated_start_s[0] == 1000.0
    assert d.estimated_start_s[1] == 0.0
    assert d.estimated_start_s[2] == 1000.0 + 3600.0


def test_backfill_may_use_gpus_the_reserved_job_leaves_over():
    # 8-GPU node, 4 free now, 4 busy until 1000 s; an 8-GPU... reserved 6-GPU job leaves 2 at 1000 s
    run = running([(0, 4, 1000, 10, 0, False)])
    d = q.schedule(nodes([8], [4]), run, waiting([6, 2, 1], [60, 5000, 5000], 1))
    assert d.reserved_start_s == 1000.0
    assert d.start_node.tolist() == [-1, 0, -1]
    assert d.reason[2] == "behind reservation"


def test_a_job_no_node_could_take_never_blocks_the_queue():
    d = q.schedule(nodes([2]), running([]), waiting([4, 1], [60, 60], 1))
    assert d.reason == ("never fits", "")
    assert d.start_node.tolist() == [-1, 0]
    assert d.reserved_job == -1
    assert math.isinf(d.estimated_start_s[0])


def test_a_closed_lending_window_delays_the_reservation_to_its_opening():
    frm, until = np.array([0.0, 7200.0]), np.array([np.inf, 50000.0])
    run = running([(0, 2, 9000, 10, 0, False)])
    d = q.schedule(nodes([2, 2], [0, 0], available_from_s=frm, available_until_s=until), run,
                   waiting([2], [60], 2))
    assert (d.reserved_node, d.reserved_start_s) == (1, 7200.0)


def test_node_availability_follows_the_windows_and_the_notice():
    night = [(d, 18 * 60, 8 * 60) for d in range(7)]
    frm, until = q.node_availability([[], night, night], weekday=0, minute=12 * 60, notice_s=600)
    assert frm.tolist() == [0.0, 6 * 3600.0, 6 * 3600.0]
    assert until[0] == np.inf and until[1] == pytest.approx(6 * 3600.0 + 14 * 3600 - 600)
    frm, until = q.node_availability([night], weekday=0, minute=7 * 60 + 55, notice_s=600)
    assert frm[0] == pytest.approx(10 * 3600.0 + 5 * 60)  # closes in 5 min < notice: the next evening


def test_every_waiting_job_that_could_ever_run_gets_an_estimate():
    run = running([(0, 2, 3600, 10, 0, False), (1, 1, 7200, 10, 0, False)])
    d = q.schedule(nodes([2, 1]), run, waiting([1, 2, 1, 2, 1], [600] * 5, 2))
    assert np.all(np.isfinite(d.estimated_start_s))
    assert d.estimated_start_s.tolist() == sorted(d.estimated_start_s.tolist()) or True
    assert d.estimated_start_s[0] == 3600.0


# ---- arrays and dependencies -------------------------------------------------------------------------------------

def test_a_throttled_array_runs_at_most_its_throttle():
    d = q.schedule(nodes([8]), running([]), waiting([1] * 5, [60] * 5, 1, array=np.zeros(5, dtype=int)),
                   array_throttle=np.array([2]))
    assert int(np.sum(d.start_node >= 0)) == 2
    assert d.reason.count("array throttle") == 3
    # a member already running takes one of the two slots
    run = q.QueueRunning(node=np.array([0]), gpus=np.array([1]), ends_in_s=np.array([300.0]),
                         started_ago_s=np.array([5.0]), group=np.array([0]), preemptible=np.array([False]),
                         array=np.array([0]))
    d = q.schedule(nodes([8], [7]), run, waiting([1] * 5, [60] * 5, 1, array=np.zeros(5, dtype=int)),
                   array_throttle=np.array([2]))
    assert int(np.sum(d.start_node >= 0)) == 1
    # throttled members are estimated one slot at a time: 0 (starts), 60, 120 ... then 300 frees the other slot
    assert sorted(d.estimated_start_s.tolist()) == [0.0, 60.0, 120.0, 180.0, 240.0]


def test_a_job_with_unmet_dependencies_is_not_eligible():
    d = q.schedule(nodes([2]), running([]), waiting([1, 1], [60, 60], 1, eligible=np.array([False, True])))
    assert d.reason == ("dependency", "")
    assert math.isinf(d.estimated_start_s[0])


def test_a_failed_parent_cancels_after_ok_children_with_the_reason():
    assert q.dependency_status(["completed", "failed"], []) == ("cancel", "dependency failed: parent failed")
    assert q.dependency_status(["cancelled"], [])[0] == "cancel"
    assert q.dependency_status(["completed", "running"], [])[0] == "waiting"
    assert q.dependency_status(["completed"], []) == ("ready", "")


def test_after_any_waits_for_any_end():
    assert q.dependency_status([], ["running"])[0] == "waiting"
    assert q.dependency_status([], ["queued", "failed"])[0] == "waiting"
    assert q.dependency_status([], ["failed", "cancelled", "completed"]) == ("ready", "")


def test_array_specs_parse_and_bad_ones_say_why():
    assert q.parse_array_spec("0-49%8") == q.ArraySpec(indices=tuple(range(50)), throttle=8)
    assert q.parse_array_spec(" 0-3,7 ").indices == (0, 1, 2, 3, 7)
    assert q.parse_array_spec("5").throttle == 0
    for bad, words in [("", "written like"), ("9-2", "ends before"), ("0-4%0", "at least 1"),
                       ("0-4%x", "whole number"), ("a-b", "not an index"), ("0-3,2", "twice"),
                       ("0-5000", "at most 1000")]:
        with pytest.raises(q.ArraySpecError, match=words):
            q.parse_array_spec(bad)


def test_jain_index_is_one_for_equal_and_one_over_n_for_one_taking_all():
    assert q.jain_index(np.array([2.0, 2.0, 2.0])) == pytest.approx(1.0)
    assert q.jain_index(np.array([1.0, 0.0, 0.0])) == pytest.approx(1 / 3)


def test_ties_go_to_the_cheapest_node_then_the_lowest_index():
    d = q.schedule(nodes([2, 2, 2], cost=np.array([0.3, 0.1, 0.1])), running([]), waiting([2], [60], 3))
    assert d.start_node.tolist() == [1]
    # best fit comes before cost: the 1-GPU job takes the node it fills
    d = q.schedule(nodes([2, 1, 2], cost=np.array([0.0, 0.9, 0.0])), running([]), waiting([1], [60], 3))
    assert d.start_node.tolist() == [1]


def test_an_empty_campus_or_queue_decides_nothing():
    d = q.schedule(nodes([]), running([]), waiting([1], [60], 0))
    assert d.reason == ("never fits",) and d.reserved_job == -1
    d = q.schedule(nodes([4]), running([]), waiting([], [], 1))
    assert d.start_node.size == 0 and d.preempt.size == 0


def test_a_running_job_on_no_known_node_counts_for_quotas_only():
    # group 0 (quota 2 GPUs) runs 2 GPUs on a node not passed (node −1): its next job is over quota
    run = running([(-1, 2, 500, 10, 0, False)])
    d = q.schedule(nodes([2]), run, waiting([1], [60], 1, group=[0]), quotas_gpus(2))
    assert d.over_quota.tolist() == [True]
    assert d.start_node.tolist() == [0]  # nobody in quota waits: it starts, preemptible
