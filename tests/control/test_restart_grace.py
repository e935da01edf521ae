"""Restarts are not failures (design §9.10): heartbeat silence is judged only over time the agent link served.

Every test drives the link-server rows (:mod:`portal.control.link.presence`) and the tick's heartbeat check on an
injected clock; nothing sleeps.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from control_helpers import make_node

pytestmark = pytest.mark.django_db

TIMEOUT_S = 10.0
START = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    """The injected clock: ``seconds`` after START."""
    return START + dt.timedelta(seconds=seconds)


@pytest.fixture
def timeout(settings: Any) -> float:
    settings.RECLAIMNET = {**settings.RECLAIMNET, "HEARTBEAT_TIMEOUT_S": TIMEOUT_S}
    return TIMEOUT_S


def _online_node(name: str, last_heartbeat_at: dt.datetime) -> Any:
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import Node

    node, _ = make_node(name)
    node_lifecycle.come_online(node)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=last_heartbeat_at)
    return node


def _beats(name: str, start: dt.datetime, first_s: float, last_s: float, every_s: float = 2.0) -> None:
    """Link server ``name`` beats every ``every_s`` from ``first_s`` to ``last_s`` after ``start``."""
    from portal.control.link import presence

    t = first_s
    while t <= last_s:
        presence.beat(name, start, now=start + dt.timedelta(seconds=t))
        t += every_s


def _state(node: Any) -> str:
    from portal.core.models import Node

    return Node.objects.get(pk=node.pk).state


def _lost(now: dt.datetime) -> list[int]:
    from portal.control.loop import ticks

    return ticks.detect_lost_heartbeats(float("-inf"), now)


def test_a_daphne_restart_while_the_worker_runs_declares_no_node_lost_within_the_grace(timeout: float) -> None:
    """The old daphne beat until t=100 and died; the new one beats from t=104. Agents were silent from t=99 (the
    restart) and come back around t=105: no tick in between, nor during grace + timeout after t=104, finds one
    lost, though their last heartbeats are far older than the timeout."""
    from portal.control.link import presence

    start = START
    _beats("old", start, 0, 100)
    _beats("new", start, 104, 130)
    nodes = [_online_node(f"n{k}", at(99)) for k in range(3)]
    for t in (101, 103, 105, 110, 115, 120, 125, 104 + presence.RECONNECT_GRACE_S + timeout - 0.5):
        assert _lost(at(t)) == [], t
    assert [_state(n) for n in nodes] == ["online"] * 3


def test_while_no_link_server_serves_nobody_is_declared_lost(timeout: float) -> None:
    """The only daphne died at t=100 and has not come back: at t=300 the portal has heard nothing for 200 s,
    but it was not listening — silence is not evidence."""
    start = START
    _beats("only", start, 0, 100)
    node = _online_node("n", start + dt.timedelta(seconds=99))
    assert _lost(start + dt.timedelta(seconds=300)) == []
    assert _state(node) == "online"


def test_a_really_dead_agent_is_still_declared_lost_after_grace_and_timeout(timeout: float) -> None:
    """Same daphne restart; one agent never reconnects. It stays online through grace + timeout after the
    link came back, and is declared lost right after; the agents that reconnected are not."""
    from portal.control.link import presence
    from portal.core.models import Node

    start = START
    _beats("old", start, 0, 100)
    _beats("new", start, 104, 160)
    dead = _online_node("dead", at(99))
    back = _online_node("back", at(99))
    deadline_s = 104 + presence.RECONNECT_GRACE_S + timeout
    for t in range(106, 160, 2):  # the reconnected agent's heartbeats, every 2 s
        Node.objects.filter(pk=back.pk).update(last_heartbeat_at=at(t))
        if t + 2 < deadline_s:
            _lost(at(t + 1))
            assert _state(dead) == "online", t
    _lost(at(deadline_s + 1))
    assert _state(dead) == "offline"
    assert _state(back) == "online"


def test_a_database_outage_restarts_the_link_evidence(timeout: float) -> None:
    """The database was down from t=50 to t=80: no beat and no heartbeat could be written. When it is back the
    first tick (before the daphne's next beat) finds no server serving, and the ticks after it count silence
    from the daphne's first beat after the outage, not from the heartbeats missed while it was down."""
    from portal.control.link import presence

    start = START
    _beats("d", start, 0, 50)
    node = _online_node("n", at(49))
    assert _lost(at(80)) == []  # the tick got the database first: the link is not serving
    _beats("d", start, 80.5, 120)  # beating again; serving since 80.5
    assert presence.evidence(at(81)).since == at(80.5)
    assert _lost(at(81)) == []
    assert _lost(at(80.5 + presence.RECONNECT_GRACE_S + timeout - 0.5)) == []
    assert _state(node) == "online"


def test_a_heartbeat_that_could_not_be_recorded_interrupts_the_link(timeout: float) -> None:
    """A beat that follows a failed heartbeat write restarts ``serving_since`` though the beats were on time."""
    from portal.control.link import presence

    start = START
    _beats("d", start, 0, 40)
    assert presence.evidence(at(41)).since == at(0)
    presence.beat("d", start, interrupted=True, now=at(42))
    assert presence.evidence(at(43)).since == at(42)
    presence.beat("d", start, now=at(44))
    assert presence.evidence(at(45)).since == at(42)


def test_without_link_server_rows_silence_alone_is_judged(timeout: float) -> None:
    """No link server ever recorded itself in this database: a silent node is lost after the timeout."""
    start = START
    node = _online_node("n", start)
    _lost(start + dt.timedelta(seconds=timeout - 1))
    assert _state(node) == "online"
    _lost(start + dt.timedelta(seconds=timeout + 1))
    assert _state(node) == "offline"


def test_rows_of_servers_gone_a_day_are_pruned_only_while_another_serves() -> None:
    from portal.control.link import presence
    from portal.control.models import LinkServer

    start = START
    _beats("gone", start, 0, 10)
    later = start + dt.timedelta(seconds=presence.KEEP_DEAD_S + 60)
    assert presence.prune(later) == 0  # nothing serves: the dead row is the evidence that the link is down
    presence.beat("new", start, now=later)
    assert presence.prune(later) == 1
    assert list(LinkServer.objects.values_list("name", flat=True)) == ["new"]


def test_agents_reconnect_quickly_and_jittered_then_back_off_to_their_maximum() -> None:
    """Within the first seconds of an outage (a portal restart) an agent retries within a second, at a random
    point (500 agents do not come back at once); later the wait doubles up to reconnect_max_s."""
    from nodeagent.agent import QUICK_RECONNECT_MAX_S, QUICK_RECONNECT_S, reconnect_delay_s

    quick = [reconnect_delay_s(3.0, 0, 0.2, 10.0, r) for r in (0.0, 0.5, 0.999)]
    assert quick[0] == pytest.approx(0.2) and quick[0] < quick[1] < quick[2] <= QUICK_RECONNECT_MAX_S
    late = [reconnect_delay_s(QUICK_RECONNECT_S + 1, k, 0.2, 10.0, 0.999) for k in range(8)]
    assert late == sorted(late) and late[1] > QUICK_RECONNECT_MAX_S
    assert late[-1] == pytest.approx(10.0, abs=0.01)
