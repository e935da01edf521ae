"""The idle watchdog and the loan timer, end to end on the portal (design §15): heartbeats with GPU utilisation
in, control ticks on an injected clock, the agent's final checkpoint, the release, the owner's resume and the
start from that checkpoint."""

from __future__ import annotations

from typing import Any

import pytest

from tests.loans.helpers import (
    beat_for,
    commands_to,
    final_checkpoint,
    handle,
    heartbeat,
    online_node,
    running_job,
    tick,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120), pytest.mark.usefixtures("ladder")]

MIN = 60.0


@pytest.fixture
def notices() -> Any:
    from portal.core import events

    seen: list[Any] = []
    events.DELIVERIES.append(seen.append)
    yield seen
    events.DELIVERIES.remove(seen.append)


def _names(notices: list[Any]) -> list[str]:
    return [n.name for n in notices]


def _state(job: Any) -> str:
    job.refresh_from_db()
    return str(job.state)


def _open_placements(job: Any) -> int:
    from portal.core.models import Placement

    return Placement.objects.filter(job=job, ended_at__isnull=True).count()


def test_an_idle_interactive_job_is_warned_released_at_the_limit_and_resumes_from_its_checkpoint(
        clock: Any, notices: list[Any]) -> None:
    from portal.control.models import Eviction
    from portal.control.reclaim.evict import resume_job
    from portal.core.models import Migration, Placement

    node = online_node("lab-a-01")
    job = running_job(node)
    heartbeat(node, job, 4200, 0.0, clock.t)  # placed: its first report counts as use
    beat_for(clock, node, job, 29 * MIN, step=4200, gpu_util=1.0, every_s=30)  # 29 min at 1 %, no step
    tick(clock)
    assert "job.idle_warning" not in _names(notices)  # under the 30 min idle limit: nothing yet

    beat_for(clock, node, job, 2 * MIN, step=4200, gpu_util=0.0, every_s=30)
    tick(clock)
    warning = [n for n in notices if n.name == "job.idle_warning"]
    assert len(warning) == 1 and "has not used its GPUs for 31 min" in warning[0].text
    assert "released at 09:41" in warning[0].text  # 10 min of notice from 09:31
    assert _state(job) == "running" and commands_to(node, "checkpoint") == []

    beat_for(clock, node, job, 10 * MIN, step=4200, gpu_util=0.0, every_s=30)  # idle to the end of the notice
    tick(clock)
    assert _state(job) == "migrating"
    assert commands_to(node, "checkpoint") == [
        {**commands_to(node, "checkpoint")[0], "job_id": job.pk, "final": True}]
    eviction = Eviction.objects.get(job=job)
    assert (eviction.reason, eviction.then, eviction.phase) == ("idle", "suspend", "draining")

    clock.advance(5)
    final_checkpoint(node, job, sequence=1, step=4200, at=clock.t)  # the agent's report releases it at once
    assert _state(job) == "suspended"
    assert _open_placements(job) == 0  # its GPU is back in the pool
    assert Placement.objects.get(job=job).end_reason == "released: idle"
    eviction.refresh_from_db()
    assert eviction.phase == "released" and eviction.work_lost_s == 0.0
    released = [n for n in notices if n.name == "job.released"]
    assert len(released) == 1 and "checkpointed at step 4200 and released from lab-a-01" in released[0].text
    handle(node, "job_exited", job_id=job.pk, returncode=85, step=4200, result={}, reason="checkpointed")
    tick(clock)
    assert _state(job) == "suspended" and _open_placements(job) == 0  # nobody places a suspended job

    clock.advance(3600)  # an hour later its owner resumes it
    resume_job(job, job.owner)
    assert "job.resumed" in _names(notices)
    assert _state(job) == "queued" or _state(job) == "running"
    starts = commands_to(node, "start_job")
    assert starts and starts[-1]["restore_sequence"] == 1 and starts[-1]["job_id"] == job.pk
    handle(node, "job_started", job_id=job.pk, restored_sequence=1, restored_step=4200)
    assert _state(job) == "running"
    mig = Migration.objects.get(job=job)
    assert mig.finished_at is not None and mig.success and mig.work_lost_s == 0.0
    assert mig.downtime_s is not None and mig.downtime_s < 60  # counted from the resume, not the release


