"""The reclaim, migration and transfer lifecycles: the only code that moves ``ReclaimWork.phase``,
``MigrationWork.phase`` and ``Transfer.state`` (design §1 warn → drain → force, §9.6; jobs and nodes have theirs
in ``portal.core.lifecycle``).

A reclaim moves through::

    requested ─┬─> planned ─┬─> released   (drained before its deadline)
               │            └─> forced     (the deadline came first)
               ├─> recovered               (no notice: every job resumed from its replica at once)
               └─> forced                  (its deadline passed before it was planned)

Each step is claimed by moving the phase (first caller wins, the others get False): planning, releasing and
forcing each happen once however often their tasks are delivered. ``requested`` must be left within
PLAN_TIMEOUT_S, ``planned`` by the reclaim's own deadline.

A migration moves through::

    checkpointing ─┬─> transferring ─┬─> starting ──> done
                   │                 │       │
    waiting <──────┴─────────────────┴───────┘   (no destination now, a start that timed out)
       └─> transferring | starting | done (restarted from scratch: nothing was copied off)
    any unfinished phase ──> failed (the job ended while moving)

``transferring`` and ``waiting`` may be re-entered (a copy re-issued from another replica, a second placement
attempt); ``phase_attempts`` counts that. Each move records when the phase began and its deadline
(``PHASE_TIMEOUT_S``; None where another deadline governs), which is what a reconciler walks. A move the table
does not allow raises ``InvalidTransition``; a row another worker moved first raises ``ConcurrentTransition``;
either way nothing changes.

A transfer is ``issued`` and then, once, ``received`` or ``failed``: the first report (or the expiry)
wins, later ones change nothing.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from portal.control.models import (
    MigrationPhase,
    MigrationWork,
    ReclaimPhase,
    ReclaimWork,
    Transfer,
    TransferState,
)
from portal.core.lifecycle.base import apply_transition, claim_transition

P = MigrationPhase
UNFINISHED = (P.CHECKPOINTING, P.WAITING, P.TRANSFERRING, P.STARTING)

MIGRATION_TRANSITIONS: dict[str, frozenset[str]] = {
    P.CHECKPOINTING: frozenset({P.TRANSFERRING, P.STARTING, P.WAITING, P.FAILED}),
    P.TRANSFERRING: frozenset({P.TRANSFERRING, P.STARTING, P.WAITING, P.FAILED}),
    P.WAITING: frozenset({P.WAITING, P.TRANSFERRING, P.STARTING, P.DONE, P.FAILED}),
    P.STARTING: frozenset({P.DONE, P.WAITING, P.FAILED}),
    P.DONE: frozenset(),
    P.FAILED: frozenset(),
}

# How long a phase may last before it is redone or given up (None: governed elsewhere — checkpointing by the
# reclaim deadline, transferring by the transfer token's expiry, waiting by placement).
START_TIMEOUT_S = 30.0
PHASE_TIMEOUT_S: dict[str, float | None] = {
    P.CHECKPOINTING: None, P.TRANSFERRING: None, P.WAITING: None, P.STARTING: START_TIMEOUT_S,
    P.DONE: None, P.FAILED: None,
}

# The progress columns a move persists together with the phase (what the step decided in memory).
PROGRESS_FIELDS = ("restore_sequence", "ckpt_holder_id", "p2_decision_id", "p3_decision_id", "decided_at",
                   "checkpointed_at", "transferred_at", "resumed_at", "detail")

R = ReclaimPhase
RECLAIM_TRANSITIONS: dict[str, frozenset[str]] = {
    R.REQUESTED: frozenset({R.PLANNED, R.RECOVERED, R.FORCED}),
    R.PLANNED: frozenset({R.RELEASED, R.FORCED}),
    R.RECOVERED: frozenset(),
    R.RELEASED: frozenset(),
    R.FORCED: frozenset(),
}
PLAN_TIMEOUT_S = 30.0
RECLAIM_STAMP = {R.PLANNED: "planned_at", R.RECOVERED: "planned_at", R.RELEASED: "released_at",
                 R.FORCED: "forced_at"}

TRANSFER_TRANSITIONS: dict[str, frozenset[str]] = {
    TransferState.ISSUED: frozenset({TransferState.RECEIVED, TransferState.FAILED}),
    TransferState.RECEIVED: frozenset(),
    TransferState.FAILED: frozenset(),
}


def can_move(work: MigrationWork, target: str) -> bool:
    return target in MIGRATION_TRANSITIONS.get(work.phase, frozenset())


def move(work: MigrationWork, target: str, **fields: Any) -> None:
    """Move ``work`` to phase ``target``, persisting its in-memory progress and ``fields`` in the same
    conditional UPDATE (``WHERE phase = <its phase>``)."""
    now = timezone.now()
    for name, value in fields.items():
        setattr(work, name, value)
    timeout_s = PHASE_TIMEOUT_S.get(target)
    extra = {name: getattr(work, name) for name in PROGRESS_FIELDS}
    extra.update(
        phase_entered_at=now,
        phase_deadline_at=now + dt.timedelta(seconds=timeout_s) if timeout_s is not None else None,
        phase_attempts=work.phase_attempts + 1 if target == work.phase else 0,
    )
    if "detail" in extra:
        extra["detail"] = str(extra["detail"])[:300]
    apply_transition("migration", MIGRATION_TRANSITIONS, work, target, extra, field="phase")


def reclaim_work(reclaim_id: int) -> ReclaimWork:
    """The reclaim's work row (created ``requested`` on first use, with its planning deadline)."""
    now = timezone.now()
    work, _ = ReclaimWork.objects.get_or_create(reclaim_id=reclaim_id, defaults={
        "phase_entered_at": now, "phase_deadline_at": now + dt.timedelta(seconds=PLAN_TIMEOUT_S)})
    return work


def claim_reclaim(reclaim_id: int, current: str, target: str, deadline_at: dt.datetime | None = None) -> bool:
    """Move the reclaim from ``current`` to ``target`` if it is still there: True for the one caller that did
    (the step is its to do), False for every other. ``deadline_at``: by when ``target`` must be left."""
    reclaim_work(reclaim_id)
    now = timezone.now()
    stamp = {RECLAIM_STAMP[target]: now} if target in RECLAIM_STAMP else {}
    return claim_transition("reclaim", RECLAIM_TRANSITIONS, ReclaimWork, reclaim_id, current, target,
                            {**stamp, "phase_entered_at": now, "phase_deadline_at": deadline_at,
                             "phase_attempts": 0}, field="phase", key="reclaim_id")


def finish_transfer(transfer_pk: int, target: str, **fields: Any) -> bool:
    """``issued`` → ``received`` or ``failed``, once; True for the caller that did it."""
    return claim_transition("transfer", TRANSFER_TRANSITIONS, Transfer, transfer_pk, TransferState.ISSUED,
                            target, {"finished_at": timezone.now(), **fields})
