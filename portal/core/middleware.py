"""Request-level guards that apply to every page and endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg_pool
from django.conf import settings
from django.core.signals import got_request_exception
from django.http import HttpRequest, HttpResponse, JsonResponse

log = logging.getLogger(__name__)


class BodySizeLimitMiddleware:
    """A body larger than ``DATA_UPLOAD_MAX_MEMORY_SIZE`` answers 413 before anything reads it (Django alone
    answers an HTML 400 from deep inside the parser). API clients get JSON naming the limit."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if limit is not None and length > limit:
            message = f"Request body of {length} bytes is larger than the {limit} bytes accepted."
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": message}, status=413)
            return HttpResponse(message, status=413, content_type="text/plain; charset=utf-8")
        return self.get_response(request)


# SQLSTATEs that say "the database cannot take this connection now", not "this request is wrong".
_BUSY_SQLSTATES = {
    "53300": "database_connection_limit",  # too_many_connections ("remaining connection slots are reserved …")
    "57P01": "database_unavailable",  # admin_shutdown: PostgreSQL is restarting
    "57P02": "database_unavailable",  # crash_shutdown
    "57P03": "database_unavailable",  # cannot_connect_now: PostgreSQL is starting up
}
# Connection-phase failures carry no SQLSTATE: recognised by PostgreSQL's own wording.
_BUSY_MESSAGES = {
    "too many clients": "database_connection_limit",
    "too many connections": "database_connection_limit",
    "remaining connection slots are reserved": "database_connection_limit",
    "connection failed": "database_unavailable",
    "the database system is starting up": "database_unavailable",
    "the database system is shutting down": "database_unavailable",
}
_EXPLANATIONS = {
    "database_pool_exhausted": "no database connection of this server came free in time",
    "database_connection_limit": "the database has no connection slot left",
    "database_unavailable": "the database is not accepting connections",
}
_MARK = "_reclaimnet_database_busy"


def database_busy_reason(exc: BaseException) -> str | None:
    """Why ``exc`` means "the database is busy or away, try again shortly" (a reason code), else None.

    Django wraps driver errors (``django.db.OperationalError`` with the psycopg error as its cause), so the whole
    cause/context chain is read."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, psycopg_pool.PoolTimeout | psycopg_pool.TooManyRequests | psycopg_pool.PoolClosed):
            return "database_pool_exhausted"
        if isinstance(current, psycopg.OperationalError):
            sqlstate = getattr(current, "sqlstate", None)
            if sqlstate in _BUSY_SQLSTATES:
                return _BUSY_SQLSTATES[sqlstate]
            if sqlstate is None:
                text = str(current).lower()
                for fragment, reason in _BUSY_MESSAGES.items():
                    if fragment in text:
                        return reason
        current = current.__cause__ or current.__context__
    return None


def database_busy_response(request: HttpRequest, reason: str) -> HttpResponse:
    """503 + ``Retry-After``: JSON naming the reason under /api/, a plain page elsewhere."""
    retry_after_s = int(settings.RECLAIMNET_DB_BUSY_RETRY_AFTER_S)
    message = f"Service busy: {_EXPLANATIONS[reason]}. Please retry in {retry_after_s} s."
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": message, "reason": reason}, status=503)
    else:
        response = HttpResponse(message, status=503, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(retry_after_s)
    return response


def _mark_busy_request(sender: Any, request: HttpRequest | None = None, **kwargs: Any) -> None:
    """``got_request_exception`` receiver: runs inside Django's handler for an exception no view caught (one from
    another middleware, say) and remembers on the request that it was the database being busy."""
    exc = sys.exc_info()[1]  # the signal is sent from inside the ``except`` block
    reason = database_busy_reason(exc) if request is not None and exc is not None else None
    if reason:
        setattr(request, _MARK, reason)


class DatabaseBusyMiddleware:
    """A burst that finds every pooled connection taken (after queueing ``RECLAIMNET_DB_POOL_TIMEOUT_S``), or
    PostgreSQL out of connection slots or restarting, is answered 503 with ``Retry-After`` — never a 500
    (docs/design.md §10).

    Views and DRF views: DRF's exception handler leaves a database error unhandled and re-raises it, so both reach
    :meth:`process_exception`. An error raised in another middleware is turned into a 500 by Django before this
    middleware sees it; the ``got_request_exception`` receiver marks such a request and :meth:`__call__` answers
    503 instead. Place it near the top of ``MIDDLEWARE``.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        got_request_exception.connect(_mark_busy_request, dispatch_uid="reclaimnet-database-busy")

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        reason = getattr(request, _MARK, None)
        if reason and response.status_code == 500:
            return database_busy_response(request, reason)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        reason = database_busy_reason(exception)
        if reason is None:
            return None
        log.warning("answered 503 (%s) to %s %s: %s", reason, request.method, request.path, exception)
        return database_busy_response(request, reason)


