"""Dependency cascades and array notices stay bounded (design §16.6): a failed parent cancels a 200-task array
with ONE notice (one outbox row), a 50-deep chain of single jobs cancels iteratively (the stack does not grow
with the depth) and each single job keeps its own notice, an array's tasks ending send one ``array.finished``
with the counts, and cancelling a big array is one notice too."""

from __future__ import annotations

import traceback
from typing import Any

import pytest

from portal.core import events
from portal.core.models import Job, OutboxMessage
from portal.notify.dispatch import FAN_OUT
from portal.queue import submit as queue_submit
from portal.queue.api import cancel_array
from portal.queue.models import DependencyKind, JobDependency
from tests.portal import factories as f
from tests.queue.conftest import QueueCampus, end

FIELDS = {"command": "python train.py", "expected_runtime_s": 600.0, "ckpt_bytes_estimate": 10**6}


@pytest.fixture
def notices(monkeypatch: pytest.MonkeyPatch) -> list[events.Notice]:
    """Every notice delivered after its commit, in order, on top of the real deliveries (the notify outbox)."""
    delivered: list[events.Notice] = []
    monkeypatch.setattr(events, "DELIVERIES", [*events.DELIVERIES, delivered.append])
    return delivered


def _fan_out_rows() -> int:
    return OutboxMessage.objects.filter(task_name=FAN_OUT).count()


def test_a_failed_parent_cancels_a_200_task_array_with_one_notice_and_one_outbox_row(
        qc: QueueCampus, notices: list[events.Notice], django_capture_on_commit_callbacks: Any) -> None:
    parent = qc.job(qc.a, name="prepare")
    arr = queue_submit.submit_array(qc.alice, array="0-199%8", after_ok=[parent.pk], group=qc.a, name="sweep",
                                    gpu_count=1, **FIELDS)
    rows_before = _fan_out_rows()
    with django_capture_on_commit_callbacks(execute=True):
        end(parent, "fail")
    assert Job.objects.filter(array_task__array=arr, state="cancelled").count() == 200
    assert [n.name for n in notices] == ["array.dependency_cancelled"]
    assert notices[0].text == (f"Your array “sweep” (200 tasks): 200 cancelled because job {parent.pk} “prepare” "
                               "failed. The array has ended: 200 cancelled.")
    assert notices[0].url == f"/jobs/arrays/{arr.pk}/"
    assert _fan_out_rows() - rows_before == 1
    task = Job.objects.filter(array_task__array=arr).first()
    assert task is not None and task.failure_reason.startswith(f"Cancelled: it runs only after job {parent.pk}")


def test_a_50_deep_chain_of_after_ok_jobs_cancels_iteratively_each_with_its_own_notice(
        qc: QueueCampus, notices: list[events.Notice], monkeypatch: pytest.MonkeyPatch,
        django_capture_on_commit_callbacks: Any) -> None:
    chain = [qc.job(qc.a, name="link-0")]
    for i in range(1, 51):
        job = qc.job(qc.a, name=f"link-{i}")
        JobDependency.objects.create(job=job, parent=chain[-1], kind=DependencyKind.AFTER_OK)
        chain.append(job)
    depths: list[int] = []
    real_emit = events.emit

    def emit(name: str, **kw: Any) -> Any:
        depths.append(len(traceback.extract_stack()))
        return real_emit(name, **kw)

    monkeypatch.setattr(events, "emit", emit)
    with django_capture_on_commit_callbacks(execute=True):
        end(chain[0], "fail")
    assert set(Job.objects.filter(pk__in=[j.pk for j in chain[1:]]).values_list("state", flat=True)) == {
        "cancelled"}
    assert len(notices) == 50 and {n.name for n in notices} == {"job.dependency_cancelled"}
    assert max(depths) - min(depths) <= 2  # no frame per level: a worklist, not recursion through the end hook
    last = Job.objects.get(pk=chain[-1].pk)
    assert last.failure_reason == (f"Cancelled: it runs only after job {chain[-2].pk} “link-49” completes, and "
                                   "that job was cancelled.")


def test_an_arrays_tasks_ending_send_one_array_finished_notice_with_the_counts(
        qc: QueueCampus, notices: list[events.Notice], django_capture_on_commit_callbacks: Any) -> None:
    arr = queue_submit.submit_array(qc.alice, array="0-3", group=qc.a, name="grid", gpu_count=1, **FIELDS)
    tasks = list(Job.objects.filter(array_task__array=arr).order_by("array_task__index"))
    single = qc.job(qc.a, name="alone")
    with django_capture_on_commit_callbacks(execute=True):
        for task, how in zip(tasks, ("complete", "complete", "fail", "cancel"), strict=True):
            end(task, how)
            if how != "cancel":  # what the agent link's handler says of each task: folded into the array's
                assert events.emit("job.finished" if how == "complete" else "job.failed", job=task) is None
        end(single)
        assert events.emit("job.finished", job=single) is not None  # a single job keeps its own notice
    assert [n.name for n in notices] == ["array.finished", "job.finished"]
    assert notices[0].text == "Your array “grid” (4 tasks) has ended: 2 completed, 1 failed, 1 cancelled."
    others = notices[0].text_others
    assert others.startswith("Array “grid” (4 tasks) of alice")


def test_cancelling_a_200_task_array_is_one_notice_and_stops_nothing_that_was_only_queued(
        qc: QueueCampus, notices: list[events.Notice], django_capture_on_commit_callbacks: Any) -> None:
    node = qc.node(1)
    arr = queue_submit.submit_array(qc.alice, array="0-199", group=qc.a, name="big", gpu_count=1, **FIELDS)
    running = Job.objects.filter(array_task__array=arr).order_by("array_task__index").first()
    assert running is not None
    f.place_job(running, node, [0])
    after = queue_submit.submit(qc.alice, after_ok=[running.pk], group=qc.a, name="after", gpu_count=1, **FIELDS)
    rows_before = OutboxMessage.objects.count()
    with django_capture_on_commit_callbacks(execute=True):
        assert cancel_array(arr, qc.alice) == 200
    assert Job.objects.filter(array_task__array=arr, state="cancelled").count() == 200
    assert sorted(n.name for n in notices) == ["array.finished", "job.dependency_cancelled"]
    after.refresh_from_db()
    assert after.state == "cancelled"
    assert OutboxMessage.objects.count() - rows_before <= 4  # one stop (the running task) and the two notices


def test_someone_outside_the_group_cannot_cancel_an_array(qc: QueueCampus) -> None:
    arr = queue_submit.submit_array(qc.alice, array="0-2", group=qc.a, name="mine", gpu_count=1, **FIELDS)
    from django.core.exceptions import PermissionDenied

    with pytest.raises(PermissionDenied):
        cancel_array(arr, qc.bob)
    assert not Job.objects.filter(array_task__array=arr, state="cancelled").exists()
