"""The one publisher helper: send a live event to a Channels group from any context (view, Celery task, loop).

Groups: ``node-<id>``, ``job-<id>``, ``provider-<id>``, ``group-<id>`` (research group), ``dashboard``.
Payload: ``{"type": "live.event", "event": "<job.state|node.state|reclaim|migration|checkpoint>", ...ids}``.
Using ``async_to_sync`` per call and flushing avoids channels_redis "Event loop is closed" inside Celery
(channels_redis#332).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


def publish(groups: Iterable[str], event: str, **fields: Any) -> None:
    """Send ``{"type": "live.event", "event": event, **fields}`` to each group; never raises."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "live.event", "event": event, **fields}

    async def _send() -> None:
        for group in groups:
            await layer.group_send(group, message)

    try:
        async_to_sync(_send)()
    except Exception:  # a live update is best-effort; the database is the source of truth
        log.warning("live event %s not published", event, exc_info=True)
