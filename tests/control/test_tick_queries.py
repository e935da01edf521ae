"""The control tick reads and writes the campus in a fixed number of SQL statements (``make bench-tick`` times it).

Two campuses built like the benchmark's (``scripts/tickcampus.py``), 50 and 200 nodes, each run to a steady state
(the first ticks send every job its interval and write every estimate); one more tick is then counted with
Django's query capture. The counts must be equal: a per-node or per-job query anywhere in the tick would make the
200-node count larger.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import pytest
from control_helpers import load_script
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db


def _tickcampus() -> Any:
    return load_script("tickcampus")


class _Undo(Exception):  # noqa: N818
    pass


def _steady_tick_statements(n_nodes: int) -> tuple[int, list[str]]:
    from portal.control.loop import ticks
    tickcampus = _tickcampus()
    context = ticks.TickContext(started_monotonic=float("-inf"))  # long past the restart grace
    rng = random.Random(n_nodes)
    try:
        with transaction.atomic():
            built = tickcampus.build(n_nodes, samples_per_link=5)
            assert built.running_jobs > n_nodes  # ~80 % of the GPUs are busy
            start = timezone.now()
            for k in range(3):  # control periods of 10 s on an injected clock: every tick sees new samples
                now = start + dt.timedelta(seconds=10 * k)
                tickcampus.agents_report(now, rng)
                ticks.control_tick(now, context)
            now = start + dt.timedelta(seconds=30)
            tickcampus.agents_report(now, rng)
            with CaptureQueriesContext(connection) as captured:
                ticks.control_tick(now, context)
            raise _Undo(len(captured.captured_queries), [q["sql"][:120] for q in captured.captured_queries])
    except _Undo as done:
        return done.args[0], done.args[1]


def test_the_tick_issues_as_many_statements_at_200_nodes_as_at_50() -> None:
    small, small_sql = _steady_tick_statements(50)
    large, large_sql = _steady_tick_statements(200)
    assert small == large, "\n".join(sorted(set(large_sql) - set(small_sql)) or large_sql)
    assert small < 40


def test_no_node_is_declared_lost_in_the_first_heartbeat_timeout_after_a_restart() -> None:
    from control_helpers import make_node

    from portal.control.loop import ticks
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import Node

    node, _ = make_node("silent")
    node_lifecycle.come_online(node)  # and never a heartbeat
    ticks.control_tick(context=ticks.TickContext())  # the control plane just (re)started
    assert Node.objects.get(pk=node.pk).state == "online"
    ticks.control_tick(context=ticks.TickContext(started_monotonic=float("-inf")))
    assert Node.objects.get(pk=node.pk).state == "offline"