def test_a_busy_job_is_never_touched(clock: Any, notices: list[Any]) -> None:
    node = online_node("lab-a-01")
    gpu_bound = running_job(node, name="gpu-bound")
    heartbeat(node, gpu_bound, 0, 97.0, clock.t)
    for _ in range(3):  # 45 min past the idle limit and the notice: no step reported, its GPU busy
        beat_for(clock, node, gpu_bound, 15 * MIN, step=0, gpu_util=97.0, every_s=30)
        tick(clock)
    assert _state(gpu_bound) == "running" and commands_to(node, "checkpoint") == []
    assert not {"job.idle_warning", "job.released"} & set(_names(notices))


def test_a_job_making_progress_is_busy_though_its_gpus_are_quiet(clock: Any, notices: list[Any]) -> None:
    node = online_node("lab-a-01")
    cpu_phase = running_job(node, name="preprocessing")
    heartbeat(node, cpu_phase, 10, 0.0, clock.t)
    for _ in range(3):
        beat_for(clock, node, cpu_phase, 15 * MIN, step=10, gpu_util=0.0, every_s=30, step_per_beat=5)
        tick(clock)
    assert _state(cpu_phase) == "running"
    assert "job.idle_warning" not in _names(notices)


def test_a_class_the_watchdog_never_touches_keeps_its_idle_job(clock: Any, notices: list[Any]) -> None:
    from portal.control.models import ClassPolicy

    ClassPolicy.objects.filter(priority_class="interactive").update(idle_watch=False)
    node = online_node("lab-a-01")
    job = running_job(node)
    heartbeat(node, job, 1, 0.0, clock.t)
    for _ in range(3):
        beat_for(clock, node, job, 15 * MIN, step=1, gpu_util=0.0, every_s=30)
        tick(clock)
    assert _state(job) == "running" and commands_to(node, "checkpoint") == []
    assert "job.idle_warning" not in _names(notices)


def test_an_idle_warning_is_lifted_when_the_job_uses_its_gpus_again(clock: Any, notices: list[Any]) -> None:
    from portal.control.models import JobActivity

    node = online_node("lab-a-01")
    job = running_job(node)
    heartbeat(node, job, 7, 0.0, clock.t)
    beat_for(clock, node, job, 31 * MIN, step=7, gpu_util=0.0, every_s=30)
    tick(clock)
    assert JobActivity.objects.get(job=job).warning == "idle"
    beat_for(clock, node, job, 2 * MIN, step=7, gpu_util=60.0, every_s=30)  # someone came back to it
    tick(clock)
    assert JobActivity.objects.get(job=job).warning == ""
    beat_for(clock, node, job, 10 * MIN, step=7, gpu_util=60.0, every_s=30)
    tick(clock)
    assert _state(job) == "running"


def test_a_job_past_its_loan_is_warned_then_released(clock: Any, notices: list[Any]) -> None:
    """A busy standard job at the end of its loan is released too (the loan is not the idle rule), and a
    standard job goes back to the queue (its class's loan_end) rather than waiting for its owner."""
    from portal.control.models import ClassPolicy, Eviction

    ClassPolicy.objects.filter(priority_class="standard").update(max_loan_s=30 * MIN, notice_s=10 * MIN,
                                                                 grace_s=5 * MIN)
    node = online_node("lab-a-01")
    job = running_job(node, priority_class="standard", name="bert-finetune")
    heartbeat(node, job, 0, 90.0, clock.t)
    step = beat_for(clock, node, job, 15 * MIN, step=0, gpu_util=90.0, every_s=30, step_per_beat=10)
    tick(clock)
    assert "job.loan_ending" not in _names(notices)  # 15 min held, 15 min left: more than the notice
    step = beat_for(clock, node, job, 6 * MIN, step=step, gpu_util=90.0, every_s=30, step_per_beat=10)
    tick(clock)
    ending = [n for n in notices if n.name == "job.loan_ending"]
    assert len(ending) == 1 and "end of its 30 min loan" in ending[0].text
    assert "back to the queue" in ending[0].text
    assert _state(job) == "running"
    step = beat_for(clock, node, job, 10 * MIN, step=step, gpu_util=90.0, every_s=30, step_per_beat=10)
    tick(clock)
    assert _state(job) == "migrating"
    eviction = Eviction.objects.get(job=job)
    assert (eviction.reason, eviction.then) == ("loan", "requeue")
    final_checkpoint(node, job, sequence=1, step=step, at=clock.t)
    assert _state(job) == "queued" and _open_placements(job) == 0
    tick(clock)  # requeued: placement resumes it from that checkpoint
    assert commands_to(node, "start_job")[-1]["restore_sequence"] == 1


