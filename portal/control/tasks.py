"""Celery tasks of the control plane (design §1-§4). JSON arguments (ids only), late acks, idempotent bodies.

Each task re-reads its rows and claims its work with conditional updates (``ReclaimWork`` columns,
``MigrationWork.phase`` under ``select_for_update``, lifecycle ``UPDATE … WHERE state = …``), so a redelivered
or duplicated task does nothing twice. Lost races (``ConcurrentTransition``) are retried with backoff + jitter.
"""

from __future__ import annotations

import logging

import celery
from celery import shared_task
from django.db import OperationalError, transaction

from portal.control import reserve
from portal.control.link import commands
from portal.control.loop import housekeeping as tables
from portal.control.loop import reconcile as reconciler
from portal.control.loop import ticks
from portal.control.reclaim import apply as reclaim_flow
from portal.control.reclaim import workflow
from portal.control.state import lock_allocation
from portal.core.lifecycle.base import ConcurrentTransition
from portal.core.lifecycle.jobs import JobState
from portal.core.models import Job, Placement
from portal.core.outbox import Task

log = logging.getLogger(__name__)

RETRY = {
    "acks_late": True,
    "autoretry_for": (ConcurrentTransition, OperationalError),
    "retry_backoff": 0.2,
    "retry_backoff_max": 5,
    "retry_jitter": True,
    "max_retries": 5,
}


class ControlTick(celery.Task):
    """The tick's task class: each worker process keeps its tick context on its task instance (its copy of the
    estimator state, a shortcut only — design §9.5 — and when the worker started)."""

    context = ticks.TickContext()


@shared_task(name="control.tick", ignore_result=True, bind=True, base=ControlTick, **RETRY)
def control_tick(self: ControlTick) -> dict[str, int]:
    """Every control period (beat): estimators, lost heartbeats, deadlines, P1 intervals, placement, releases."""
    return ticks.control_tick(context=self.context)


@shared_task(name="control.housekeeping", ignore_result=True, **RETRY)
def housekeeping() -> dict[str, int]:
    """Every ten minutes (beat): roll up bandwidth samples, prune old decision logs (design §9.8)."""
    return tables.housekeeping()


@shared_task(name="control.calibrate_reserves", ignore_result=True, **RETRY)
def calibrate_reserves() -> dict[str, int]:
    """Daily (beat, ``evaluation`` queue): B_min per link from 7 days of research traffic (design §4)."""
    return reserve.calibrate_reserves()


@shared_task(name="control.reconcile", ignore_result=True, **RETRY)
def reconcile() -> dict[str, int]:
    """Every few seconds (beat): queue again the steps whose task was lost (design §9.6)."""
    return reconciler.reconcile()


@shared_task(name=Task.PLACE_JOB, ignore_result=True, **RETRY)
def place_job(job_id: int) -> str:
    """A submit's placement: joins the pending placement pass, or queues one (design §10)."""
    return ticks.request_placement(job_id)


@shared_task(name=Task.PLACE_QUEUED, ignore_result=True, **RETRY)
def place_queued() -> int:
    """One placement pass: every queued job, in queue order, on one campus read."""
    return ticks.placement_pass()


@shared_task(name=Task.RUN_RECLAIM, ignore_result=True, **RETRY)
def run_reclaim(reclaim_id: int) -> str:
    """Plan a reclaim once; a scheduled one also queues its deadline (durable in the outbox; the tick
    re-checks due deadlines too). An emergency's kill-switch is committed first, before the allocation lock."""
    sent = reclaim_flow.send_kill_switch_first(reclaim_id)
    with transaction.atomic():
        lock_allocation()
        return reclaim_flow.run_reclaim(reclaim_id, kill_switch_sent=sent)


@shared_task(name=Task.ENFORCE_DEADLINE, ignore_result=True, **RETRY)
def enforce_deadline(reclaim_id: int) -> str:
    return reclaim_flow.enforce_deadline(reclaim_id)  # sends the kill-switch before its own transaction


@shared_task(name=Task.ADVANCE_MIGRATION, ignore_result=True, **RETRY)
def advance_migration(migration_id: int) -> str:
    with transaction.atomic():
        lock_allocation()
        result = workflow.advance(migration_id)
        for reclaim_id in reclaim_flow.draining_reclaims():
            reclaim_flow.release(reclaim_id)
    return result


@shared_task(name=Task.RELEASE_RECLAIMS, ignore_result=True, **RETRY)
def release_reclaims() -> None:
    ticks.release_finished()


@shared_task(name=Task.PRESYNC_CHECKPOINT, ignore_result=True, **RETRY)
def presync_checkpoint(checkpoint_id: int) -> str:
    return ticks.presync(checkpoint_id)


@shared_task(name=Task.RECOVER_LOST_JOBS, ignore_result=True, **RETRY)
def recover_lost_jobs(node_id: int, job_ids: list[int]) -> int:
    """The agent came back without jobs the portal placed on it (it restarted): recover them from replicas."""
    recovered = 0
    with transaction.atomic():
        for job in Job.objects.select_for_update().filter(pk__in=job_ids, state=JobState.RUNNING):
            placement = Placement.objects.filter(job=job, ended_at__isnull=True, node_id=node_id).first()
            if placement is None:
                continue
            workflow.recover_from_replica(job, node_id, None, "agent restarted")
            recovered += 1
    return recovered


@shared_task(name=Task.STOP_CANCELLED_JOB, ignore_result=True, **RETRY)
def stop_cancelled_job(job_id: int) -> bool:
    """A cancelled job is stopped on the node of its latest placement."""
    placement = Placement.objects.filter(job_id=job_id).order_by("-started_at", "-id").first()
    if placement is None:
        return False
    with transaction.atomic():
        commands.send(placement.node_id, "stop_job", job_id=job_id, reason="cancelled")
    return True


@shared_task(name=Task.NODE_LENT_AGAIN, ignore_result=True, **RETRY)
def node_lent_again(node_id: int) -> None:
    """Lift the agent's kill-switch; the node comes online at its next heartbeat."""
    with transaction.atomic():
        commands.send(node_id, "killswitch", engaged=False)
