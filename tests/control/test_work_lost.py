"""Recorded work lost is the progress really thrown away (design §9.9): (the old run's last step − the step
resumed from) × the old run's seconds per step — whatever the time between the loss and the restart.

Each test builds a run whose checkpoints say 0.1 s per step, loses it in one of the ways tests/chaos found
misrecorded, restarts it from a replica on the holder and checks ``work_lost_s`` against the steps redone.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pytest
from control_helpers import make_node, make_running_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

SHA = "d" * 64
STEP_S = 0.1  # the runs below checkpoint 100 steps every 10 s
_ids = itertools.count()


def _handle(node: Any, kind: str, **fields: Any) -> None:
    from portal.control.link.handlers import handle

    handle(node.pk, kind, {"type": kind, "msg_id": f"m-{next(_ids)}", **fields})


def _online(name: str, building: str = "A") -> Any:
    """A node whose agent is connected (open session with a data address) and said hello with no jobs."""
    from portal.control.link.handlers import hello, open_session

    node, _ = make_node(name, building)
    session = open_session(node.pk, f"chan-{name}", "127.0.0.1")
    hello(node.pk, session, {"type": "hello", "agent_version": "t", "gpus": [], "data_host": "127.0.0.1",
                             "data_port": 9000 + node.pk, "jobs": []})
    return node


def _heartbeat(node: Any, job: Any, step: int) -> None:
    _handle(node, "heartbeat", seq=1, gpu_util=[], egress={}, jobs=[{"job_id": job.pk, "step": step}])


def _run(job: Any, node: Any, started_s_ago: float, checkpoints: list[tuple[int, int, float]],
         holder: Any) -> None:
    """Backdate ``job``'s open placement on ``node`` and give the run ``checkpoints`` (sequence, step, seconds
    after the run started), each replicated to ``holder``."""
    from django.utils import timezone

    from portal.core.models import Checkpoint, Placement

    started = timezone.now() - dt.timedelta(seconds=started_s_ago)
    Placement.objects.filter(job=job, node=node, ended_at__isnull=True).update(started_at=started)
    for sequence, step, after_s in checkpoints:
        ckpt = Checkpoint.objects.create(job=job, sequence=sequence, node=node, step=step, size_bytes=1000,
                                         sha256=SHA, taken_at=started + dt.timedelta(seconds=after_s),
                                         completed_at=timezone.now())
        ckpt.replica_nodes.add(holder)


def _started_on(node: Any, job: Any, sequence: int, step: int) -> Any:
    """The destination's agent reports the job started from checkpoint ``sequence`` (at ``step``)."""
    from portal.core.models import Migration, Placement

    assert Placement.objects.get(job=job, ended_at__isnull=True).node_id == node.pk
    _handle(node, "job_started", job_id=job.pk, restored_sequence=sequence, restored_step=step)
    return Migration.objects.filter(job=job).order_by("-started_at", "-pk").first()


def _lose_node(node: Any) -> None:
    """``node``'s heartbeat stops for longer than the timeout; the tick declares it lost."""
    from django.utils import timezone

    from portal.control.loop.ticks import control_tick
    from portal.core.models import Node

    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - dt.timedelta(seconds=3600))
    control_tick()


def test_a_job_forced_at_the_deadline_loses_the_steps_it_ran_after_its_last_replica_until_the_deadline() -> None:
    from django.utils import timezone

    from portal.control.loop.ticks import control_tick
    from portal.core.models import Job, ReclaimEvent
    from portal.core.services.reclaims import request_reclaim

    src, holder = _online("src"), _online("holder")
    job = make_running_job(src)
    _run(job, src, 60.0, [(1, 100, 10.0), (2, 200, 20.0)], holder)
    reclaim = request_reclaim(src, None, 30.0)
    assert Job.objects.get(pk=job.pk).state == "migrating"  # the final checkpoint is asked for ...
    _heartbeat(src, job, 290)  # ... and never comes: the job runs on past the request
    ReclaimEvent.objects.filter(pk=reclaim.pk).update(deadline_at=timezone.now())
    control_tick()  # forced: resumes from the replica on the holder
    _handle(src, "job_exited", job_id=job.pk, returncode=-9, step=300, result={}, reason="reclaim deadline")
    mig = _started_on(holder, job, 2, 200)
    assert mig.degraded_reason == "deadline" and mig.checkpoint.step == 200
    assert mig.work_lost_s == pytest.approx((300 - 200) * STEP_S, rel=0.01)


