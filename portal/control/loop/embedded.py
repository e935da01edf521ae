"""The embedded default's control loop (``make demo``): no Redis, no Celery worker, no beat.

With the in-memory channel layer, agent commands can only reach consumers of the same process, so the loop runs
as asyncio tasks inside the daphne process, started by the first agent connection, and only when Celery runs
tasks eagerly (no REDIS_URL); with Redis, Celery beat drives the same ``control_tick`` and relays the outbox.

Two tasks: the control tick every control period, and the outbox relay (docs/design.md §8), which runs queued
task bodies here, after the request or consumer that queued them has committed and answered. It wakes as soon
as this process commits work and polls every ``RELAY_POLL_S`` for rows other processes (management commands)
wrote to the same SQLite file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from channels.db import database_sync_to_async
from django.conf import settings

from portal.control.loop.housekeeping import housekeeping
from portal.control.loop.reconcile import reconcile
from portal.control.loop.ticks import TickContext, control_tick
from portal.control.reserve import calibrate_reserves
from portal.core import idempotency, outbox
from portal.notify.dispatch import periodic as notify_periodic  # beat's notify tasks (design §12)

log = logging.getLogger(__name__)

RELAY_POLL_S = 0.5
RELAY_BATCH = 5

# The loops this process runs (started once, on the first agent connection): the one piece of process state
# here, and it holds no data — everything the loops act on is in the database.
_tasks: list[asyncio.Task[None]] = []


async def _tick_loop(period_s: float) -> None:
    context = TickContext()  # this loop's copy of the estimator state and its start (design §9.5)
    while True:
        try:
            await database_sync_to_async(control_tick)(context=context)
            await database_sync_to_async(reconcile)()
            await database_sync_to_async(notify_periodic)()
        except Exception:  # one bad tick must not stop the loop; the next one re-reads everything
            log.exception("control tick failed")
        await asyncio.sleep(period_s)


PRUNE_EVERY_S = 600.0


def _relay_batch() -> int:
    # Small batches: urgent rows queued meanwhile are claimed next, and a shutdown waits for a few tasks only.
    sent, _ = outbox.relay_once(outbox.run_in_process, limit=RELAY_BATCH)
    return sent


_calibrated_at = -float("inf")


def _prune() -> None:
    """Rows sent a day ago, expired idempotency keys; bandwidth samples rolled up, old decision logs; the
    research reserves calibrated once a period (beat's daily task in production, design §4)."""
    global _calibrated_at
    outbox.prune_sent()
    idempotency.prune_expired()
    housekeeping()
    if time.monotonic() - _calibrated_at > float(settings.CELERY_BEAT_SCHEDULE["control-calibrate-reserves"]["schedule"]):
        calibrate_reserves()
        _calibrated_at = time.monotonic()


async def _relay_loop() -> None:
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def on_commit() -> None:  # called from whichever thread committed
        with contextlib.suppress(RuntimeError):  # the loop is closing
            loop.call_soon_threadsafe(wake.set)

    remove_listener = outbox.add_wake_listener(on_commit)
    pruned_at = -PRUNE_EVERY_S
    try:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), RELAY_POLL_S)
            wake.clear()
            try:
                while await database_sync_to_async(_relay_batch)():
                    pass  # tasks may queue more work: relay until nothing is due
                if time.monotonic() - pruned_at > PRUNE_EVERY_S:
                    await database_sync_to_async(_prune)()
                    pruned_at = time.monotonic()
            except Exception:
                log.exception("outbox relay failed")
    finally:
        remove_listener()  # a restarted loop registers its own


def ensure_started() -> None:
    """Start the in-process loops once (embedded default only). Must be called from the event loop."""
    if not getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False) or getattr(settings, "RECLAIMNET_NO_LOOP", False):
        return
    if _tasks and not any(task.done() for task in _tasks):
        return
    for task in _tasks:
        task.cancel()
    _tasks.clear()
    period_s = float(settings.RECLAIMNET["CONTROL_PERIOD_S"])
    loop = asyncio.get_running_loop()
    _tasks.extend([loop.create_task(_tick_loop(period_s)), loop.create_task(_relay_loop())])
    log.info("embedded control loop and outbox relay started (period %.1f s)", period_s)


def stop() -> None:
    """Cancel the in-process loops (daphne is shutting down): nothing they hold is lost, all of it is in the
    database, and the next process starts them again."""
    for task in _tasks:
        task.cancel()
    _tasks.clear()
