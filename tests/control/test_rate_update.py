"""A running transfer follows a P3 rate update (design §4 joint re-planning), measured on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nodeagent.agent import Agent
from nodeagent.edge import Edge, TokenBucket
from nodeagent.transfer import Expected, Receiver, SendControl, send_checkpoint, token_hash

pytestmark = pytest.mark.timeout(30)

SLOW = 300_000.0  # bytes/s
FAST = 3_000_000.0
WINDOW_S = 0.6


async def _bytes_over_window(part: Path, window_s: float) -> int:
    before = part.stat().st_size if part.exists() else 0
    await asyncio.sleep(window_s)
    return (part.stat().st_size if part.exists() else 0) - before


@pytest.mark.asyncio
async def test_running_transfer_speeds_up_and_slows_down_after_set_rate(tmp_path: Path) -> None:
    size = 4_000_000
    src = tmp_path / "ckpt.bin"
    src.write_bytes(os.urandom(size))
    manifest = {"sequence": 1, "step": 1, "size_bytes": size, "sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
                "file": "ckpt.bin", "taken_at": time.time(), "final": True, "compat": {}}
    received: list[str] = []

    async def on_received(tid: str, m: dict[str, Any]) -> None:
        received.append(tid)

    rx = Receiver(tmp_path / "dst", on_received)
    host, port = await rx.start("127.0.0.1", 0)
    rx.expect(Expected("t1", token_hash("tok"), "9", 1, manifest["sha256"], size, time.time() + 60))
    edge = Edge(None, "off")
    control = SendControl(SLOW, "migration")
    # The agent's command handler, without a portal: it finds the transfer's knobs by id.
    agent = SimpleNamespace(sending={"t1": control}, edge=edge)
    task = asyncio.create_task(send_checkpoint(
        host=host, port=port, transfer_id="t1", token="tok", ckpt_path=src, manifest=manifest,
        rate_bytes_per_s=SLOW, flow_class="migration", edge=edge, control=control))
    part = tmp_path / "dst" / "incoming" / "t1.part"
    try:
        await asyncio.sleep(0.5)  # past the initial burst
        slow = await _bytes_over_window(part, WINDOW_S)
        await Agent._cmd_set_rate(agent, {"type": "set_rate", "transfer_id": "t1", "rate_bytes_per_s": FAST})
        await asyncio.sleep(0.05)
        fast = await _bytes_over_window(part, WINDOW_S)
        await Agent._cmd_set_rate(agent, {"type": "set_rate", "transfer_id": "t1", "rate_bytes_per_s": SLOW})
        await asyncio.sleep(0.1)
        slow_again = await _bytes_over_window(part, WINDOW_S)
        await Agent._cmd_set_rate(agent, {"type": "set_rate", "transfer_id": "t1", "rate_bytes_per_s": 1e9})
        result = await asyncio.wait_for(task, 20)
    finally:
        await rx.close()
    assert result.ok and received == ["t1"]
    assert slow <= 1.5 * SLOW * WINDOW_S + 64 * 1024
    assert fast >= 0.6 * FAST * WINDOW_S and fast > 4 * slow
    assert slow_again <= 1.5 * SLOW * WINDOW_S + 64 * 1024


@pytest.mark.asyncio
async def test_token_bucket_set_rate_keeps_earned_tokens_and_accepts_unpaced() -> None:
    bucket = TokenBucket(1000.0, burst_bytes=1000)
    bucket.set_rate(None)
    assert bucket.rate_bytes_per_s is None
    bucket.set_rate(5e6)
    start = time.monotonic()
    for _ in range(10):
        await bucket.consume(50_000)
    assert 0.05 < time.monotonic() - start < 0.3  # ~0.1 s at 5 MB/s


@pytest.mark.asyncio
async def test_set_rate_for_an_unknown_or_invalid_transfer_is_ignored() -> None:
    control = SendControl(1000.0)
    agent = SimpleNamespace(sending={"t1": control}, edge=Edge(None, "off"))
    await Agent._cmd_set_rate(agent, {"type": "set_rate", "transfer_id": "t2", "rate_bytes_per_s": 5.0})
    await Agent._cmd_set_rate(agent, {"type": "set_rate", "transfer_id": "t1", "rate_bytes_per_s": -1})
    await Agent._cmd_set_rate(agent, {"type": "set_rate", "transfer_id": "t1", "rate_bytes_per_s": True})
    assert control.rate_bytes_per_s == 1000.0


def test_set_rate_command_fields_are_validated() -> None:
    import uuid

    from portal.control.link.protocol import ProtocolError, set_rate_fields

    tid, did = str(uuid.uuid4()), str(uuid.uuid4())
    assert set_rate_fields(tid, 5, did) == {"transfer_id": tid, "rate_bytes_per_s": 5.0, "decision_id": did}
    for bad in ((tid, 0.0, did), (tid, float("inf"), did), (tid, float("nan"), did), (tid, True, did),
                ("../x", 5.0, did), (tid, 5.0, "nope")):
        with pytest.raises(ProtocolError):
            set_rate_fields(*bad)


def test_kernel_shaped_flow_is_updated_in_place() -> None:
    """With a kernel backend the flow's rate changes through ``set_flows`` (the userspace pacer is unpaced)."""
    pytest.importorskip("nodeagent.enforcement.api")

    class FakeEnforcer:
        def __init__(self) -> None:
            self.flows: list[Any] = []

        def set_flows(self, flows: list[Any], *, replace: bool = False) -> None:
            self.flows.extend(flows)

    edge = Edge(None, "off")
    fake = FakeEnforcer()
    edge._enforcer = fake
    pacer = edge.pacer("127.0.0.1", 9000, "migration", 1000.0)
    assert pacer.rate_bytes_per_s is None
    control = SendControl(1000.0, "migration", ("127.0.0.1", 9000), pacer)
    control.set_rate(edge, 5000.0)
    assert len(fake.flows) == 2 and control.rate_bytes_per_s == 5000.0
    assert fake.flows[1].rate_bytes_per_s == 5000 and fake.flows[1].dst_port == 9000
    assert pacer.rate_bytes_per_s is None
    edge._enforcer = None