_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(eq=False)
class _WaitingWrite:
    arrived_s: float  # the event loop's clock
    wake: asyncio.Future[None]
    urgent: bool = False  # a provider's reclaim or kill-switch (URGENT_WRITE_PATH)


# A provider taking a machine back does not wait behind a burst of submits (docs/design.md §10): these writes go
# to the head of the write queue and are let in up to the write limit whatever the reads.
URGENT_WRITE_PATH = re.compile(
    r"^/(api/nodes/\d+/(reclaim|emergency-reclaim|killswitch)"
    r"|provider/nodes/\d+/reclaim/(confirm|emergency|killswitch))/$")


class ConcurrencyLimit:
    """ASGI wrapper: at most ``limit`` reads (GET, HEAD, OPTIONS) and ``write_limit`` writes (default ``limit``)
    inside Django at once per server process; the others wait their turn, first come first served, in the event
    loop (docs/design.md §10 bounded resources).

    Each request's synchronous part runs in a thread (``portal.core.http``, a pool of ``limit + write_limit``
    threads), so without a bound a burst of 200 requests is 200 threads' worth of work contending for one
    interpreter lock and a connection pool a tenth that size: every request slows down together and, after the
    pool's timeout, many are refused at once. With the bound (``limit + write_limit`` below the pool's size) a
    request waits here instead, costing nothing, and runs at full speed when its turn comes. Reads and writes
    queue apart, so a burst of submits does not make every page wait behind it.

    Reads go first: while any read is inside or waiting, writes are let in only up to ``write_limit_under_reads``
    (default ``write_limit``: no difference), so a burst of submits shares the interpreter with the pages instead
    of taking it from them; a write that has waited ``write_defer_s`` (default half the queue timeout) is let in
    up to ``write_limit`` whatever the reads, so a long burst still ends well inside the timeout. A provider's
    reclaim or kill-switch (``URGENT_WRITE_PATH``) joins the head of the write queue and is let in up to
    ``write_limit`` whatever the reads: it never waits behind a burst of submits. A request that
    waited ``queue_timeout_s`` is answered 503 + ``Retry-After`` (JSON under /api/). Websockets are not limited
    (they are long-lived; their database work is bounded by the pool)."""

    def __init__(self, app: Any, limit: int, queue_timeout_s: float, retry_after_s: int,
                 write_limit: int | None = None, write_limit_under_reads: int | None = None,
                 write_defer_s: float | None = None) -> None:
        self.app = app
        self.limit = limit
        self.write_limit = limit if write_limit is None else write_limit
        self.write_limit_under_reads = (self.write_limit if write_limit_under_reads is None
                                        else max(1, min(write_limit_under_reads, self.write_limit)))
        self.queue_timeout_s = queue_timeout_s
        self.write_defer_s = queue_timeout_s / 2 if write_defer_s is None else write_defer_s
        self.retry_after_s = retry_after_s
        self._reads = asyncio.Semaphore(limit) if limit > 0 else None
        self._bounded = limit > 0 and self.write_limit > 0
        self._reads_here = 0  # reads waiting or inside
        self._writes_inside = 0
        self._writes_waiting: deque[_WaitingWrite] = deque()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self._reads is None or not self._bounded or scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("method") in _READ_METHODS:
            await self._read(self._reads, scope, receive, send)
        else:
            await self._write(scope, receive, send)

    async def _read(self, slots: asyncio.Semaphore, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self._reads_here += 1
        try:
            try:
                await asyncio.wait_for(slots.acquire(), self.queue_timeout_s)
            except TimeoutError:
                await self._refuse(scope, send)
                return
            try:
                await self.app(scope, receive, send)
            finally:
                slots.release()
        finally:
            self._reads_here -= 1
            if self._reads_here == 0:
                self._wake_next_write()

    async def _write(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not await self._enter_write(urgent=bool(URGENT_WRITE_PATH.match(str(scope.get("path", ""))))):
            await self._refuse(scope, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._writes_inside -= 1
            self._wake_next_write()

    def _write_may_enter(self, waiting: _WaitingWrite, now_s: float) -> bool:
        if self._writes_inside >= self.write_limit:
            return False
        if waiting.urgent or self._writes_inside < self.write_limit_under_reads or self._reads_here == 0:
            return True
        return now_s - waiting.arrived_s >= self.write_defer_s

    async def _enter_write(self, urgent: bool = False) -> bool:
        """Wait for a write slot, first come first served (``urgent``: ahead of every non-urgent write); False
        after the queue timeout."""
        loop = asyncio.get_running_loop()
        waiting = _WaitingWrite(loop.time(), loop.create_future(), urgent)
        if urgent:
            ahead = sum(1 for w in self._writes_waiting if w.urgent)
            if ahead == 0 and self._writes_waiting and not self._writes_waiting[0].wake.done():
                self._writes_waiting[0].wake.set_result(None)  # no longer first: it looks again and waits
            self._writes_waiting.insert(ahead, waiting)
        else:
            self._writes_waiting.append(waiting)
        try:
            while True:
                now_s = loop.time()
                first = self._writes_waiting[0] is waiting
                if first and self._write_may_enter(waiting, now_s):
                    self._writes_waiting.popleft()
                    self._writes_inside += 1
                    self._wake_next_write()  # there may be a slot for the next one too
                    return True
                left_s = waiting.arrived_s + self.queue_timeout_s - now_s
                if left_s <= 0:
                    return False
                if first and self._writes_inside < self.write_limit:  # held back by the reads only
                    left_s = min(left_s, waiting.arrived_s + self.write_defer_s - now_s)
                waiting.wake = loop.create_future()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiting.wake, max(0.0, left_s))
        finally:
            if waiting in self._writes_waiting:  # timed out, or the client went away
                was_first = self._writes_waiting[0] is waiting
                self._writes_waiting.remove(waiting)
                if was_first:
                    self._wake_next_write()

    def _wake_next_write(self) -> None:
        if self._writes_waiting and not self._writes_waiting[0].wake.done():
            self._writes_waiting[0].wake.set_result(None)

    async def _refuse(self, scope: dict[str, Any], send: Any) -> None:
        log.warning("answered 503 to %s %s: no request slot came free in %.0f s", scope.get("method"),
                    scope.get("path"), self.queue_timeout_s)
        await self._busy(scope, send)

    async def _busy(self, scope: dict[str, Any], send: Any) -> None:
        message = f"Service busy: too many requests in progress. Please retry in {self.retry_after_s} s."
        if str(scope.get("path", "")).startswith("/api/"):
            body = json.dumps({"detail": message, "reason": "server_busy"}).encode()
            content_type = b"application/json"
        else:
            body, content_type = message.encode(), b"text/plain; charset=utf-8"
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", content_type), (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(self.retry_after_s).encode())]})
        await send({"type": "http.response.body", "body": body})
