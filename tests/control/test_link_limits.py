"""Agents are untrusted input (design §9.9): a message budget per session, unauthenticated attempts counted."""

from __future__ import annotations

import pytest
from control_helpers import FakeAgent, db, make_node

pytestmark = pytest.mark.timeout(30)


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_budget_lets_twenty_a_second_through_and_drops_the_rest() -> None:
    from portal.control.link.limits import SessionBudget

    clock = _Clock()
    budget = SessionBudget(clock=clock)
    passed = 0
    for _ in range(10):  # 100 messages a second for one second
        for _ in range(10):
            passed += budget.take()
        clock.t += 0.1
    assert 20 <= passed <= 40 and budget.dropped == 100 - passed  # the burst, then 20 a second
    clock.t += 5.0
    assert budget.take() and budget.strikes == 0  # a quiet spell: the flood is forgiven


def test_a_flood_that_persists_is_marked_for_closing_and_a_short_burst_is_not() -> None:
    from portal.control.link.limits import STRIKES_TO_CLOSE, SessionBudget

    clock = _Clock()
    budget = SessionBudget(clock=clock)
    for _ in range(STRIKES_TO_CLOSE - 1):
        for _ in range(60):
            budget.take()
        clock.t += 1.0
    assert not budget.persists
    for _ in range(60):
        budget.take()
    assert budget.persists


def test_warnings_are_sent_at_most_once_a_second() -> None:
    from portal.control.link.limits import SessionBudget

    clock = _Clock()
    budget = SessionBudget(clock=clock)
    assert budget.should_warn() and not budget.should_warn()
    clock.t += 1.0
    assert budget.should_warn()


def _counter(name: str) -> int:
    from portal.control.models import LinkCounter

    row = LinkCounter.objects.filter(name=name).first()
    return row.value if row else 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_unauthenticated_attempts_are_counted_not_written_row_by_row() -> None:
    from portal.control.link import limits
    from portal.control.models import RejectedMessage
    from portal.core.metrics import CampusCollector

    _, token = await db(make_node)("n1")
    await db(limits.flush)()  # counts other tests left in this process's memory
    before = await db(_counter)(limits.AUTH_REFUSED)
    for _ in range(3):
        assert not await FakeAgent(token + "x").connect()
    agent = FakeAgent(None)
    assert await agent.connect()
    await agent.send({"type": "hello", "token": "wrong"})
    await agent.comm.receive_output(timeout=3)  # closed
    await db(limits.flush)()
    assert await db(_counter)(limits.AUTH_REFUSED) - before == 4
    assert await db(RejectedMessage.objects.count)() == 0
    families = {f.name: f for f in await db(lambda: list(CampusCollector().collect()))()}
    samples = {s.labels["event"]: s.value for s in families["reclaimnet_agent_link_events"].samples}
    assert samples[limits.AUTH_REFUSED] == before + 4


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_flooding_agent_is_warned_its_excess_dropped_and_counted() -> None:
    from portal.control.link import limits
    from portal.core.models import Node

    node, token = await db(make_node)("n1")
    await db(limits.flush)()
    before = await db(_counter)(limits.MESSAGES_DROPPED)
    agent = FakeAgent(token)
    assert await agent.connect()
    await agent.hello()
    for seq in range(60):  # far more than 20 a second
        await agent.send({"type": "heartbeat", "seq": seq, "gpu_util": [], "egress": {}, "jobs": [],
                          "garbage": "x" * 10})
    warning = await agent.expect("error")
    assert "rate" in warning["reason"]
    await agent.close()
    await db(limits.flush)()
    dropped = await db(_counter)(limits.MESSAGES_DROPPED) - before
    assert 10 <= dropped <= 41  # 61 sent, 20 at once and 20 a second after
    assert (await db(Node.objects.get)(pk=node.pk)).state == "online"


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_agent_that_keeps_flooding_is_disconnected(monkeypatch: pytest.MonkeyPatch) -> None:
    from portal.control.link import consumers, limits

    ticks = [0.0]

    def clock() -> float:  # every look at the clock is 1/60 s later: the agent sends 60 messages a second
        ticks[0] += 1 / 60
        return 1000.0 + ticks[0]

    monkeypatch.setattr(limits, "new_budget", lambda: limits.SessionBudget(clock=clock))
    _, token = await db(make_node)("n1")
    agent = FakeAgent(token)
    assert await agent.connect()
    await agent.hello()
    for seq in range(60 * (limits.STRIKES_TO_CLOSE + 2)):
        await agent.send({"type": "heartbeat", "seq": seq, "gpu_util": [], "egress": {}, "jobs": []})
    while True:
        out = await agent.comm.receive_output(timeout=10)
        if out["type"] == "websocket.close":
            break
    assert out["code"] == consumers.CLOSE_FLOODING


def test_messages_are_charged_when_they_arrived_not_when_they_are_handled() -> None:
    from portal.control.link.limits import RATE_PER_S, SessionBudget

    clock = _Clock()
    budget = SessionBudget(clock=clock)
    arrivals = [clock.t + k * 0.1 for k in range(60)]  # 10 a second for 6 s, all handled at once afterwards
    clock.t += 10.0
    assert all(budget.take(at) for at in arrivals) and budget.dropped == 0
    flood = [clock.t + k / (3 * RATE_PER_S) for k in range(60)]  # three times the rate, stamped as it arrived
    assert sum(budget.take(at) for at in flood) < 60 and budget.dropped > 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_backlog_behind_a_stalled_consumer_is_not_taken_for_a_flood(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import threading

    from portal.control.link import handlers, limits

    _, token = await db(make_node)("n1")
    await db(limits.flush)()
    before = await db(_counter)(limits.MESSAGES_DROPPED)
    released = threading.Event()
    real_hello = handlers.hello

    def stalled_hello(*args: object, **kwargs: object) -> object:  # the database is busy: the hello waits
        released.wait(30)
        return real_hello(*args, **kwargs)

    monkeypatch.setattr(handlers, "hello", stalled_hello)
    agent = FakeAgent(token)
    assert await agent.connect()
    await agent.send({"type": "hello", "agent_version": "test", "data_host": "127.0.0.1", "data_port": 9000,
                      "jobs": [], "gpus": []})
    for seq in range(2 * int(limits.BURST)):  # 10 a second, half the budget; queued behind the hello
        await agent.send({"type": "heartbeat", "seq": seq, "gpu_util": [], "egress": {}, "jobs": []})
        await asyncio.sleep(0.1)
    released.set()
    await agent.expect("welcome", timeout_s=10)
    acks = [await agent.expect("heartbeat_ack", timeout_s=10) for _ in range(2 * int(limits.BURST))]
    assert [a["seq"] for a in acks] == list(range(2 * int(limits.BURST)))
    assert not any(m.get("type") == "error" for m in agent.seen)
    await agent.close()
    await db(limits.flush)()
    assert await db(_counter)(limits.MESSAGES_DROPPED) == before
