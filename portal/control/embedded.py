"""The embedded default's control loop (``make demo``): no Redis, no Celery worker, no beat.

With the in-memory channel layer, agent commands can only reach consumers of the same process, so the loop runs
as an asyncio task inside the daphne process. It is started by the first agent connection, and only when Celery
runs tasks eagerly (no REDIS_URL); with Redis, Celery beat drives the same ``control_tick``.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from django.conf import settings

log = logging.getLogger(__name__)

_task: asyncio.Task[None] | None = None


async def _loop(period_s: float) -> None:
    from portal.control.ticks import control_tick

    while True:
        try:
            await database_sync_to_async(control_tick)()
        except Exception:  # one bad tick must not stop the loop; the next one re-reads everything
            log.exception("control tick failed")
        await asyncio.sleep(period_s)


def ensure_started() -> None:
    """Start the in-process loop once (embedded default only). Must be called from the event loop."""
    global _task
    if not getattr(settings, "CELERY_TASK_ALWAYS_EAGER", False) or getattr(settings, "RECLAIMNET_NO_LOOP", False):
        return
    if _task is not None and not _task.done():
        return
    period_s = float(settings.RECLAIMNET["CONTROL_PERIOD_S"])
    _task = asyncio.get_running_loop().create_task(_loop(period_s))
    log.info("embedded control loop started (period %.1f s)", period_s)
