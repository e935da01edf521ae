"""A broker outage delays work and never loses or duplicates it (docs/design.md §8).

A private ``redis-server`` on a spare port (stopping it disturbs nothing else) serves the stack: daphne, a
Celery worker with beat and the outbox relay. With Redis stopped, a researcher submits a job and a provider
presses emergency reclaim over HTTP: both answer 2xx. With Redis started again, the job is placed and the
reclaim runs, each exactly once. A prefork worker whose task is in flight when Redis restarts stays alive,
reconnects and runs the next task (kombu's Redis channel used to die there, see ``portal.celery``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import pytest
from simagents import RecordingAgents

from tests.e2e.slow_task import SLEEP_TASK

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PROBE_QUEUE = "outage-probe"  # consumed only by the prefork worker of the restart test


@pytest.mark.django_db
def test_runs_on_the_test_database() -> None:
    """Makes pytest-django create the test database (see test_e2e_migration)."""
    from django.conf import settings

    assert settings.DATABASES["default"]["NAME"].startswith("test_")


class PrivateRedis:
    """A redis-server of this test's own, nothing kept on disk."""

    def __init__(self, workdir: Path) -> None:
        self.port = harness.free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        harness.wait_for(lambda: _pings(redis.Redis(port=self.port)), 10, what="private redis")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


@pytest.fixture(scope="module")
def outage(django_db_setup: Any, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        pytest.skip("needs PostgreSQL")
    if not shutil.which("redis-server") and not Path("/usr/bin/redis-server").exists():
        pytest.skip("needs redis-server")
    database_url = harness.stack_database_url()
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-outage-"))
    redis = PrivateRedis(workdir)
    redis.start()
    restore_broker = harness.use_broker(redis.url)
    with django_db_blocker.unblock():
        # no periodic control tick: one the worker had already taken when Redis stops would place the job
        # the outage test submits (ticks place queued jobs too); here only the outbox's tasks may
        st = harness.Stack(workdir, database_url, redis.url, heartbeat_timeout_s=60.0, control_period_s=3600.0)
        nodes = harness.make_campus([("ro-a", "A"), ("ro-b", "B")], gpus_per_node=1)
        sims = RecordingAgents("", {})
        try:
            st.start_portal()
            st.start_worker()
            sims = RecordingAgents(st.portal_ws, {pk: token for pk, token in nodes.values()})
            sims.start()
            from portal.core.models import Node

            harness.wait_for(lambda: Node.objects.filter(name__startswith="ro-", state="online").count() == 2,
                             30, what="two simulated agents online")
            yield {"stack": st, "nodes": nodes, "sims": sims, "redis": redis}
        finally:
            try:
                sims.stop()
            finally:
                st.stop_all()
                redis.stop()
                restore_broker()
                shutil.rmtree(workdir, ignore_errors=True)


def _api_token(username: str, member_of: Any) -> str:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user, _ = get_user_model().objects.get_or_create(username=username)
    member_of.members.add(user)
    return Token.objects.get_or_create(user=user)[0].key


def _post(port: int, path: str, token: str, body: dict[str, Any] | None = None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body or {}).encode(),
                                     method="POST", headers={"Authorization": f"Token {token}",
                                                             "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_writes_during_a_broker_outage_answer_2xx_and_run_exactly_once_after(outage: dict[str, Any]) -> None:
    from portal.core import outbox
    from portal.core.models import DecisionLog, Job, Node, Placement, Provider, ReclaimEvent, ResearchGroup

    st, nodes, sims, redis = outage["stack"], outage["nodes"], outage["sims"], outage["redis"]
    group, _ = ResearchGroup.objects.get_or_create(slug="ro-group", defaults={"name": "RO Group"})
    researcher = _api_token("ro-researcher", group)
    provider = _api_token("ro-provider", Provider.objects.get(slug="e2e-lab"))
    target = nodes["ro-b"][0]

    redis.stop()
    submit = _post(st.port, "/api/jobs/", researcher, {
        "name": "ro-job", "gpu_count": 1, "expected_runtime_s": 600, "ckpt_bytes_estimate": 10**6,
        "command": "python examples/train_numpy.py"})
    reclaim = _post(st.port, f"/api/nodes/{target}/emergency-reclaim/", provider)
    assert (submit, reclaim) == (201, 201)
    job = Job.objects.get(name="ro-job")
    time.sleep(2.0)
    assert Job.objects.get(pk=job.pk).state == "queued" and not Placement.objects.filter(job=job).exists()
    assert outbox.pending([outbox.Task.PLACE_JOB, outbox.Task.RUN_RECLAIM]) == 2  # held, not lost

    redis.start()  # same port: the worker, beat and daphne reconnect by themselves
    harness.wait_for(lambda: Placement.objects.filter(job=job).exists(), 60, what="the job placed")
    harness.wait_for(lambda: ReclaimEvent.objects.filter(node_id=target, finished_at__isnull=False).exists(), 60,
                     what="the reclaim run")
    harness.wait_for(lambda: sims.received(target, "killswitch"), 30, what="the kill-switch at the agent")
    time.sleep(2.0)  # a duplicate delivery, if any, would land now

    assert Placement.objects.filter(job=job).count() == 1
    assert DecisionLog.objects.filter(kind="p2", job=job).count() == 1
    assert ReclaimEvent.objects.filter(node_id=target).count() == 1
    assert len([c for c in sims.received(target, "killswitch") if c.get("engaged")]) == 1
    assert Placement.objects.get(job=job).node_id == nodes["ro-a"][0]  # not on the reclaimed node
    assert Node.objects.get(pk=target).state == "reclaimed"
    assert outbox.pending() == 0


def test_a_prefork_worker_survives_a_redis_restart_mid_task_and_runs_the_next(outage: dict[str, Any]) -> None:
    from portal.celery import app

    st, redis = outage["stack"], outage["redis"]
    worker = st.start_worker("ro-prefork", beat=False, pool="prefork", concurrency=2,
                             extra_args=("-Q", PROBE_QUEUE, "-I", "tests.e2e.slow_task"))
    app.send_task(SLEEP_TASK, args=[5.0], queue=PROBE_QUEUE)
    harness.wait_for(lambda: b"Task tests.sleep" in worker.log_path.read_bytes(), 30, what="a task in flight")

    redis.stop()  # the worker holds an unacknowledged message: closing its channel requeues it
    time.sleep(1.0)
    redis.start()
    harness.wait_for(lambda: worker.log_path.read_bytes().count(b"Connected to") >= 2 or not worker.alive(), 60,
                     what="the worker reconnected")
    assert worker.alive(), worker.tail()

    probe = app.send_task(SLEEP_TASK, args=[0.1], queue=PROBE_QUEUE)
    harness.wait_for(lambda: f"Task tests.sleep[{probe.id}] succeeded".encode() in worker.log_path.read_bytes()
                     or not worker.alive(), 60, what="the next task run")
    assert worker.alive(), worker.tail()
    assert b"Unrecoverable error" not in worker.log_path.read_bytes()
