"""Whether the agent link was up: the evidence heartbeat loss is judged on (design §9.10).

A node is lost when its agent was silent while the portal was listening, not when the portal was not. Each
agent-link server process (daphne) keeps a :class:`LinkServer` row and beats every :func:`beat_s`: one
``group_send`` through the channel layer (Redis, where commands travel) and one write of the row, on the thread
that records the agents' messages — so a beat is late exactly when heartbeats would be. The row's
``serving_since`` restarts when the process starts, when a beat comes more than :func:`stale_s` after the
previous one (the process stalled, the database or Redis was down) and when a heartbeat could not be recorded.

Why rows in PostgreSQL rather than keys in Redis: the fact to prove is "heartbeats could have been recorded",
and they are recorded in PostgreSQL; a database outage stops the beats with them, and the tick reads the
evidence in the same database, in the statement budget it already has.

:func:`evidence` answers for the tick: the link is *down* when servers have recorded themselves but none has beaten
within :func:`stale_s` (nobody is listening: silence is no evidence); otherwise it has been serving since the
latest (re)start or interruption of any server, and silence counts only from that moment plus
:data:`RECONNECT_GRACE_S`, the time agents take to come back (their backoff is quick and jittered for the first
seconds of an outage and never longer than ``reconnect_max_s``, 10 s by default; see ``nodeagent``). A database
where no link server ever recorded itself (tests of the tick alone) has no evidence: silence alone is judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import secrets
import socket
import sys
from dataclasses import dataclass

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db.models import Case, Max, Q, Value, When
from django.utils import timezone

from portal.control.config import rn
from portal.control.models import LinkServer

log = logging.getLogger(__name__)

RECONNECT_GRACE_S = 12.0  # the agent's longest backoff (reconnect_max_s, 10 s) + a handshake and hello
KEEP_DEAD_S = 86400.0  # rows of servers gone this long are pruned (while another one serves)
PRESENCE_GROUP = "link-presence"  # the beat's group_send target: nobody listens, the send proves Redis answers

NAME = f"{socket.gethostname()[:60]}:{os.getpid()}:{secrets.token_hex(4)}"
STARTED_AT = timezone.now()

_state: dict[str, object] = {"interrupted": False}


def stale_s() -> float:
    """A server whose last beat is older is not serving. Shorter than HEARTBEAT_TIMEOUT_S minus the heartbeat
    interval (60 % of it: 4.8 s by default), so a dead server is noticed before any of its agents' silence could
    reach the timeout."""
    return max(0.3, 0.6 * (float(rn("HEARTBEAT_TIMEOUT_S")) - float(rn("HEARTBEAT_INTERVAL_S"))))


def beat_s() -> float:
    """How often a server beats: three beats per :func:`stale_s`."""
    return stale_s() / 3
_tasks: list[asyncio.Task[None]] = []


@dataclass(frozen=True)
class LinkEvidence:
    """What the link-server rows say at one moment."""

    recorded: bool  # some link server has recorded itself in this database
    serving: bool  # at least one beat within stale_s()
    since: dt.datetime | None  # serving without interruption since (None: no evidence)

    def silence_from(self) -> dt.datetime | None:
        """The earliest moment an agent's silence may count from (None: any silence counts)."""
        if self.since is None:
            return None
        return self.since + dt.timedelta(seconds=RECONNECT_GRACE_S)


def beat(name: str, started_at: dt.datetime, *, interrupted: bool = False, now: dt.datetime | None = None) -> None:
    """Record one beat of server ``name`` (one UPDATE; the first beat inserts): alive now, and serving since now
    if it was ``interrupted`` or its previous beat is older than stale_s()."""
    now = now or timezone.now()
    restart = Q(alive_at__lt=now - dt.timedelta(seconds=stale_s()))
    if interrupted:
        restart = Q(pk__isnull=False)
    updated = LinkServer.objects.filter(name=name).update(
        alive_at=now, serving_since=Case(When(restart, then=Value(now)), default="serving_since"))
    if not updated:
        LinkServer.objects.create(name=name, started_at=started_at, serving_since=now, alive_at=now)


def evidence(now: dt.datetime | None = None) -> LinkEvidence:
    """The link's state at ``now`` from every server's row, in one statement.

    Serving since: the latest ``serving_since`` of a live server, or the last beat of a server that stopped
    (its agents had to reconnect elsewhere), whichever is later."""
    now = now or timezone.now()
    live = Q(alive_at__gte=now - dt.timedelta(seconds=stale_s()))
    row = LinkServer.objects.aggregate(
        rows=Max("alive_at"), live_since=Max("serving_since", filter=live), dead_at=Max("alive_at", filter=~live))
    if row["rows"] is None:
        return LinkEvidence(recorded=False, serving=False, since=None)
    if row["live_since"] is None:
        return LinkEvidence(recorded=True, serving=False, since=None)
    since = max(row["live_since"], row["dead_at"]) if row["dead_at"] is not None else row["live_since"]
    return LinkEvidence(recorded=True, serving=True, since=since)


def prune(now: dt.datetime | None = None) -> int:
    """Rows of servers gone for KEEP_DEAD_S, while another server is serving (so "link down" is never lost)."""
    now = now or timezone.now()
    if not LinkServer.objects.filter(alive_at__gte=now - dt.timedelta(seconds=stale_s())).exists():
        return 0
    removed, _ = LinkServer.objects.filter(alive_at__lt=now - dt.timedelta(seconds=KEEP_DEAD_S)).delete()
    return removed


def note_interrupted() -> None:
    """An agent's message could not be recorded (a database error): the next beat restarts ``serving_since``."""
    _state["interrupted"] = True


async def _beat_loop() -> None:
    layer = get_channel_layer()
    while True:
        interrupted = bool(_state["interrupted"])
        _state["interrupted"] = False
        try:
            if layer is not None:
                await layer.group_send(PRESENCE_GROUP, {"type": "link.presence"})
            await database_sync_to_async(beat)(NAME, STARTED_AT, interrupted=interrupted)
        except Exception as exc:  # the database's, Redis's, the layer's own: the loop goes on
            _state["interrupted"] = True
            log.warning("link server beat failed (%s: %s); the link counts as interrupted", type(exc).__name__, exc)
        await asyncio.sleep(beat_s())


def ensure_started() -> None:
    """Start this process's beat once (from the event loop), only in a running daphne (its Twisted reactor
    runs): a link server is a daphne process; tests that drive the consumer in-process do not beat."""
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None or not getattr(reactor, "running", False):
        return
    if _tasks and not _tasks[0].done():
        return
    _tasks.clear()
    _tasks.append(asyncio.get_running_loop().create_task(_beat_loop()))
    # daphne's SIGTERM: stop beating as the connections are closed, not after
    reactor.addSystemEventTrigger("before", "shutdown", stop)
    log.info("link server %s beating every %.1f s", NAME, beat_s())


def stop() -> None:
    """Cancel the beat (the process is shutting down; its row goes stale and counts as an interruption)."""
    for task in _tasks:
        with contextlib.suppress(RuntimeError):
            task.cancel()
    _tasks.clear()
