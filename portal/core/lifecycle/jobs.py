"""The job lifecycle (design §1): queued → running ⇄ migrating → completed, with failure and cancel.

```
queued ──place──▶ running ──reclaim──▶ migrating ──resume──▶ running
  ▲                 │  │                   │
  └──requeue────────┘  └─▶ completed       └─▶ queued (no destination: degraded, waits for a node)
any live state ──▶ cancelled | failed
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.utils import timezone

from portal.core.lifecycle.base import apply_transition

if TYPE_CHECKING:
    from portal.core.models import Job


class JobState(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    MIGRATING = "migrating", "migrating"
    COMPLETED = "completed", "completed"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})

ALLOWED: dict[str, frozenset[str]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset(
        {JobState.MIGRATING, JobState.QUEUED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.MIGRATING: frozenset({JobState.RUNNING, JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def _move(job: Job, target: str, **extra: Any) -> None:
    apply_transition("job", ALLOWED, job, target, extra)


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


def complete(job: Job) -> None:
    _move(job, JobState.COMPLETED, finished_at=timezone.now())


def fail(job: Job, reason: str) -> None:
    _move(job, JobState.FAILED, finished_at=timezone.now(), failure_reason=reason[:500])


def cancel(job: Job) -> None:
    _move(job, JobState.CANCELLED, finished_at=timezone.now())


def can(job: Job, target: str) -> bool:
    return target in ALLOWED.get(job.state, frozenset())