def test_an_eviction_whose_release_step_was_lost_is_released_by_the_next_tick(clock: Any) -> None:
    """The final checkpoint is recorded but the step that releases the job never ran (the worker died after
    the report committed): the tick finds it and releases, once."""
    from portal.control.models import Eviction, MigrationWork
    from portal.control.reclaim.evict import evict_job
    from portal.core.models import Checkpoint

    node = online_node("lab-a-01")
    job = running_job(node)
    heartbeat(node, job, 300, 50.0, clock.t)
    eviction = evict_job(job, "idle", 120.0, "suspend")
    assert eviction is not None and evict_job(job, "idle", 120.0, "suspend") == eviction  # idempotent
    clock.advance(10)
    ckpt = Checkpoint.objects.create(job=job, sequence=1, node=node, step=300, size_bytes=1000, sha256="e" * 64,
                                     taken_at=clock.t, completed_at=clock.t)
    MigrationWork.objects.filter(migration__job=job).update(restore_sequence=ckpt.sequence)  # release lost
    assert _state(job) == "migrating"
    tick(clock)
    assert _state(job) == "suspended" and _open_placements(job) == 0
    assert Eviction.objects.get(pk=eviction.pk).phase == "released"
    tick(clock)
    assert Eviction.objects.get(pk=eviction.pk).phase == "released"


def test_an_eviction_with_no_final_checkpoint_is_forced_at_its_deadline_and_its_work_lost_measured(
        clock: Any, notices: list[Any]) -> None:
    import datetime as dt

    from portal.control.models import Eviction
    from portal.control.reclaim.evict import evict_job
    from portal.core.models import Checkpoint, Migration, Placement

    node = online_node("lab-a-01")
    job = running_job(node)
    started = clock.t
    Placement.objects.filter(job=job).update(started_at=started)
    for seq, step in ((1, 100), (2, 200)):  # 0.1 s per step
        at = started + dt.timedelta(seconds=step / 10)
        Checkpoint.objects.create(job=job, sequence=seq, node=node, step=step, size_bytes=1000, sha256="e" * 64,
                                  taken_at=at, completed_at=at)
    clock.advance(25)
    heartbeat(node, job, 250, 0.0, clock.t)
    eviction = evict_job(job, "idle", 120.0, "suspend")
    clock.advance(60)
    tick(clock)
    assert _state(job) == "migrating"  # inside the grace
    clock.advance(61)
    tick(clock)
    assert _state(job) == "suspended" and _open_placements(job) == 0
    assert commands_to(node, "stop_job")[-1]["job_id"] == job.pk
    eviction = Eviction.objects.get(pk=eviction.pk)
    assert eviction.phase == "forced"
    assert eviction.work_lost_s == pytest.approx((250 - 200) * 0.1, rel=0.01)
    mig = Migration.objects.get(job=job)
    assert mig.degraded_reason == "deadline" and mig.checkpoint.sequence == 2
    released = [n for n in notices if n.name == "job.released"][-1]
    assert "no final checkpoint in time" in released.text and "resume from step 200" in released.text


def test_a_cancelled_job_being_released_closes_its_eviction(clock: Any) -> None:
    from portal.control.models import Eviction, MigrationWork
    from portal.control.reclaim.evict import evict_job
    from portal.core.services.jobs import cancel_job

    node = online_node("lab-a-01")
    job = running_job(node)
    eviction = evict_job(job, "idle", 120.0, "suspend")
    cancel_job(job, job.owner)
    tick(clock)
    assert Eviction.objects.get(pk=eviction.pk).phase == "superseded"
    assert MigrationWork.objects.get(migration__job=job).phase == "failed"


def test_a_suspended_job_cancelled_by_its_owner_ends_its_waiting_migration(clock: Any) -> None:
    from portal.control.models import MigrationWork
    from portal.control.reclaim.evict import evict_job
    from portal.core.models import Migration
    from portal.core.services.jobs import cancel_job

    node = online_node("lab-a-01")
    job = running_job(node)
    evict_job(job, "idle", 120.0, "suspend")
    final_checkpoint(node, job, sequence=1, step=10, at=clock.t)
    assert _state(job) == "suspended" and MigrationWork.objects.get(migration__job=job).phase == "waiting"
    cancel_job(job, job.owner)
    tick(clock)
    assert MigrationWork.objects.get(migration__job=job).phase == "failed"
    assert Migration.objects.get(job=job).finished_at is not None
