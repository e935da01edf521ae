"""The fair queue through placement (design §16.6): quotas hold jobs back with the reason and let them go when
usage falls, fair share orders groups by the formula's numbers, arrays respect their throttle, dependencies gate
and cancel, over-quota jobs are preempted for a job within quota. Each test runs placement passes as the control
tick does (``place_queued``) and reads what the portal shows."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from portal.control.models import AgentCommand, Eviction
from portal.core.models import Job
from portal.queue import submit as queue_submit
from portal.queue.dashboard import fair_share_rows
from portal.queue.models import GroupQuota, OverQuotaRun, QueueEntry
from tests.portal import factories as f
from tests.queue.conftest import QueueCampus, end, open_placements

FIELDS = {"command": "python train.py", "expected_runtime_s": 600.0, "ckpt_bytes_estimate": 10**6}


def test_a_job_over_its_groups_quota_waits_with_the_reason_and_starts_when_usage_falls(
        qc: QueueCampus, place: Any) -> None:
    node = qc.node(2)
    GroupQuota.objects.create(group=qc.a, max_gpus=1)
    a1 = qc.job(qc.a)
    f.place_job(a1, node, [0])  # Group A holds its one GPU
    a2 = qc.job(qc.a)
    b1 = qc.job(qc.b, gpus=2)  # within its quota, waiting for the whole node
    place()
    assert open_placements([a2, b1]) == set()
    entry = QueueEntry.objects.get(job=a2)
    assert entry.reason == "over_quota"
    assert entry.reason_text.startswith("Its group Group A is at its quota (1 GPU at once)")
    detail = qc.client(qc.alice).get(f"/api/jobs/{a2.pk}/").json()
    assert detail["queue_reason"] == "over_quota"
    assert detail["waiting_reason"]["text"].startswith("Its group Group A is at its quota")
    page = _page(qc.alice, a2)
    assert "is at its quota (1 GPU at once)" in page

    end(a1)  # Group A's usage falls back under its quota
    end(b1, "cancel")
    place()
    assert open_placements([a2]) == {a2.pk}
    assert not OverQuotaRun.objects.filter(job=a2).exists()  # started within quota: not preemptible


def test_after_heavy_use_a_groups_next_job_ranks_below_an_idle_groups_by_the_formulas_numbers(
        qc: QueueCampus, place: Any, past_usage: Any) -> None:
    node = qc.node(1)
    past_usage(qc, qc.a, node, gpus=2, hours=10, ended_hours_ago=1)  # Group A used 20 GPU-hours; B nothing
    a_job, b_job = qc.job(qc.a, gpus=2), qc.job(qc.b, gpus=2)  # neither fits a 1-GPU node: both wait
    Job.objects.filter(pk__in=[a_job.pk, b_job.pk]).update(submitted_at=timezone.now() - dt.timedelta(days=3.5))
    place()
    # Equal shares: F = 2^(−(u/Σu)/(s/Σs)) is 2^(−1/0.5) = 0.25 for A and 2^0 = 1 for B; default weights
    # 0.5 class (standard: 0.5), 0.4 fair share, 0.1 age (3.5 of 7 days: 0.5).
    expect_a = "0.40 = class 0.25 + fair share 0.10 + age 0.05"
    expect_b = "0.70 = class 0.25 + fair share 0.40 + age 0.05"
    assert [e.job_id for e in QueueEntry.objects.order_by("rank")] == [b_job.pk, a_job.pk]
    assert qc.client(qc.alice).get(f"/api/jobs/{a_job.pk}/").json()["priority"]["text"] == expect_a
    b_detail = qc.client(qc.bob).get(f"/api/jobs/{b_job.pk}/").json()
    assert b_detail["priority"]["text"] == expect_b
    assert b_detail["priority"]["terms"] == {"class": 0.25, "fair_share": 0.4, "age": 0.05}
    assert b_detail["priority"]["rank"] == 1
    assert expect_a in _page(qc.alice, a_job)
    factors = {r["group"]: round(r["factor"], 4) for r in fair_share_rows()["rows"]}
    assert factors == {"Group A": 0.25, "Group B": 1.0}


def test_an_array_never_runs_more_tasks_than_its_throttle_and_each_knows_its_index(
        qc: QueueCampus, place: Any) -> None:
    qc.node(8)
    arr = queue_submit.submit_array(qc.alice, array="0-9%3", group=qc.a, name="sweep", gpu_count=1, **FIELDS)
    jobs = list(Job.objects.filter(array_task__array=arr).order_by("array_task__index"))
    assert [j.name for j in jobs[:2]] == ["sweep[0]", "sweep[1]"] and len(jobs) == 10
    for left in (10, 7, 4, 1):
        place()
        running = open_placements(jobs)
        assert len(running) == min(3, left)  # never more than the throttle, refilled as tasks end
        for pk in running:
            end(Job.objects.get(pk=pk))
    place()
    assert Job.objects.filter(array_task__array=arr, state="completed").count() == 10
    envs = [c.payload.get("env") for c in AgentCommand.objects.filter(kind="start_job").order_by("pk")]
    assert envs[0] == {"RECLAIMNET_ARRAY_ID": str(arr.pk), "RECLAIMNET_ARRAY_INDEX": "0"}
    assert sorted(int(e["RECLAIMNET_ARRAY_INDEX"]) for e in envs) == list(range(10))


def test_a_throttled_array_task_waits_with_the_throttle_as_its_reason(qc: QueueCampus, place: Any) -> None:
    qc.node(4)
    arr = queue_submit.submit_array(qc.alice, array="0-3%1", group=qc.a, name="one-by-one", gpu_count=1, **FIELDS)
    place()
    assert QueueEntry.objects.filter(job__array_task__array=arr, reason="array_throttle").count() == 3


def test_a_failed_parent_cancels_its_after_ok_children_with_the_reason_and_after_any_starts(
        qc: QueueCampus, place: Any) -> None:
    qc.node(4)
    parent = qc.job(qc.a, name="prepare")
    ok_child = queue_submit.submit(qc.alice, after_ok=[parent.pk], group=qc.a, name="train", gpu_count=1, **FIELDS)
    grandchild = queue_submit.submit(qc.alice, after_ok=[ok_child.pk], group=qc.a, name="eval", gpu_count=1,
                                     **FIELDS)
    any_child = queue_submit.submit(qc.alice, after_any=[parent.pk], group=qc.a, name="clean", gpu_count=1,
                                    **FIELDS)
    place()
    assert open_placements() == {parent.pk}
    entry = QueueEntry.objects.get(job=any_child)
    assert entry.reason == "dependency" and f"job {parent.pk}" in entry.reason_text
    end(parent, "fail")
    for child in (ok_child, grandchild):
        child.refresh_from_db()
        assert child.state == "cancelled"
    assert ok_child.failure_reason == (f"Cancelled: it runs only after job {parent.pk} “prepare” completes, and "
                                       f"that job failed.")
    assert f"job {ok_child.pk}" in grandchild.failure_reason
    place()
    assert open_placements() == {any_child.pk}
    assert "cancelled" in _page(qc.alice, ok_child)


def test_an_after_ok_child_starts_once_its_parent_completed(qc: QueueCampus, place: Any) -> None:
    qc.node(2)
    parent = qc.job(qc.a)
    child = queue_submit.submit(qc.alice, after_ok=[parent.pk], group=qc.a, name="next", gpu_count=1, **FIELDS)
    place()
    assert open_placements() == {parent.pk}
    end(parent)
    place()
    assert open_placements() == {child.pk}


def test_an_over_quota_running_job_is_checkpointed_and_requeued_when_a_job_within_quota_waits(
        qc: QueueCampus, place: Any) -> None:
    node = qc.node(2)
    GroupQuota.objects.create(group=qc.a, max_gpus=1)
    a1, a2 = qc.job(qc.a), qc.job(qc.a)
    f.place_job(a1, node, [0])
    f.place_job(a2, node, [1])
    OverQuotaRun.objects.create(job=a2)  # it started beyond the quota, on GPUs nobody else wanted then
    b1 = qc.job(qc.b)
    place()
    a2.refresh_from_db()
    assert a2.state == "migrating"  # its final checkpoint is on its way; then it is queued again
    eviction = Eviction.objects.get(job=a2)
    assert (eviction.reason, eviction.then) == ("preempted", "requeue")
    assert Job.objects.get(pk=a1.pk).state == "running"  # the job within quota stays
    assert QueueEntry.objects.get(job=b1).reason == "behind_others"
    assert "checkpointed to make room" in QueueEntry.objects.get(job=b1).reason_text


def test_a_waiting_job_gets_an_estimated_start_from_the_running_jobs_expected_runtimes(
        qc: QueueCampus, place: Any) -> None:
    node = qc.node(1)
    running = qc.job(qc.a, expected_runtime_s=3600.0)
    f.place_job(running, node)
    waiting = qc.job(qc.b)
    before = timezone.now()
    place()
    entry = QueueEntry.objects.get(job=waiting)
    assert entry.reason == "reserved" and entry.reserved_node_id == node.pk
    expected = before + dt.timedelta(hours=1)
    assert abs((entry.estimated_start_at - expected).total_seconds()) < 60
    assert qc.client(qc.bob).get(f"/api/jobs/{waiting.pk}/").json()["estimated_start_at"] is not None


def _page(user: Any, job: Job) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/jobs/{job.pk}/")
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture(autouse=True)
def _inline(settings: Any) -> None:
    settings.RECLAIMNET_NO_LOOP = True


def test_a_pass_reads_and_writes_the_queue_in_as_many_statements_for_60_waiting_jobs_as_for_6(
        qc: QueueCampus, place: Any, past_usage: Any) -> None:
    node = qc.node(2)
    past_usage(qc, qc.a, node, gpus=1, hours=3, ended_hours_ago=2)
    f.place_job(qc.job(qc.b, gpus=2), node, [0, 1])  # the node is full: nobody starts, everybody is ranked

    def statements(n: int) -> int:
        for k in range(n):
            qc.job(qc.a if k % 2 else qc.b)
        with CaptureQueriesContext(connection) as captured:
            assert place() == 0
        return len(captured.captured_queries)

    few = statements(6)
    many = statements(54)
    assert QueueEntry.objects.count() == 60
    assert few == many
