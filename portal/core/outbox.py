"""The one enqueue seam: write work as an outbox row in the caller's transaction; a relay hands it over later.

``enqueue`` is all a request, a consumer or a task calls to have work done (docs/design.md §8). It never talks
to the broker, so a request cannot fail after its transaction committed because Redis is down, and work that
was rolled back was never queued. ``relay_once`` is the other half: it claims due rows (``SELECT … FOR UPDATE
SKIP LOCKED`` on PostgreSQL, so several relays never hand over the same row at once), passes each to a
*publisher* and marks it sent; a publisher that raises leaves the row for a later attempt with backoff.

Who relays:

- production (``REDIS_URL`` set): the Celery beat process (``portal.beat.RelayingScheduler``) publishes to the
  broker; it wakes on PostgreSQL ``NOTIFY`` as soon as a row commits and polls as a fallback;
- embedded default: the in-process control loop (``portal.control.loop.embedded``) runs the task bodies itself;
- ``RECLAIMNET_OUTBOX_RELAY = "inline"`` (tests that exercise control logic): the committing thread relays
  right after commit.

Delivery is at least once (a relay that dies between publishing and marking re-sends after its claim expires);
every task claims its own step (conditional updates, row locks), so a second delivery does nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from portal.celery import app
from portal.core.models.outbox import OutboxMessage

log = logging.getLogger(__name__)

NOTIFY_CHANNEL = "reclaimnet_outbox"
CLAIM_S = 60.0  # a relay that holds a row longer than this is presumed dead; another one takes the row
MAX_BACKOFF_S = 30.0
KEEP_SENT_S = 24 * 3600.0

Publisher = Callable[[OutboxMessage], None]


class Task:
    """Names of the control-plane tasks the core queues (registered in ``portal.control.tasks``)."""

    PLACE_JOB = "control.place_job"
    PLACE_QUEUED = "control.place_queued"  # one placement pass over every queued job (design §10)
    STOP_CANCELLED_JOB = "control.stop_cancelled_job"
    RUN_RECLAIM = "control.run_reclaim"
    NODE_LENT_AGAIN = "control.node_lent_again"
    ENFORCE_DEADLINE = "control.enforce_deadline"
    ADVANCE_MIGRATION = "control.advance_migration"
    PRESYNC_CHECKPOINT = "control.presync_checkpoint"
    RECOVER_LOST_JOBS = "control.recover_lost_jobs"
    RELEASE_RECLAIMS = "control.release_reclaims"

# What a provider is waiting for goes first: a relay that has fallen behind (the embedded default under load)
# still runs a reclaim within a batch, whatever number of placements queued before it.
PRIORITY = {
    Task.RUN_RECLAIM: 0, Task.ENFORCE_DEADLINE: 0, Task.RECOVER_LOST_JOBS: 0,
    Task.ADVANCE_MIGRATION: 1, Task.RELEASE_RECLAIMS: 1, Task.STOP_CANCELLED_JOB: 1, Task.NODE_LENT_AGAIN: 1,
}
DEFAULT_PRIORITY = 2

_wake_listeners: list[Callable[[], None]] = []
_listeners_lock = threading.Lock()


def relay_mode() -> str:
    """``celery`` (a broker and workers), ``loop`` (the embedded in-process loop) or ``inline``."""
    mode = getattr(settings, "RECLAIMNET_OUTBOX_RELAY", "")
    if mode:
        return str(mode)
    return "loop" if settings.CELERY_TASK_ALWAYS_EAGER else "celery"


def enqueue(task_name: str, *args: Any, delay_s: float = 0.0) -> OutboxMessage:
    """Queue task ``task_name(*args)`` (JSON arguments) to run once the current transaction commits.

    ``delay_s`` holds it back (a reclaim deadline). Outside a transaction the row commits at once.
    """
    message = OutboxMessage.objects.create(
        task_name=task_name, args=list(args), priority=PRIORITY.get(task_name, DEFAULT_PRIORITY),
        available_at=timezone.now() + dt.timedelta(seconds=delay_s))
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:  # delivered to listening relays when (and only if) this commits
            cur.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, str(message.pk)])
    transaction.on_commit(_after_commit)
    return message


def add_wake_listener(listener: Callable[[], None]) -> Callable[[], None]:
    """Call ``listener`` (from the committing thread, must not block) after each commit that queued work.
    Returns a function removing it."""
    with _listeners_lock:
        _wake_listeners.append(listener)

    def remove() -> None:
        with _listeners_lock:
            if listener in _wake_listeners:
                _wake_listeners.remove(listener)

    return remove


def _after_commit() -> None:
    if relay_mode() == "inline":
        relay_inline()
        return
    with _listeners_lock:
        listeners = list(_wake_listeners)
    for listener in listeners:
        try:
            listener()
        except Exception:  # a wake-up is an optimisation; the relay polls anyway
            log.debug("outbox wake listener failed", exc_info=True)


def claim_due(limit: int = 100, now: dt.datetime | None = None) -> list[OutboxMessage]:
    """Claim up to ``limit`` due, unsent rows for this relay (each row is claimed by one relay at a time),
    most urgent first (``PRIORITY``), then oldest first."""
    now = now or timezone.now()
    with transaction.atomic():
        rows = list(
            OutboxMessage.objects.select_for_update(skip_locked=True)
            .filter(sent_at__isnull=True, available_at__lte=now)
            .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
            .order_by("priority", "available_at", "id")[:limit]
        )
        if rows:
            OutboxMessage.objects.filter(pk__in=[r.pk for r in rows]).update(
                claimed_until=now + dt.timedelta(seconds=CLAIM_S), attempts=F("attempts") + 1)
    for row in rows:
        row.attempts += 1
    return rows


def mark_sent(message: OutboxMessage) -> None:
    OutboxMessage.objects.filter(pk=message.pk).update(sent_at=timezone.now(), claimed_until=None, last_error="")


def mark_failed(message: OutboxMessage, error: BaseException | str) -> None:
    """Release the claim and retry after an exponential backoff (0.5 s, 1 s, 2 s, … capped at 30 s)."""
    backoff_s = min(MAX_BACKOFF_S, 0.5 * 2 ** max(0, message.attempts - 1))
    OutboxMessage.objects.filter(pk=message.pk, sent_at__isnull=True).update(
        claimed_until=None, available_at=timezone.now() + dt.timedelta(seconds=backoff_s),
        last_error=str(error)[:300])


def relay_once(publish: Publisher, limit: int = 100) -> tuple[int, int]:
    """Hand every due row to ``publish``; returns (sent, failed). Never raises for a publisher's error."""
    sent = failed = 0
    for message in claim_due(limit):
        try:
            publish(message)
        except Exception as exc:
            failed += 1
            log.warning("outbox: %s #%s not handed over (attempt %d): %s", message.task_name, message.pk,
                        message.attempts, exc)
            mark_failed(message, exc)
        else:
            sent += 1
            mark_sent(message)
    return sent, failed


