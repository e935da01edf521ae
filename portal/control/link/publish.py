"""The one way to send to Channels groups from synchronous code (views, Celery tasks, the consumers' database
thread): agent commands (:mod:`portal.control.link.commands`) and live events.

Groups: ``agent-<id>`` (commands), ``node-<id>``, ``job-<id>``, ``provider-<id>``, ``group-<id>`` (research
group), ``dashboard``. A live event's payload: ``{"type": "live.event", "event": "<job.state|node.state|reclaim|
migration|checkpoint>", ...ids}``: internal, it tells pages what to re-fetch. The events people read (placed,
moved, lost work, …; ``portal.core.events``) travel as ``{"type": "person.event", "notice": {...}}`` to their
audience's groups only (``group-<id>``, ``provider-<id>``, ``dashboard``), see :func:`publish_notice`.

With Redis, sends run on one event loop per process, kept in a thread of its own (design §9.10): its
connection pool is reused. ``async_to_sync`` per call built a new loop and a new Redis connection for each send
(3-10 ms, measured, on every command to an agent) and, in Celery, could meet channels_redis's "Event loop is
closed" (channels_redis#332). The in-memory layer (the embedded default, tests) is bound to the loop its
consumers run on, so there ``async_to_sync`` (which runs the send on that loop) is kept.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 5.0

_sender: dict[str, Any] = {}  # pid → this process's sending loop (a forked worker child starts its own)
_sender_lock = threading.Lock()


def _sending_loop() -> asyncio.AbstractEventLoop:
    with _sender_lock:
        loop = _sender.get("loop")
        if loop is None or _sender.get("pid") != os.getpid() or not loop.is_running():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="channel-layer-sender", daemon=True).start()
            _sender.update(loop=loop, pid=os.getpid())
        return loop


def group_send_many(messages: list[tuple[str, dict[str, Any]]]) -> None:
    """Send ``(group, message)`` pairs in order, from synchronous code. Raises what the layer raises."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return

    async def _send() -> None:
        for group, message in messages:
            await layer.group_send(group, message)

    if isinstance(layer, InMemoryChannelLayer):
        async_to_sync(_send)()
        return
    asyncio.run_coroutine_threadsafe(_send(), _sending_loop()).result(SEND_TIMEOUT_S)


def publish(groups: Iterable[str], event: str, **fields: Any) -> None:
    """Send ``{"type": "live.event", "event": event, **fields}`` to each group; never raises."""
    message = {"type": "live.event", "event": event, **fields}
    try:
        group_send_many([(group, message) for group in groups])
    except Exception:  # a live update is best-effort; the database is the source of truth
        log.warning("live event %s not published", event, exc_info=True)


def publish_notice(groups: Iterable[str], notice: dict[str, Any]) -> None:
    """Send one person event (``portal.core.events.Notice.payload``) to its audience's groups; never raises.
    The browsers' consumer passes it on once per socket, to members of those groups only."""
    message = {"type": "person.event", "notice": notice}
    try:
        group_send_many([(group, message) for group in groups])
    except Exception:  # best-effort like every live update; the change itself is committed
        log.warning("notice %s not published", notice.get("name"), exc_info=True)
