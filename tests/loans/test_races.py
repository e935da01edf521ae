"""Loans under concurrency (design §15.4): one lock order for a job's rows, releases decided again on the locked
activity row, holding time written from the row as it stands, and the class's GPU limit held by the service."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.loans.helpers import beat_for, final_checkpoint, heartbeat, online_node, running_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120), pytest.mark.usefixtures("ladder")]

MIN = 60.0
LOCKED_TABLE = re.compile(r'FROM "(core_job|control_eviction|control_migrationwork)".*FOR UPDATE', re.S)


def _order_of_locks(queries: list[dict[str, Any]]) -> list[str]:
    """The tables of a job's rows in the order statements locked them (SELECT … FOR UPDATE, UPDATE), first time
    each."""
    seen: list[str] = []
    for q in queries:
        sql = q["sql"]
        found = LOCKED_TABLE.search(sql)
        table = found.group(1) if found else None
        if table is None:
            updated = re.match(r'UPDATE "(core_job|control_eviction|control_migrationwork)"', sql)
            table = updated.group(1) if updated else None
        if table is not None and table not in seen:
            seen.append(table)
    return seen


def _evicting(clock: Any) -> tuple[Any, Any, Any]:
    from portal.control.reclaim.evict import evict_job

    node = online_node("lab-a-01")
    job = running_job(node)
    heartbeat(node, job, 300, 50.0, clock.t)
    eviction = evict_job(job, "idle", 120.0, "suspend")
    assert eviction is not None
    return node, job, eviction


def test_a_final_checkpoints_report_locks_the_job_and_its_eviction_before_the_migration_work(clock: Any) -> None:
    """The report and the tick's release lock in one order (job, eviction, work): no lock-order deadlock."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    node, job, _ = _evicting(clock)
    with CaptureQueriesContext(connection) as report:
        final_checkpoint(node, job, sequence=1, step=300, at=clock.t)
    order = _order_of_locks(report.captured_queries)
    assert order.index("core_job") < order.index("control_eviction") < order.index("control_migrationwork")
    job.refresh_from_db()
    assert job.state == "suspended"


def test_a_release_driven_by_the_tick_locks_the_job_before_its_eviction_and_work(clock: Any) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from portal.control.models import MigrationWork
    from portal.control.reclaim.evict import release
    from portal.core.models import Checkpoint

    node, job, eviction = _evicting(clock)
    ckpt = Checkpoint.objects.create(job=job, sequence=1, node=node, step=300, size_bytes=1000, sha256="e" * 64,
                                     taken_at=clock.t, completed_at=clock.t)
    MigrationWork.objects.filter(migration__job=job).update(restore_sequence=ckpt.sequence)
    with CaptureQueriesContext(connection) as step:
        assert release(eviction.pk)
    assert _order_of_locks(step.captured_queries)[:3] == ["core_job", "control_eviction", "control_migrationwork"]


def test_a_release_decided_on_a_stale_read_is_not_made_when_the_job_showed_use_meanwhile(
        clock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tick read the job idle past its notice; a heartbeat showing use committed before the release: the job
    keeps running (its warning is lifted by the next tick)."""
    from portal.control.loop import loans
    from portal.control.models import Eviction

    node = online_node("lab-a-01")
    job = running_job(node)
    heartbeat(node, job, 4200, 0.0, clock.t)
    beat_for(clock, node, job, 31 * MIN, step=4200, gpu_util=0.0, every_s=30)
    loans.loans_tick(clock.t)  # warned
    beat_for(clock, node, job, 10 * MIN, step=4200, gpu_util=0.0, every_s=30)  # idle to the end of the notice
    stale = loans._running(clock.t)
    clock.advance(10)
    heartbeat(node, job, 4300, 80.0, clock.t)  # it used its GPUs after the tick's read
    monkeypatch.setattr(loans, "_running", lambda now: stale)
    loans.loans_tick(clock.t)
    job.refresh_from_db()
    assert job.state == "running" and not Eviction.objects.filter(job=job).exists()


def test_a_report_read_before_a_new_loan_began_does_not_bring_back_the_old_loans_time(
        clock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A heartbeat batch read the activity row, then a release reset it (a new loan), then the batch wrote: the
    new loan starts from zero, not from the old loan's time plus the gap."""
    from portal.control import activity
    from portal.control.models import JobActivity

    node = online_node("lab-a-01")
    job = running_job(node)
    heartbeat(node, job, 100, 50.0, clock.t)
    clock.advance(10)
    heartbeat(node, job, 110, 50.0, clock.t)
    assert JobActivity.objects.get(job=job).held_s == pytest.approx(10.0)
    stale = activity._known([job.pk])
    JobActivity.objects.filter(job=job).update(busy_at=None, reported_at=None, held_s=0.0)  # what a release does
    monkeypatch.setattr(activity, "_known", lambda job_ids: stale)
    clock.advance(10)
    activity.record_activity({job.pk: (120, 0.0, clock.t)})
    row = JobActivity.objects.get(job=job)
    assert row.held_s == 0.0 and row.reported_at == clock.t and row.busy_at == clock.t


def test_holding_time_adds_the_gaps_between_reports_and_an_older_report_changes_nothing(clock: Any) -> None:
    import datetime as dt

    from portal.control.activity import record_activity
    from portal.control.models import JobActivity

    node = online_node("lab-a-01")
    job = running_job(node)
    start = clock.t
    for s in (0, 10, 20, 80, 90):  # the 60 s gap was not holding (moved, queued)
        record_activity({job.pk: (7, 1.0, start + dt.timedelta(seconds=s))})  # no progress, GPUs quiet
    row = JobActivity.objects.get(job=job)
    assert row.held_s == pytest.approx(30.0)
    assert row.busy_at == start + dt.timedelta(seconds=80)  # the gap restarted the run: its report is use
    record_activity({job.pk: (5, 90.0, start + dt.timedelta(seconds=50))})  # older than the stored report
    row = JobActivity.objects.get(job=job)
    assert (row.held_s, row.step, row.reported_at) == (pytest.approx(30.0), 7, start + dt.timedelta(seconds=90))


def test_the_service_refuses_more_gpus_than_the_class_may_borrow_for_every_caller(clock: Any) -> None:
    from django.core.exceptions import ValidationError

    from portal.core.models import Job, ResearchGroup
    from portal.core.services.jobs import submit_job
    from portal.queue.submit import submit_any
    from tests.loans.helpers import owner

    online_node("lab-a-01", gpus=4)
    user = owner()
    group = ResearchGroup.objects.get(slug="g")
    values = {"name": "big-notebook", "gpu_count": 3, "command": "jupyter lab", "expected_runtime_s": 3600,
              "ckpt_bytes_estimate": 10**9, "priority_class": "interactive"}
    with pytest.raises(ValidationError) as direct:
        submit_job(user, group=group, **values)
    assert "at most 2 GPUs" in direct.value.message_dict["gpu_count"][0]
    with pytest.raises(ValidationError) as queued:
        submit_any(user, group=group, **values)
    assert "at most 2 GPUs" in queued.value.message_dict["gpu_count"][0]
    assert not Job.objects.exists()
    assert submit_job(user, group=group, **values | {"priority_class": "standard"}).gpu_count == 3
