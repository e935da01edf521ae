"""The portal's ASGI HTTP handler: each request crosses from the event loop into a thread once and back once
(docs/design.md §10).

Django's own ``ASGIHandler`` runs the ``request_started`` signal, the middleware chain, the view and
``response.close()`` each through ``sync_to_async`` (with an async-capable middleware in the chain, through
``async_to_sync`` and back again), in a thread it creates for every request (asgiref's
``ThreadSensitiveContext``): about eight hops between the event loop and a thread per request, each a wake-up of
the loop and a hand-over of the interpreter lock, plus a thread started and stopped. Under ``make load`` that was
about half of the CPU time of a small read such as ``GET /api/me/``.

Here the whole request — ``request_started``, the middleware chain loaded in its synchronous form (as under
WSGI), the view, and for an ordinary response ``close()`` with ``request_finished`` (database connections back
to the pool) — runs as one call in a thread of a fixed pool, as a threaded WSGI server would run it; the loop
only reads the body and writes the answer. A streaming response (a static file) is closed after it is sent.
Like asgiref's ``sync_to_async``, the call carries the caller's context variables and lets synchronous code in
it reach the event loop with ``async_to_sync`` (the in-memory channel layer of the embedded default).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import SyncToAsync
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse, HttpResponseBase
from django.urls import set_script_prefix


class PortalHttpHandler(ASGIHandler):
    """Django's ASGI handler with a synchronous middleware chain run in one thread hop per request."""

    def __init__(self, threads: int) -> None:
        base.BaseHandler.__init__(self)  # not ASGIHandler.__init__: it loads the asynchronous chain
        self.load_middleware(is_async=False)
        self.executor = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="http")
        self._respond_in_thread = SyncToAsync(self._respond, thread_sensitive=False, executor=self.executor)
        self._close_in_thread = SyncToAsync(self._close, thread_sensitive=False, executor=self.executor)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            response = await self._respond_in_thread(scope, body_file)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client went away while the answer was being sent
            finally:
                if response.streaming:
                    await self._close_in_thread(response)
        finally:
            body_file.close()

    def _respond(self, scope: dict[str, Any], body_file: Any) -> HttpResponseBase:
        """The synchronous part of one request, in a pool thread; an ordinary response comes back closed."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)
        response._handler_class = self.__class__  # request_finished names this handler
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size
        if not response.streaming:
            response.close()  # request_finished: connections back to the pool before the answer is written
        return response

    @staticmethod
    def _close(response: HttpResponseBase) -> None:
        response.close()
