"""Exactly once on many workers (docs/design.md §8): seven reclaims pressed at the same moment, each also
delivered twice (a redelivered message), handled by two worker processes — first one prefork worker with two
children, then two separate worker commands as two hosts would run them — with beat (tick and outbox relay) on
its own. Every source agent receives exactly one final ``checkpoint`` command per job, every job moved has
exactly one placement decision, and no destination GPU is handed out twice.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import pytest
from simagents import RecordingAgents

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

RECLAIMS = 7
NOTICE_S = 120.0  # long enough that no deadline fires while the test counts


@pytest.mark.django_db
def test_runs_on_the_test_database() -> None:
    """Makes pytest-django create the test database (see test_e2e_migration)."""
    from django.conf import settings

    assert settings.DATABASES["default"]["NAME"].startswith("test_")


@pytest.fixture(scope="module")
def campus(django_db_setup: Any, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    """daphne, beat on its own, and 28 one-GPU nodes with recording agents (two rounds of 7 sources and 7
    destinations); the workers are started by each test."""
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")) or \
            not os.environ.get("REDIS_URL"):
        pytest.skip("needs PostgreSQL and Redis")
    database_url = harness.stack_database_url()
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-workers-"))
    redis_url = harness.redis_db(os.environ["REDIS_URL"], 4)
    restore_broker = harness.use_broker(redis_url)
    with django_db_blocker.unblock():
        st = harness.Stack(workdir, database_url, redis_url, heartbeat_timeout_s=30.0)
        st.flush_redis()
        names = [(f"mw-{role}{round_}-{i}", "AB"[i % 2]) for round_ in (1, 2) for role in ("src", "dst")
                 for i in range(RECLAIMS)]
        nodes = harness.make_campus(names, gpus_per_node=1)
        sims = RecordingAgents("", {})
        try:
            st.start_portal()
            st.start_beat()
            sims = RecordingAgents(st.portal_ws, {pk: token for pk, token in nodes.values()})
            sims.start()
            from portal.core.models import Node

            harness.wait_for(lambda: Node.objects.filter(name__startswith="mw-", state="online").count()
                             == len(nodes), 60, what="28 simulated agents online")
            yield {"stack": st, "nodes": nodes, "sims": sims}
        finally:
            try:
                sims.stop()
            finally:
                st.stop_all()
                restore_broker()
                if os.environ.get("RECLAIMNET_E2E_KEEP"):
                    print(f"logs kept in {workdir}")
                else:
                    shutil.rmtree(workdir, ignore_errors=True)


def _running_job(node_id: int, name: str) -> Any:
    from django.contrib.auth import get_user_model

    from portal.core.lifecycle import jobs as job_lifecycle
    from portal.core.models import Job, Placement, ResearchGroup

    group, _ = ResearchGroup.objects.get_or_create(slug="mw-group", defaults={"name": "MW Group"})
    user, _ = get_user_model().objects.get_or_create(username="mw")
    job = Job.objects.create(name=name, owner=user, group=group, command="python examples/train_numpy.py",
                             gpu_count=1, expected_runtime_s=3600, ckpt_bytes_estimate=1_000_000, restart_s=1.0,
                             loss_budget_s=60)
    Placement.objects.create(job=job, node_id=node_id, gpu_indices=[0])
    job_lifecycle.start(job)
    return job


def _press_all_at_once(node_ids: list[int]) -> list[int]:
    """Seven providers press reclaim in the same instant (one thread each); each reclaim's run is then queued
    a second time, as a redelivered broker message would be."""
    from django.db import connection

    from portal.core import outbox
    from portal.core.models import Node
    from portal.core.services.reclaims import request_reclaim

    barrier = threading.Barrier(len(node_ids))
    reclaim_ids: list[int] = []
    errors: list[BaseException] = []

    def press(node_id: int) -> None:
        try:
            node = Node.objects.get(pk=node_id)
            barrier.wait(10)
            reclaim_ids.append(request_reclaim(node, None, NOTICE_S).pk)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=press, args=(n,)) for n in node_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    for reclaim_id in reclaim_ids:
        outbox.enqueue(outbox.Task.RUN_RECLAIM, reclaim_id)
    return reclaim_ids


def _round(campus: dict[str, Any], round_: int) -> None:
    from portal.control.models import ReclaimWork
    from portal.core import outbox
    from portal.core.models import DecisionLog, Migration, Placement

    nodes, sims = campus["nodes"], campus["sims"]
    sources = [nodes[f"mw-src{round_}-{i}"][0] for i in range(RECLAIMS)]
    jobs = {src: _running_job(src, f"mw-job{round_}-{i}") for i, src in enumerate(sources)}
    for src, job in jobs.items():
        sims.running[src].append(job.pk)
    reclaim_ids = _press_all_at_once(sources)

    harness.wait_for(lambda: ReclaimWork.objects.filter(reclaim_id__in=reclaim_ids, planned_at__isnull=False)
                     .count() == RECLAIMS and outbox.pending([outbox.Task.RUN_RECLAIM]) == 0, 60,
                     what="every reclaim planned and every duplicate delivery handed over")
    harness.wait_for(lambda: all(sims.received(src, "checkpoint") for src in sources), 20,
                     what="a final checkpoint command at every source")
    import time

    time.sleep(3.0)  # let the duplicate deliveries run (and any second command arrive) before counting

    for src, job in jobs.items():
        finals = [c for c in sims.received(src, "checkpoint") if c.get("job_id") == job.pk and c.get("final")]
        assert len(finals) == 1, f"job {job.pk} on node {src}: {len(finals)} final checkpoint commands"
        assert DecisionLog.objects.filter(kind="p2", job=job, reclaim__in=reclaim_ids).count() == 1
        assert Migration.objects.filter(job=job).count() == 1
    # Every node has one GPU: a destination chosen twice (in this round or for a migration still in flight from
    # the last one), or one that already runs a job, would be a GPU handed out twice.
    in_flight = list(Migration.objects.filter(finished_at__isnull=True).values_list("destination_id", flat=True))
    assert None not in in_flight and len(set(in_flight)) == len(in_flight)
    assert not Placement.objects.filter(node_id__in=in_flight, ended_at__isnull=True).exists()
    assert set(in_flight).isdisjoint(sources)
    _cancel_and_settle(list(jobs.values()))


def _cancel_and_settle(jobs: list[Any]) -> None:
    """Cancel the round's jobs, so their migrations (whose final checkpoint the simulated agents never write)
    stop holding link bandwidth that the next round's P3 admission would have to share."""
    from portal.control.models import MigrationPhase, MigrationWork
    from portal.core import outbox
    from portal.core.models import Migration
    from portal.core.services.jobs import cancel_job

    for job in jobs:
        cancel_job(job, None)
        for mig_id in Migration.objects.filter(job=job).values_list("pk", flat=True):
            outbox.enqueue(outbox.Task.ADVANCE_MIGRATION, mig_id)
    harness.wait_for(lambda: not MigrationWork.objects.filter(
        migration__job__in=jobs, phase__in=[MigrationPhase.CHECKPOINTING, MigrationPhase.TRANSFERRING]).exists(),
        30, what="the cancelled jobs' migrations to stop")


def test_seven_reclaims_on_one_prefork_worker_with_two_processes(campus: dict[str, Any]) -> None:
    worker = campus["stack"].start_worker("prefork", beat=False, pool="prefork", concurrency=2)
    try:
        _round(campus, 1)
    finally:
        worker.stop()


def test_seven_reclaims_on_two_worker_commands_as_on_two_hosts(campus: dict[str, Any]) -> None:
    first = campus["stack"].start_worker("host1", beat=False)
    second = campus["stack"].start_worker("host2", beat=False)
    try:
        _round(campus, 2)
        for worker in (first, second):  # both took part: the work was really shared
            assert b"control.run_reclaim" in worker.log_path.read_bytes(), worker.tail()
    finally:
        first.stop()
        second.stop()
