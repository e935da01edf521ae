"""Agents are untrusted input (design §9.9): a message budget per session, and counters instead of rows.

Each agent session may send :data:`RATE_PER_S` messages a second (a token bucket holding :data:`BURST` of
them); what exceeds it is dropped and counted, the agent is warned at most once a second, and a session that
keeps flooding for :data:`STRIKES_TO_CLOSE` seconds in a row is closed. Messages are charged at the moment they
arrived (:class:`Arrivals`), not when the consumer gets to them: a consumer stalled behind a busy database
handles its backlog all at once, and that is not the agent flooding. Unauthenticated websocket attempts and
dropped messages are counted in this process's memory and added to :class:`~portal.control.models.LinkCounter`
rows at most every :data:`FLUSH_S` (one UPDATE per counter), so a flood writes no row per attempt; ``/metrics``
reads the rows (``reclaimnet_agent_link_events_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import F

from portal.control.models import LinkCounter

RATE_PER_S = 20.0
BURST = 20.0
STRIKES_TO_CLOSE = 5  # consecutive seconds with dropped messages before the session is closed
FLUSH_S = 5.0

AUTH_REFUSED = "auth_refused"  # a websocket attempt without a valid agent token
MESSAGES_DROPPED = "messages_dropped"  # over the per-session rate
SESSIONS_CLOSED = "sessions_closed_flooding"


@dataclass
class SessionBudget:
    """The token bucket of one agent session; ``clock`` is injectable for tests."""

    rate_per_s: float = RATE_PER_S
    burst: float = BURST
    clock: Callable[[], float] = time.monotonic
    tokens: float = BURST
    updated_at: float = field(default=-1.0)
    dropped: int = 0
    strikes: int = 0
    _last_drop_second: int = -10
    _warned_second: int = -10

    def take(self, arrived_at: float | None = None) -> bool:
        """Whether one more message may be handled (False: drop it), charged at ``arrived_at`` (on ``clock``;
        default: now)."""
        now = self.clock() if arrived_at is None else arrived_at
        if self.updated_at < 0:
            self.updated_at = now
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.updated_at) * self.rate_per_s)
        self.updated_at = max(self.updated_at, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            second = int(now)
            if second > self._last_drop_second + 1:
                self.strikes = 0  # a whole second without a drop: the flood ended
            return True
        self.dropped += 1
        second = int(now)
        if second != self._last_drop_second:
            self.strikes = self.strikes + 1 if second == self._last_drop_second + 1 else 1
            self._last_drop_second = second
        return False

    def should_warn(self) -> bool:
        """At most one warning a second to a flooding agent."""
        second = int(self.clock())
        if second == self._warned_second:
            return False
        self._warned_second = second
        return True

    @property
    def persists(self) -> bool:
        return self.strikes >= STRIKES_TO_CLOSE


class Arrivals:
    """A session's incoming messages, each stamped with ``clock()`` the moment this process received it.

    The consumer handles one message at a time, and the server queues the others meanwhile; a pump task takes
    each one off that queue as it arrives and stamps it. :meth:`receive` hands them over in the same order and
    sets :attr:`arrived_at`, the stamp of the message being handled, which the budget charges
    (:meth:`SessionBudget.take`)."""

    def __init__(self, receive: Callable[[], Awaitable[dict[str, Any]]], clock: Callable[[], float]) -> None:
        self._upstream = receive
        self._clock = clock
        self._stamped: asyncio.Queue[tuple[float, dict[str, Any] | BaseException]] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None
        self.arrived_at: float | None = None

    async def receive(self) -> dict[str, Any]:
        """The next message (the server's ``receive``), its arrival in :attr:`arrived_at`."""
        if self._pump is None:
            self._pump = asyncio.ensure_future(self._run())
        self.arrived_at, message = await self._stamped.get()
        if isinstance(message, BaseException):
            raise message
        return message

    async def _run(self) -> None:
        try:
            while True:
                message = await self._upstream()
                self._stamped.put_nowait((self._clock(), message))
                if message.get("type") == "websocket.disconnect":
                    return
        except Exception as exc:  # handed to the consumer, which would otherwise wait for ever
            self._stamped.put_nowait((self._clock(), exc))

    async def close(self) -> None:
        """Stop the pump (the consumer has ended)."""
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump


def new_budget() -> SessionBudget:
    """The budget of a new agent session (the consumer's one seam; tests give it their own clock)."""
    return SessionBudget()


_counts: Counter[str] = Counter()
_lock = threading.Lock()
_flushed_at = [0.0]


def count(name: str, n: int = 1) -> None:
    """Count an event in this process (added to the database by :func:`flush`)."""
    with _lock:
        _counts[name] += n


def flush_due(clock: Callable[[], float] = time.monotonic) -> bool:
    """Whether counts are waiting and the last flush is FLUSH_S old (cheap: no database)."""
    with _lock:
        return bool(_counts) and clock() - _flushed_at[0] >= FLUSH_S


def flush(clock: Callable[[], float] = time.monotonic) -> dict[str, int]:
    """Add this process's counts to the LinkCounter rows (one UPDATE, or INSERT the first time, per name)."""
    with _lock:
        pending = dict(_counts)
        _counts.clear()
        _flushed_at[0] = clock()
    try:
        with transaction.atomic():
            for name, n in pending.items():
                if not LinkCounter.objects.filter(name=name).update(value=F("value") + n):
                    LinkCounter.objects.get_or_create(name=name, defaults={"value": 0})
                    LinkCounter.objects.filter(name=name).update(value=F("value") + n)
    except Exception:
        with _lock:  # not lost: counted again at the next flush
            _counts.update(pending)
        raise
    return pending
