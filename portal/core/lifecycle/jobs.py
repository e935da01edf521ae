"""The job lifecycle (design §1): queued → running ⇄ migrating → completed, with failure and cancel.

```
queued ──place──▶ running ──reclaim──▶ migrating ──resume──▶ running
  ▲                 │  │                   │
  └──requeue────────┘  └─▶ completed       └─▶ queued (no destination: degraded, waits for a node)
any live state ──▶ cancelled | failed
migrating ──release (idle watchdog, loan timer)──▶ suspended ──resume──▶ queued   (design §15)
```
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from portal.core.lifecycle.base import apply_transition
from portal.core.states import JOB_ALLOWED, JOB_TERMINAL, JobState

if TYPE_CHECKING:
    from portal.core.models import Job


# The states and their table live in portal.core.states (no model import, so the models can take them);
# these names are the lifecycle's public ones.
ALLOWED = JOB_ALLOWED
TERMINAL = JOB_TERMINAL


# Called with the job after it moved to failed, cancelled or completed, in the same transaction (the fair queue
# registers what happens to its dependants, design §16.6).
END_HOOKS: list[Callable[[Job], None]] = []


def _move(job: Job, target: str, **extra: Any) -> None:
    apply_transition("job", ALLOWED, job, target, extra)
    if target in TERMINAL:
        for hook in END_HOOKS:
            hook(job)


def start(job: Job) -> None:
    """A placement was made and the agent started the job (queued → running, or migrating → running)."""
    extra: dict[str, Any] = {}
    if job.started_at is None:
        extra["started_at"] = timezone.now()
    _move(job, JobState.RUNNING, **extra)


def begin_migration(job: Job) -> None:
    """Its node is being reclaimed: checkpoint and move (running → migrating)."""
    _move(job, JobState.MIGRATING)


def requeue(job: Job) -> None:
    """No destination now (or its node vanished): wait in the queue for one."""
    _move(job, JobState.QUEUED)


def suspend(job: Job) -> None:
    """Released by the idle watchdog or the loan timer after its final checkpoint (migrating → suspended, design
    §15): it holds no GPU and waits for its owner."""
    _move(job, JobState.SUSPENDED)


def resume(job: Job) -> None:
    """Its owner resumed it (suspended → queued): placement resumes it from its checkpoint (design §15)."""
    _move(job, JobState.QUEUED)


def complete(job: Job) -> None:
    _move(job, JobState.COMPLETED, finished_at=timezone.now())


def fail(job: Job, reason: str) -> None:
    _move(job, JobState.FAILED, finished_at=timezone.now(), failure_reason=reason[:500])


def cancel(job: Job) -> None:
    _move(job, JobState.CANCELLED, finished_at=timezone.now())


def can(job: Job, target: str) -> bool:
    return target in ALLOWED.get(job.state, frozenset())