def test_an_agent_killed_and_back_later_records_the_steps_lost_not_its_downtime() -> None:
    from portal.control.link.handlers import hello

    src, holder = _online("src"), _online("holder")
    job = make_running_job(src)
    _run(job, src, 60.0, [(1, 100, 10.0), (2, 200, 20.0)], holder)
    _heartbeat(src, job, 260)  # the last report before the agent was killed, 35 s before it came back
    hello(src.pk, None, {"type": "hello", "agent_version": "t", "gpus": [], "data_host": "127.0.0.1",
                         "data_port": 9000 + src.pk, "jobs": []})  # back, without the job
    _heartbeat(holder, job, 999)  # a stale progress file there, before the start is reported: not the old run's
    mig = _started_on(holder, job, 2, 200)
    assert mig.degraded_reason == "agent restarted"
    assert mig.work_lost_s == pytest.approx((260 - 200) * STEP_S, rel=0.01)


def _moved_then_lost() -> tuple[Any, Any, Any]:
    """A job that ran on ``a``, moved to ``b`` (10 s down), ran there from step 200 to 430, and lost ``b``'s
    heartbeat; it resumes on ``holder`` from step 400. Returns (b, holder, job)."""
    from django.utils import timezone

    from portal.core.models import Checkpoint, Migration, MigrationMode, Placement

    a, b, holder = _online("a"), _online("b"), _online("holder")
    job = make_running_job(a)
    _run(job, a, 80.0, [(1, 100, 10.0), (2, 200, 20.0)], holder)
    now = timezone.now()
    Placement.objects.filter(job=job, node=a).update(ended_at=now - dt.timedelta(seconds=58),
                                                     end_reason="migrated")
    Migration.objects.create(job=job, source=a, destination=b, mode=MigrationMode.PLANNED,
                             checkpoint=Checkpoint.objects.get(job=job, sequence=2), success=True,
                             finished_at=now - dt.timedelta(seconds=48))
    Placement.objects.create(job=job, node=b, gpu_indices=[0])
    _run(job, b, 48.0, [(3, 300, 10.0), (4, 400, 20.0)], holder)
    _heartbeat(b, job, 430)
    _lose_node(b)
    return b, holder, job


def test_a_heartbeat_lost_after_an_earlier_move_records_the_steps_since_the_replica_not_its_age() -> None:
    _, holder, job = _moved_then_lost()
    mig = _started_on(holder, job, 4, 400)
    assert mig.degraded_reason == "heartbeat_lost" and mig.checkpoint.step == 400
    assert mig.work_lost_s == pytest.approx((430 - 400) * STEP_S, rel=0.01)


def test_a_late_job_exited_from_the_old_node_corrects_the_work_lost_to_its_final_step() -> None:
    from portal.core.models import Migration

    b, holder, job = _moved_then_lost()
    mig = _started_on(holder, job, 4, 400)
    assert mig.work_lost_s == pytest.approx((430 - 400) * STEP_S, rel=0.01)
    # The cut heals: b's agent reports the run it stopped, which had got to step 470.
    _handle(b, "job_exited", job_id=job.pk, returncode=-9, step=470, result={}, reason="not placed here")
    assert Migration.objects.get(pk=mig.pk).work_lost_s == pytest.approx((470 - 400) * STEP_S, rel=0.01)
    _handle(b, "job_exited", job_id=job.pk, returncode=-1, step=0, result={}, reason="exited")
    assert Migration.objects.get(pk=mig.pk).work_lost_s == pytest.approx((470 - 400) * STEP_S, rel=0.01)


def test_a_run_with_one_checkpoint_takes_the_step_time_from_the_jobs_other_runs_never_across_a_move() -> None:
    from django.utils import timezone

    from portal.core.models import Checkpoint, Migration, MigrationMode, Placement

    a, b, holder = _online("a"), _online("b"), _online("holder")
    job = make_running_job(a)
    _run(job, a, 80.0, [(1, 100, 10.0), (2, 200, 20.0)], holder)
    now = timezone.now()
    Placement.objects.filter(job=job, node=a).update(ended_at=now - dt.timedelta(seconds=58),
                                                     end_reason="migrated")
    Migration.objects.create(job=job, source=a, destination=b, mode=MigrationMode.PLANNED,
                             checkpoint=Checkpoint.objects.get(job=job, sequence=2), success=True,
                             finished_at=now - dt.timedelta(seconds=48))
    Placement.objects.create(job=job, node=b, gpu_indices=[0])
    _run(job, b, 48.0, [(3, 300, 10.0)], holder)  # one checkpoint: 100 steps in 30 s across the move
    _heartbeat(b, job, 330)
    _lose_node(b)
    mig = _started_on(holder, job, 3, 300)
    assert mig.work_lost_s == pytest.approx((330 - 300) * STEP_S, rel=0.01)
