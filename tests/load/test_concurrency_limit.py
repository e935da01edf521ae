"""The ASGI bound on requests inside Django (portal/core/middleware.py ``ConcurrencyLimit``, wrapped around the
HTTP application in portal/asgi.py): at most ``limit`` reads and ``limit`` writes run at once, the rest wait in
arrival order, a burst of writes does not hold reads back, and a request that waited too long is answered 503 +
Retry-After. Driven with a stand-in application that holds each request until the test releases it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from portal.core.middleware import ConcurrencyLimit


class _Held:
    """An ASGI app that records who is inside and answers 200 when the test opens the gate."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.entered: list[str] = []
        self.most_inside = 0
        self.gate = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.inside.append(scope["path"])
        self.entered.append(scope["path"])
        self.most_inside = max(self.most_inside, len(self.inside))
        await self.gate.wait()
        self.inside.remove(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def _request(app: Any, method: str, path: str) -> dict[str, Any]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": method, "path": path, "headers": []}, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return {"status": start["status"], "headers": dict(start["headers"]), "body": body}


@pytest.mark.asyncio
async def test_at_most_limit_reads_run_at_once_and_the_rest_wait_their_turn_in_order() -> None:
    inner = _Held()
    app = ConcurrencyLimit(inner, limit=2, queue_timeout_s=30.0, retry_after_s=2)
    tasks = [asyncio.create_task(_request(app, "GET", f"/r{i}")) for i in range(6)]
    await asyncio.sleep(0.05)
    assert inner.entered == ["/r0", "/r1"]
    inner.gate.set()
    answers = await asyncio.gather(*tasks)
    assert [a["status"] for a in answers] == [200] * 6
    assert inner.most_inside == 2 and inner.entered == [f"/r{i}" for i in range(6)]


@pytest.mark.asyncio
async def test_a_burst_of_writes_does_not_hold_reads_back() -> None:
    inner = _Held()
    app = ConcurrencyLimit(inner, limit=2, queue_timeout_s=30.0, retry_after_s=2)
    writes = [asyncio.create_task(_request(app, "POST", f"/w{i}")) for i in range(10)]
    await asyncio.sleep(0.05)
    read = asyncio.create_task(_request(app, "GET", "/r"))
    await asyncio.sleep(0.05)
    assert "/r" in inner.inside and len(inner.inside) == 3  # two writes and the read
    inner.gate.set()
    await asyncio.gather(read, *writes)


@pytest.mark.asyncio
async def test_a_request_that_waited_too_long_is_answered_503_with_retry_after() -> None:
    inner = _Held()
    app = ConcurrencyLimit(inner, limit=1, queue_timeout_s=0.1, retry_after_s=7)
    held = asyncio.create_task(_request(app, "GET", "/api/jobs/"))
    await asyncio.sleep(0.02)
    api, page = await asyncio.gather(_request(app, "GET", "/api/nodes/"), _request(app, "GET", "/dashboard/"))
    assert api["status"] == page["status"] == 503
    assert api["headers"][b"retry-after"] == page["headers"][b"retry-after"] == b"7"
    assert json.loads(api["body"])["reason"] == "server_busy"
    assert page["headers"][b"content-type"].startswith(b"text/plain")
    inner.gate.set()
    assert (await held)["status"] == 200
    assert (await _request(app, "GET", "/api/nodes/"))["status"] == 200  # the slot came back


@pytest.mark.asyncio
async def test_a_zero_limit_bounds_nothing() -> None:
    inner = _Held()
    app = ConcurrencyLimit(inner, limit=0, queue_timeout_s=0.1, retry_after_s=2)
    tasks = [asyncio.create_task(_request(app, "GET", f"/r{i}")) for i in range(5)]
    await asyncio.sleep(0.05)
    assert len(inner.inside) == 5
    inner.gate.set()
    await asyncio.gather(*tasks)


@pytest.mark.asyncio
async def test_fewer_writes_than_reads_run_at_once_when_the_write_limit_is_lower() -> None:
    inner = _Held()
    app = ConcurrencyLimit(inner, limit=3, queue_timeout_s=30.0, retry_after_s=2, write_limit=1)
    writes = [asyncio.create_task(_request(app, "POST", f"/w{i}")) for i in range(4)]
    reads = [asyncio.create_task(_request(app, "GET", f"/r{i}")) for i in range(4)]
    await asyncio.sleep(0.05)
    assert sorted(inner.inside) == ["/r0", "/r1", "/r2", "/w0"]
    inner.gate.set()
    assert [a["status"] for a in await asyncio.gather(*writes, *reads)] == [200] * 8


class _Released(_Held):
    """As ``_Held``, but each request waits for its own release (``release(path)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.gates: dict[str, asyncio.Event] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.gate = self.gates.setdefault(scope["path"], asyncio.Event())
        await super().__call__(scope, receive, send)

    def release(self, path: str) -> None:
        self.gates.setdefault(path, asyncio.Event()).set()


@pytest.mark.asyncio
async def test_while_pages_are_read_fewer_writes_are_let_in_and_all_of_them_once_the_reads_are_done() -> None:
    inner = _Released()
    app = ConcurrencyLimit(inner, limit=4, queue_timeout_s=30.0, retry_after_s=2, write_limit=4,
                           write_limit_under_reads=1)
    read = asyncio.create_task(_request(app, "GET", "/r"))
    await asyncio.sleep(0.02)
    writes = [asyncio.create_task(_request(app, "POST", f"/w{i}")) for i in range(6)]
    await asyncio.sleep(0.05)
    assert sorted(inner.inside) == ["/r", "/w0"]  # one write beside the read
    inner.release("/r")
    await read
    await asyncio.sleep(0.05)
    assert sorted(inner.inside) == ["/w0", "/w1", "/w2", "/w3"]  # no read left: the full write limit, in order
    for i in range(6):
        inner.release(f"/w{i}")
    assert [a["status"] for a in await asyncio.gather(*writes)] == [200] * 6
    assert inner.entered == ["/r"] + [f"/w{i}" for i in range(6)]


@pytest.mark.asyncio
async def test_a_providers_kill_switch_goes_ahead_of_a_burst_of_submits_and_past_the_reads() -> None:
    """A reclaim or kill-switch never waits behind queued submits, nor for the reads (design §10)."""
    inner = _Released()
    app = ConcurrencyLimit(inner, limit=4, queue_timeout_s=30.0, retry_after_s=2, write_limit=3,
                           write_limit_under_reads=1)
    read = asyncio.create_task(_request(app, "GET", "/r"))
    await asyncio.sleep(0.02)
    submits = [asyncio.create_task(_request(app, "POST", "/api/jobs/")) for _ in range(5)]
    await asyncio.sleep(0.05)
    assert inner.inside.count("/api/jobs/") == 1  # one write beside the read; four submits wait
    urgent = ["/api/nodes/7/killswitch/", "/provider/nodes/7/reclaim/emergency/"]
    kills = [asyncio.create_task(_request(app, "POST", path)) for path in urgent]
    await asyncio.sleep(0.05)
    assert sorted(p for p in inner.inside if p != "/api/jobs/") == sorted(["/r", *urgent])
    assert inner.inside.count("/api/jobs/") == 1  # the submits still wait for the read
    inner.release("/r")
    for path in ("/api/jobs/", *urgent):
        inner.release(path)
    assert [a["status"] for a in await asyncio.gather(read, *kills, *submits)] == [200] * 8


@pytest.mark.asyncio
async def test_a_write_held_back_by_reads_gets_in_after_the_deferral_and_none_times_out() -> None:
    inner = _Released()
    app = ConcurrencyLimit(inner, limit=4, queue_timeout_s=0.6, retry_after_s=2, write_limit=3,
                           write_limit_under_reads=1, write_defer_s=0.1)
    reads = [asyncio.create_task(_request(app, "GET", f"/r{i}")) for i in range(2)]
    await asyncio.sleep(0.02)
    writes = [asyncio.create_task(_request(app, "POST", f"/w{i}")) for i in range(3)]
    await asyncio.sleep(0.02)
    assert sorted(inner.inside) == ["/r0", "/r1", "/w0"]
    await asyncio.sleep(0.3)  # past the deferral: the waiting writes fill the write limit, reads or not
    assert sorted(inner.inside) == ["/r0", "/r1", "/w0", "/w1", "/w2"]
    for path in ("/r0", "/r1", "/w0", "/w1", "/w2"):
        inner.release(path)
    assert [a["status"] for a in await asyncio.gather(*reads, *writes)] == [200] * 5


@pytest.mark.asyncio
async def test_a_write_that_leaves_the_queue_lets_the_next_one_in() -> None:
    inner = _Released()
    app = ConcurrencyLimit(inner, limit=2, queue_timeout_s=30.0, retry_after_s=2, write_limit=1)
    first = asyncio.create_task(_request(app, "POST", "/w0"))
    await asyncio.sleep(0.02)
    gone = asyncio.create_task(_request(app, "POST", "/w1"))
    last = asyncio.create_task(_request(app, "POST", "/w2"))
    await asyncio.sleep(0.02)
    gone.cancel()  # the client went away while waiting
    inner.release("/w0")
    inner.release("/w2")
    assert [(await first)["status"], (await last)["status"]] == [200, 200]
    assert inner.entered == ["/w0", "/w2"]
