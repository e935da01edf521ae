"""Heartbeats recorded in batches, off the consumers' path (design §9.10).

Every agent message a consumer handles goes through one database thread (``database_sync_to_async`` is
thread-sensitive), and a consumer handles its events one at a time: while it waits there for its heartbeat, a
command for its agent waits behind it. 500 agents heartbeating meant several statements each (token re-check,
node update, node read, sample lookup) queued on that thread: measured, commands to agents waited up to 4 s
behind them (``make e2e``'s control p99). So the consumer hands a heartbeat to this process's buffer and
returns at once; every :data:`FLUSH_S` the buffer is written with
:func:`portal.control.link.handlers.record_heartbeats` — a fixed number of statements for all the nodes that
beat meanwhile — and the sessions whose token no longer authenticates are told to close.

A heartbeat is recorded at most FLUSH_S late (well inside the heartbeat interval); a batch that fails (the
database down) is dropped, the link counts as interrupted (:mod:`portal.control.link.presence`) and the next
heartbeats are recorded when it is back.
"""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import DatabaseError

from portal.control.link import handlers, presence
from portal.control.link.commands import agent_group
from portal.control.link.handlers import HeartbeatSeen

log = logging.getLogger(__name__)

FLUSH_S = 0.2

_pending: list[HeartbeatSeen] = []
_flusher: list[asyncio.Task[None]] = []  # the running flush task of this process (at most one)


def add(seen: HeartbeatSeen) -> None:
    """Queue one heartbeat; the running flush task (started here if none) records it. From the event loop."""
    loop = asyncio.get_running_loop()
    if _flusher and _flusher[0].get_loop() is not loop:  # a new event loop (tests): what the old one held is gone
        _flusher.clear()
        _pending.clear()
    _pending.append(seen)
    if not _flusher or _flusher[0].done():
        _flusher[:] = [loop.create_task(_flush_while_pending())]


async def _flush_while_pending() -> None:
    while _pending:
        await asyncio.sleep(FLUSH_S)
        batch = _pending[:]
        _pending.clear()
        await flush(batch)


async def flush(batch: list[HeartbeatSeen]) -> None:
    """Record ``batch``; close (through their consumers) the sessions whose token was refused."""
    try:
        refused = await database_sync_to_async(handlers.record_heartbeats)(batch)
    except DatabaseError:
        presence.note_interrupted()
        log.warning("%d heartbeat(s) not recorded now (database error); the next ones will be", len(batch),
                    exc_info=True)
        return
    layer = get_channel_layer()
    for seen in refused:
        log.warning("node %s: agent token revoked or rotated; closing its session", seen.node_id)
        if layer is not None:
            await layer.group_send(agent_group(seen.node_id), {"type": "agent.revoked", "session_id": seen.session_id})
