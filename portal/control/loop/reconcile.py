"""The reconciler (design §9.6): redo the steps whose owner died or whose task was lost.

Progress lives in the lifecycle tables, each state with the time it was entered and its deadline; a step is
overdue when its state outlived the time its task needs. The reconciler queues that step's task again through
the outbox. Every step claims its own work (§8), so a redo of a step that was only slow does nothing:

- a reclaim still ``requested`` after PLAN_TIMEOUT_S (or with no work row at all, its task never ran): plan it;
- a migration whose facts are recorded but whose phase did not move within STEP_GRACE_S — the final checkpoint
  is known but it is still ``checkpointing``, or its transfer was received or failed but it is still
  ``transferring``: advance it.

- an agent command still unacknowledged past its next send time (design §9.9): send it again to its node, each
  time waiting longer (3 s doubling to 30 s), until it is acked, superseded or expires.

Each redo counts in the state's ``phase_attempts`` and pushes its deadline out by the same timeout, so a step
that keeps failing is retried at that pace rather than every pass.
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone

from portal.control.link import commands
from portal.control.models import (
    MigrationPhase,
    MigrationWork,
    ReclaimPhase,
    ReclaimWork,
    Transfer,
    TransferState,
)
from portal.control.reclaim.lifecycle import PLAN_TIMEOUT_S
from portal.core import outbox
from portal.core.models import ReclaimEvent
from portal.core.outbox import Task

STEP_GRACE_S = 15.0  # a recorded fact the migration has not acted on within this long: its advance was lost


def reconcile(now: dt.datetime | None = None) -> dict[str, int]:
    """One pass; returns how many steps of each kind were queued again."""
    now = now or timezone.now()
    plan_cutoff = now - dt.timedelta(seconds=PLAN_TIMEOUT_S)
    step_cutoff = now - dt.timedelta(seconds=STEP_GRACE_S)
    # Reclaims: the work row is created when the plan task first runs, so "no row" means it never ran.
    overdue = list(ReclaimWork.objects.filter(phase=ReclaimPhase.REQUESTED, phase_deadline_at__lt=now,
                                              reclaim__finished_at__isnull=True).values_list("reclaim_id", flat=True))
    never_ran = list(ReclaimEvent.objects.filter(finished_at__isnull=True, requested_at__lt=plan_cutoff)
                     .exclude(Exists(ReclaimWork.objects.filter(reclaim=OuterRef("pk"))))
                     .values_list("pk", flat=True))
    for reclaim_id in overdue + never_ran:
        outbox.enqueue(Task.RUN_RECLAIM, reclaim_id)
    if overdue:
        _push_deadline(ReclaimWork.objects.filter(reclaim_id__in=overdue), now, PLAN_TIMEOUT_S)
    # Migrations whose next step's fact is recorded but which did not move.
    finished = Transfer.objects.filter(migration=OuterRef("migration"), finished_at__lt=step_cutoff,
                                       state__in=[TransferState.RECEIVED, TransferState.FAILED])
    in_flight = Transfer.objects.filter(migration=OuterRef("migration"), state=TransferState.ISSUED)
    stuck = MigrationWork.objects.filter(phase_entered_at__lt=step_cutoff).filter(
        (Q(phase=MigrationPhase.TRANSFERRING) & Exists(finished) & ~Exists(in_flight))
        | Q(phase=MigrationPhase.CHECKPOINTING, restore_sequence__isnull=False))
    stuck_ids = list(stuck.values_list("migration_id", flat=True))
    for migration_id in stuck_ids:
        outbox.enqueue(Task.ADVANCE_MIGRATION, migration_id)
    if stuck_ids:
        _push_deadline(MigrationWork.objects.filter(migration_id__in=stuck_ids), now, STEP_GRACE_S,
                       entered=True)
    resent = commands.resend_due(now)
    return {"reclaims": len(overdue) + len(never_ran), "migrations": len(stuck_ids), "commands": resent}


def _push_deadline(rows: QuerySet, now: dt.datetime, seconds: float, *, entered: bool = False) -> None:
    """Bookkeeping of a redo (not a move): one more attempt, the next one not before ``seconds`` from now."""
    fields = {"phase_attempts": F("phase_attempts") + 1, "phase_deadline_at": now + dt.timedelta(seconds=seconds)}
    if entered:  # migrations are judged by when they entered the phase: count the wait from now
        fields["phase_entered_at"] = now
    rows.update(**fields)
