"""Eviction: one job checkpointed and taken off its node (design §15), through a reclaim's own machinery.

A reclaim drains a whole node; an eviction drains one job — for the idle watchdog, the loan timer, or
over-quota preemption — with the same steps (design §1 warn → drain → force, §9.6):

1. :func:`evict_job` — the job moves running → migrating, a ``Migration`` (planned, no reclaim) and its
   ``MigrationWork`` (``checkpointing``) record the move, and the agent is told to write a final checkpoint (the
   reclaim's ``checkpoint final=True`` command, re-sent until acked or the deadline passes); the ``Eviction`` row
   holds the reason, the deadline and what happens next (``then``).
2. :func:`release` — the final checkpoint is recorded: the placement closes (its GPUs are back in the pool), the
   migration waits (``waiting``, like a requeued migration) and the job is ``queued`` (placement resumes it from
   that checkpoint) or ``suspended`` (its owner resumes it: :func:`resume_job`).
3. :func:`force` — the deadline came first: the agent is told to stop the job, the migration is degraded
   (``deadline``) and resumes from the freshest checkpoint a live node holds; the work lost is measured as
   design §9.9 says (the steps since that checkpoint at the run's own pace), and corrected again when it
   restarts.

Each step is claimed once by a conditional UPDATE of ``Eviction.phase`` (draining → released | forced |
superseded), so redoing it does nothing. :func:`drive` — called by every control tick
(``portal.control.loop.loans``) — redoes whatever is due: releases whose checkpoint is recorded, forces whose
deadline passed, closes evictions a reclaim of the node or a cancel overtook (``superseded``), and fails the
waiting migration of a released job that ended without running again. The final checkpoint's report also
releases at once (``portal.control.link.handlers.checkpoint_done``).

**Lock order.** Every path that locks more than one of a job's rows takes them in one order: the ``Job`` row,
then its open ``Eviction``, then the ``MigrationWork``, then the ``JobActivity`` (design §15.4).
:func:`evict_job` locks the job first; :func:`release` and :func:`force` (and so :func:`drive`) lock the job
before the eviction they claim; ``checkpoint_done`` calls :func:`lock_for_final_checkpoint` before it records the
final checkpoint on the ``MigrationWork``. Two of them on the same job therefore queue on the job row instead of
each holding the row the other waits for.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any, Literal

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from portal.control.activity import loan_view
from portal.control.ladder import terms_of
from portal.control.link import commands
from portal.control.models import Eviction, EvictionPhase, JobActivity, LoanEnd, MigrationPhase, MigrationWork
from portal.control.reclaim import lifecycle as migration_lifecycle
from portal.control.reclaim.workflow import (
    close_placement,
    job_groups,
    measured_work_lost_s,
    open_placement,
    publish_after_commit,
)
from portal.core import events, outbox, permissions
from portal.core.campus import freshest_replica, live_node_pks
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.lifecycle.base import ConcurrentTransition, claim_transition
from portal.core.lifecycle.jobs import TERMINAL, JobState
from portal.core.models import Checkpoint, Job, Migration, MigrationMode
from portal.core.services.audit import audit
from scheduler.loans import Action, LoanView, decide
from scheduler.p3 import DSCP

log = logging.getLogger(__name__)

P = EvictionPhase
EVICTION_TRANSITIONS: dict[str, frozenset[str]] = {
    P.DRAINING: frozenset({P.RELEASED, P.FORCED, P.SUPERSEDED}),
    P.RELEASED: frozenset(),
    P.FORCED: frozenset(),
    P.SUPERSEDED: frozenset(),
}
Then = Literal["suspend", "requeue"]


def _claim(eviction_id: int, target: str, **fields: object) -> bool:
    return claim_transition("eviction", EVICTION_TRANSITIONS, Eviction, eviction_id, P.DRAINING, target,
                            {"finished_at": timezone.now(), **fields}, field="phase")


def evict_job(job: Job | int, reason: str, notice_s: float, then: Then = "suspend", *, announce: bool = True,
              now: dt.datetime | None = None, expect: Action | None = None) -> Eviction | None:
    """Start taking ``job`` off its node with a final checkpoint due within ``notice_s`` (module docstring).

    Only a running job with an open placement is evicted (None otherwise, nothing changed); a job already being
    evicted answers its open eviction. ``then``: ``"requeue"`` or ``"suspend"``. ``announce``: emit
    ``job.released`` at the release. ``notice_s`` ≤ 0 forces at once. ``expect``: the loan decision
    (``scheduler.loans.Action``) the caller made from an unlocked read — it is made again from the job's
    ``JobActivity`` row locked FOR UPDATE, and the job is left alone (None) when it changed (it showed use or its
    warning was lifted meanwhile)."""
    if then not in (LoanEnd.SUSPEND, LoanEnd.REQUEUE):
        raise ValueError(f"then must be 'suspend' or 'requeue', not {then!r}")
    now = now or timezone.now()
    job_pk = job.pk if isinstance(job, Job) else int(job)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_pk)
        existing = Eviction.objects.filter(job=job, finished_at__isnull=True).first()
        if existing is not None:
            return existing
        placement = open_placement(job)
        if job.state != JobState.RUNNING or placement is None:
            return None
        if expect is not None and _decided_now(job, now) != expect:
            log.info("job %s: not released (%s): its activity changed since the tick read it", job.pk, reason)
            return None
        notice_s = max(0.0, float(notice_s))
        deadline = now + dt.timedelta(seconds=notice_s)
        job_lifecycle.begin_migration(job)
        mig = Migration.objects.create(job=job, source_id=placement.node_id, mode=MigrationMode.PLANNED,
                                       dscp=DSCP["migration"])
        MigrationWork.objects.create(migration=mig, phase=MigrationPhase.CHECKPOINTING, requested_at=now,
                                     decided_at=now, phase_entered_at=now, phase_deadline_at=deadline,
                                     detail=f"released: {reason}"[:300])
        eviction = Eviction.objects.create(job=job, migration=mig, node_id=placement.node_id, reason=reason[:32],
                                           then=then, announce=announce, requested_at=now, deadline_at=deadline)
        JobActivity.objects.filter(job=job).update(warning="", warned_at=None, release_at=None)
        publish_after_commit(job_groups(job, (placement.node_id,)), "job.state", job_id=job.pk, state=job.state,
                             eviction=reason)
        if notice_s <= 0:
            force(eviction.pk, now=now)
            eviction.refresh_from_db()
        else:
            commands.send(placement.node_id, "checkpoint", ttl_s=notice_s + 1.0, job_id=job.pk, final=True)
        log.info("job %s: released (%s), final checkpoint due within %.0f s", job.pk, reason, notice_s)
        return eviction


def _decided_now(job: Job, now: dt.datetime) -> Action:
    """The loan decision for ``job`` made again from its activity row, locked FOR UPDATE (after the job row: the
    module's lock order), so a heartbeat that showed use after the tick's read is not overruled."""
    activity = JobActivity.objects.select_for_update().filter(job=job).first()
    view = loan_view(activity, now) if activity is not None else LoanView(held_s=0.0, idle_s=None)
    return decide(view, terms_of(job.priority_class).policy).action


def _leave(eviction: Eviction, job: Job, work: MigrationWork, detail: str) -> None:
    """Off the node: placement closed, migration waiting for placement, the job queued or suspended."""
    close_placement(job, f"released: {eviction.reason}"[:32])
    if eviction.then == LoanEnd.REQUEUE:
        job_lifecycle.requeue(job)
    else:
        job_lifecycle.suspend(job)
    Migration.objects.filter(pk=work.migration_id).update(destination=None)
    migration_lifecycle.move(work, MigrationPhase.WAITING, detail=detail)
    JobActivity.objects.filter(job=job).update(warning="", warned_at=None, release_at=None, busy_at=None,
                                               reported_at=None, held_s=0.0)  # a new loan when it runs again
    publish_after_commit(job_groups(job, (eviction.node_id,)), "job.state", job_id=job.pk, state=job.state)


def _locked(eviction_id: int) -> tuple[Eviction, MigrationWork | None, Job] | None:
    """The draining eviction, its migration's work and its job, locked in the module's order (job, eviction,
    work); None when it is no longer draining."""
    job_id = Eviction.objects.filter(pk=eviction_id, phase=P.DRAINING).values_list("job_id", flat=True).first()
    if job_id is None:
        return None
    job = Job.objects.select_for_update().get(pk=job_id)
    eviction = Eviction.objects.select_for_update().filter(pk=eviction_id, phase=P.DRAINING).first()
    if eviction is None:
        return None
    work = (MigrationWork.objects.select_for_update().select_related("migration")
            .filter(migration_id=eviction.migration_id).first())
    return eviction, work, job


def lock_for_final_checkpoint(job_id: int) -> None:
    """Lock the job and its open eviction, if any (the module's lock order), before a final checkpoint's report
    touches the job's ``MigrationWork`` (``portal.control.link.handlers.checkpoint_done``)."""
    Job.objects.select_for_update().filter(pk=job_id).values_list("pk", flat=True).first()
    Eviction.objects.select_for_update().filter(job_id=job_id, phase=P.DRAINING).values_list("pk", flat=True).first()


def _overtaken(eviction: Eviction, work: MigrationWork | None, job: Job) -> bool:
    """The job left this eviction's path meanwhile (a reclaim of its node recovered it, it was cancelled): close
    the eviction without touching the job, and end its migration record if nobody else will."""
    if work is not None and work.phase == MigrationPhase.CHECKPOINTING and job.state == JobState.MIGRATING:
        return False
    if _claim(eviction.pk, P.SUPERSEDED) and work is not None and work.phase == MigrationPhase.CHECKPOINTING:
        migration_lifecycle.move(work, MigrationPhase.FAILED, detail=f"job {job.state} before its release")
        Migration.objects.filter(pk=work.migration_id).update(finished_at=timezone.now(), success=False)
    return True


def release(eviction_id: int) -> bool:
    """The final checkpoint is recorded: take the job off its node (module docstring, step 2), once."""
    with transaction.atomic():
        locked = _locked(eviction_id)
        if locked is None:
            return False
        eviction, work, job = locked
        if _overtaken(eviction, work, job):
            return False
        assert work is not None
        if work.restore_sequence is None or not _claim(eviction.pk, P.RELEASED):
            return False
        Migration.objects.filter(pk=work.migration_id).update(
            checkpoint=job.checkpoints.filter(sequence=work.restore_sequence).first())
        _leave(eviction, job, work, f"released ({eviction.reason}) after its final checkpoint")
        if eviction.announce:
            events.emit("job.released", job=job, node=eviction.node_id, reason=eviction.reason, then=eviction.then,
                        step=job.checkpoints.filter(sequence=work.restore_sequence).values_list(
                            "step", flat=True).first())
        return True


def force(eviction_id: int, now: dt.datetime | None = None) -> bool:
    """The deadline passed with no final checkpoint: stop the job and release it anyway (step 3), once."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = _locked(eviction_id)
        if locked is None:
            return False
        eviction, work, job = locked
        if _overtaken(eviction, work, job) or eviction.deadline_at > now:
            return False
        assert work is not None
        if work.restore_sequence is not None:  # it did arrive; only its release was not driven yet
            return release(eviction_id)
        if not _claim(eviction.pk, P.FORCED):
            return False
        commands.send(eviction.node_id, "stop_job", job_id=job.pk, reason=f"released: {eviction.reason}")
        close_placement(job, f"released: {eviction.reason}"[:32])
        found = freshest_replica(job, None, live_node_pks())
        ckpt = found[0] if found is not None else None
        lost_s = measured_work_lost_s(job, eviction.node_id, ckpt.step if ckpt is not None else 0,
                                      int(job.progress_step)) or 0.0
        Migration.objects.filter(pk=work.migration_id).update(
            mode=MigrationMode.DEGRADED, degraded_reason="deadline", checkpoint=ckpt, work_lost_s=lost_s,
            dscp=DSCP["emergency"])
        Eviction.objects.filter(pk=eviction.pk).update(work_lost_s=lost_s)
        _leave(eviction, job, work, f"released ({eviction.reason}) at its deadline, without a final checkpoint")
        if eviction.announce:
            events.emit("job.released", job=job, node=eviction.node_id, reason=eviction.reason, then=eviction.then,
                        step=ckpt.step if ckpt is not None else None, forced=True, work_lost_s=lost_s)
        return True


def checkpointed(migration_id: int) -> bool:
    """A final checkpoint of this migration was recorded (the agent's report): release at once if it is an
    eviction's (False otherwise, nothing changed)."""
    eviction_id = Eviction.objects.filter(migration_id=migration_id, phase=P.DRAINING).values_list(
        "pk", flat=True).first()
    return eviction_id is not None and release(eviction_id)


def drive(now: dt.datetime | None = None) -> dict[str, int]:
    """Redo every eviction step that is due (one statement when nothing is): releases whose final checkpoint is
    recorded, forces whose deadline passed, evictions a reclaim or a cancel overtook. Each step in its own
    transaction; one that fails is logged and redone by the next tick."""
    now = now or timezone.now()
    due = list(Eviction.objects.filter(phase=P.DRAINING).filter(
        Q(deadline_at__lte=now) | Q(migration__work__restore_sequence__isnull=False)
        | ~Q(migration__work__phase=MigrationPhase.CHECKPOINTING) | ~Q(job__state=JobState.MIGRATING)
        | Q(migration__isnull=True)).values_list("pk", "deadline_at"))
    done = {"released": 0, "forced": 0}
    for eviction_id, deadline_at in due:
        try:
            if deadline_at <= now:
                done["forced"] += int(force(eviction_id, now=now))
            else:
                done["released"] += int(release(eviction_id))
        except Exception:
            log.exception("eviction %s: step failed; the next tick does it again", eviction_id)
    done["closed"] = _close_ended()
    return done


def pending_checks() -> dict[str, QuerySet]:
    """What :func:`drive` looks at, as querysets whose existence says it has something to do: the control
    tick asks for all its steps in one statement (``portal.control.loop.ticks.pending_steps``) and drives only
    when one exists."""
    return {"evictions": Eviction.objects.filter(phase=P.DRAINING), "ended_releases": _ended_releases()}


def _ended_releases() -> QuerySet:
    return MigrationWork.objects.filter(phase=MigrationPhase.WAITING, migration__eviction__isnull=False,
                                        migration__job__state__in=TERMINAL)


def _close_ended() -> int:
    """A released job that ended without running again (a suspended job cancelled): its migration, waiting for
    a placement that will never come, fails (one statement when there is none)."""
    closed = 0
    for work in _ended_releases().select_related("migration"):
        with transaction.atomic():
            try:
                migration_lifecycle.move(work, MigrationPhase.FAILED, detail="the job ended while released")
            except ConcurrentTransition:
                continue
            Migration.objects.filter(pk=work.migration_id).update(finished_at=timezone.now(), success=False)
            closed += 1
    return closed


def can_resume_job(user: Any, job: Job) -> bool:
    """The job's owner or an admin."""
    return permissions.is_admin(user) or (getattr(user, "is_authenticated", False) and job.owner_id == user.pk)


def resume_job(job: Job, actor: Any) -> Job:
    """Its owner takes a ``suspended`` job back (design §15), in one transaction:

    1. check the actor is the job's owner or an admin (others: ``PermissionDenied``);
    2. lock the job row, move it suspended → queued (``InvalidTransition`` from any other state);
    3. its migration, waiting since the release, counts its downtime from now (the suspension was the owner's
       choice, not the portal's);
    4. audit, queue ``control.place_job`` in the outbox, emit ``job.resumed``.

    Placement resumes it from the newest checkpoint a live node holds (the final one written at the release),
    as it resumes any requeued job (``portal.control.loop.ticks.place_on``). Here rather than in
    ``portal.core.services`` because it moves the control plane's migration record (core services import no
    control module, design §9.3)."""
    if actor is not None and not can_resume_job(actor, job):
        raise PermissionDenied("Only the job's owner (or an admin) may resume it.")
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        job_lifecycle.resume(job)
        MigrationWork.objects.filter(migration__job=job, migration__finished_at__isnull=True,
                                     phase=MigrationPhase.WAITING).update(requested_at=timezone.now())
        JobActivity.objects.filter(job=job).update(warning="", warned_at=None, release_at=None, busy_at=None,
                                                   reported_at=None, held_s=0.0)
        audit(actor, "job.resume", job)
        outbox.enqueue(outbox.Task.PLACE_JOB, job.pk)
        step = (Checkpoint.objects.filter(job=job, completed_at__isnull=False).order_by("-sequence")
                .values_list("step", flat=True).first())
        events.emit("job.resumed", job=job, step=step)
        publish_after_commit(job_groups(job), "job.state", job_id=job.pk, state=job.state)
    return job
