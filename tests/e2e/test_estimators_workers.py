"""The estimators survive prefork and restarts (docs/design.md §9.5): the control tick runs on a Celery worker
with two prefork children, each replaced after a few tasks (so consecutive ticks run in many processes, none of
which saw the ones before), fed departures, availability changes and bandwidth samples for half a minute; the
worker is killed midway and started again. At the end the shared
state equals what one uninterrupted process computes from the same records, stepping through them second by
second, and what a rebuild from the records alone computes.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

FEED_S = 14.0


def _feed(nodes: list[Any], rng: random.Random, until: float) -> None:
    """Records as agents and providers produce them: samples, departures, nodes going away and coming back."""
    from django.utils import timezone

    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import BandwidthSample, Node, ReclaimEvent

    while time.monotonic() < until:
        node = Node.objects.get(pk=rng.choice(nodes).pk)
        roll = rng.random()
        if roll < 0.6:
            BandwidthSample.objects.create(link_id=node.access_link_id, node=node, sampled_at=timezone.now(),
                                           bytes_per_s=rng.uniform(0.05, 0.9) * 125e6)
        elif roll < 0.75:
            ReclaimEvent.objects.create(node=node, kind="emergency", notice_s=0, deadline_at=timezone.now(),
                                        finished_at=timezone.now())
        elif node.state == "online":
            node_lifecycle.go_offline(node)
        elif node.state == "offline":
            node_lifecycle.come_online(node)
        time.sleep(rng.uniform(0.05, 0.3))


def _children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (the worker's prefork children, which this test started)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _reap(pids: list[int], timeout_s: float = 10.0) -> None:
    """Children of a killed worker notice their parent is gone and exit; those that do not are killed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)


@pytest.mark.django_db(transaction=True)
def test_shared_estimates_equal_one_uninterrupted_process(django_db_blocker: Any) -> None:
    from portal.control.loop import estimates
    from portal.control.models import EstimatorSnapshot
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import Node, NodeAvailability

    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")) or \
            not os.environ.get("REDIS_URL"):
        pytest.skip("needs PostgreSQL and Redis")
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-estimators-"))
    redis_url = harness.redis_db(os.environ["REDIS_URL"], 6)  # its own: 5 is tests/load's (another serial group)
    restore_broker = harness.use_broker(redis_url)
    stack = harness.Stack(workdir, harness.stack_database_url(), redis_url, heartbeat_timeout_s=3600.0,
                          control_period_s=0.5, extra_env={"RECLAIMNET_ESTIMATOR_SNAPSHOT_PERIOD_S": "1"})
    try:
        stack.flush_redis()
        made = harness.make_campus([(f"est-{i}", "AB"[i % 2]) for i in range(6)], gpus_per_node=1)
        nodes = list(Node.objects.filter(pk__in=[pk for pk, _ in made.values()]).order_by("pk"))
        for node in nodes:
            node_lifecycle.come_online(node)
        began = NodeAvailability.objects.order_by("at").first().at
        stack.start_beat()
        recycled = ("--max-tasks-per-child", "4")
        first = stack.start_worker("estimators", beat=False, pool="prefork", concurrency=2, extra_args=recycled)
        rng = random.Random(11)
        _feed(nodes, rng, time.monotonic() + FEED_S / 2)
        # its prefork children (replaced every 4 tasks: both may be between lives at one instant)
        children = harness.wait_for(lambda: _children(first.popen.pid), 10, what="the worker's prefork children")
        first.signal(signal.SIGKILL)  # midway, without warning
        first.popen.wait(10)
        _reap(children)
        second = stack.start_worker("estimators-again", beat=False, pool="prefork", concurrency=2,
                                    extra_args=recycled)
        _feed(nodes, rng, time.monotonic() + FEED_S / 2)
        fed_until = time.time()

        def caught_up() -> bool:
            snapshot = EstimatorSnapshot.objects.filter(key="campus").first()
            return snapshot is not None and snapshot.until.timestamp() > fed_until + 0.5

        harness.wait_for(caught_up, 60, what="the shared estimator state past the last record")
        second.stop()
        stack.procs["beat"].stop()
        for proc in (first, second):  # the ticks ran in many processes of each worker
            processes = set(re.findall(r"ForkPoolWorker-(\d+)\] Task control\.tick\[[^]]+\] succeeded",
                                       proc.log_path.read_text(errors="replace")))
            assert len(processes) >= 4, proc.tail()

        shared = estimates.EstimatorState.from_snapshot(EstimatorSnapshot.objects.get(key="campus"))
        end_s = shared.until_s
        layout = estimates.campus_layout()
        assert [pk for pk, _ in shared.nodes] == [pk for pk, _ in layout[0]]
        # One uninterrupted process: from before the first record, a second at a time to the same instant.
        uninterrupted = estimates.rebuild(*layout, estimates.clock_s(began - dt.timedelta(seconds=1)))
        while uninterrupted.until_s < end_s:
            estimates.advance(uninterrupted, min(end_s, uninterrupted.until_s + 1.0))
        from_records = estimates.rebuild(*layout, end_s)
        assert shared.hazard.to_arrays()["events"].sum() > 3  # departures were counted
        for reference in (uninterrupted, from_records):
            np.testing.assert_allclose(shared.hazard.hourly_profile_upper_per_s(end_s),
                                       reference.hazard.hourly_profile_upper_per_s(end_s), rtol=1e-9)
            np.testing.assert_allclose(shared.hazard.hourly_profile_per_s(end_s),
                                       reference.hazard.hourly_profile_per_s(end_s), rtol=1e-9)
            fresh = estimates.fresh_links(reference)
            assert fresh.any() and (estimates.fresh_links(shared) == fresh).all()
            np.testing.assert_allclose(shared.bandwidth.mean_bytes_per_s()[fresh],
                                       reference.bandwidth.mean_bytes_per_s()[fresh], rtol=1e-9)
            np.testing.assert_allclose(shared.bandwidth.lower_bytes_per_s()[fresh],
                                       reference.bandwidth.lower_bytes_per_s()[fresh], rtol=1e-9, atol=1e-3)
            assert (shared.lent == reference.lent).all()
    finally:
        stack.stop_all()
        restore_broker()
        shutil.rmtree(workdir, ignore_errors=True)