def prune_sent(older_than_s: float = KEEP_SENT_S) -> int:
    """Delete rows handed over more than ``older_than_s`` ago (the table stays bounded)."""
    cutoff = timezone.now() - dt.timedelta(seconds=older_than_s)
    deleted, _ = OutboxMessage.objects.filter(sent_at__lt=cutoff).delete()
    return int(deleted)


def pending(task_names: Iterable[str] | None = None) -> int:
    """How many rows wait to be handed over (for metrics and tests)."""
    qs = OutboxMessage.objects.filter(sent_at__isnull=True)
    if task_names is not None:
        qs = qs.filter(task_name__in=list(task_names))
    return qs.count()


def run_in_process(message: OutboxMessage) -> None:
    """Publisher of the embedded default and of ``inline`` mode: run the task body in this process."""
    # The Celery app is the task registry here; nothing is sent to a broker.
    if message.task_name not in app.tasks:
        app.loader.import_default_modules()  # registers the tasks (autodiscovery), once per process
    task = app.tasks[message.task_name]
    task.run(*message.args)


_inline = threading.local()


def relay_inline() -> None:
    """Relay now, in this thread (``inline`` mode). Tasks that enqueue more work are relayed by the outermost
    call, so nesting never recurses."""
    if getattr(_inline, "active", False):
        _inline.again = True
        return
    _inline.active = True
    try:
        while True:
            _inline.again = False
            sent, _ = relay_once(run_in_process)
            if sent == 0 and not _inline.again:
                break
    finally:
        _inline.active = False
