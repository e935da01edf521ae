"""Queues by urgency (docs/design.md §10): every task has a queue chosen for it, and the control queue is served
whatever the other queues' workers are busy with.

The routing table is checked without a broker. End to end: a worker that consumes only the ``control`` queue
runs an emergency reclaim (the agent receives its kill-switch) while the worker of the other queues is held by a
long task, and a job submitted meanwhile waits in the placement queue: the separation is real, not a timing."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import pytest
from simagents import RecordingAgents

from portal.celery import app
from portal.core.outbox import Task
from tests.e2e.slow_task import SLEEP_TASK

# Which queue each known task belongs to. Control steps (what a provider waits for) have a queue of their own.
EXPECTED_QUEUE = {
    Task.RUN_RECLAIM: "control",
    Task.ENFORCE_DEADLINE: "control",
    Task.ADVANCE_MIGRATION: "control",
    Task.RECOVER_LOST_JOBS: "control",
    Task.RELEASE_RECLAIMS: "control",
    Task.STOP_CANCELLED_JOB: "control",
    Task.NODE_LENT_AGAIN: "control",
    "control.reconcile": "control",
    "control.tick": "tick",
    Task.PLACE_JOB: "placement",
    Task.PLACE_QUEUED: "placement",
    Task.PRESYNC_CHECKPOINT: "placement",
    "control.housekeeping": "housekeeping",
    "control.calibrate_reserves": "evaluation",  # daily, minutes of reading: never ahead of a control step
}
REDIS_DB = 10  # this module's own queues on the shared server


def _queue_of(task_name: str) -> str:
    return str(app.amqp.router.route({}, task_name)["queue"].name)


def test_each_known_task_routes_to_its_queue() -> None:
    assert {name: _queue_of(name) for name in EXPECTED_QUEUE} == EXPECTED_QUEUE


def test_every_task_the_outbox_can_queue_and_every_registered_task_has_a_route() -> None:
    app.loader.import_default_modules()
    outbox_names = {value for key, value in vars(Task).items() if key.isupper()}
    registered = {name for name in app.tasks if name.startswith("control.")}
    assert outbox_names <= set(EXPECTED_QUEUE)
    assert registered == set(EXPECTED_QUEUE)  # a new task needs a decision here, not the default queue


def test_queues_for_future_work_exist_and_a_worker_without_q_consumes_all() -> None:
    names = {queue.name for queue in app.conf.task_queues}
    assert {"control", "tick", "placement", "housekeeping", "notifications", "evaluation"} <= names
    assert app.conf.task_default_queue in names


@pytest.mark.e2e
@pytest.mark.django_db
def test_runs_on_the_test_database() -> None:
    """Makes pytest-django create the test database (see test_e2e_migration)."""
    from django.conf import settings

    assert settings.DATABASES["default"]["NAME"].startswith("test_")


@pytest.fixture(scope="module")
def split_stack(django_db_setup: Any, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        pytest.skip("needs PostgreSQL")
    if not os.environ.get("REDIS_URL"):
        pytest.skip("needs REDIS_URL")
    import redis

    database_url = harness.stack_database_url()
    redis_url = harness.redis_db(os.environ["REDIS_URL"], REDIS_DB)
    redis.Redis.from_url(redis_url).delete(*[q.name for q in app.conf.task_queues], "unacked", "unacked_index")
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-queues-"))
    restore_broker = harness.use_broker(redis_url)
    others = ",".join(q.name for q in app.conf.task_queues if q.name != "control")
    with django_db_blocker.unblock():
        st = harness.Stack(workdir, database_url, redis_url, heartbeat_timeout_s=60.0)
        nodes = harness.make_campus([("qu-a", "A"), ("qu-b", "B")], gpus_per_node=1)
        sims = RecordingAgents("", {})
        try:
            st.start_portal()
            st.start_worker("qu-control", beat=False, pool="prefork", concurrency=2, extra_args=("-Q", "control"))
            st.start_worker("qu-others", beat=False, pool="solo", concurrency=1,
                            extra_args=("-Q", others, "-I", "tests.e2e.slow_task"))
            st.start_beat()
            sims = RecordingAgents(st.portal_ws, {pk: token for pk, token in nodes.values()})
            sims.start()
            from portal.core.models import Node

            harness.wait_for(lambda: Node.objects.filter(name__startswith="qu-", state="online").count() == 2, 30,
                             what="two simulated agents online")
            yield {"stack": st, "nodes": nodes, "sims": sims}
        finally:
            try:
                sims.stop()
            finally:
                st.stop_all()
                restore_broker()
                shutil.rmtree(workdir, ignore_errors=True)


def _post(port: int, path: str, token: str, body: dict[str, Any] | None = None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body or {}).encode(),
                                     method="POST", headers={"Authorization": f"Token {token}",
                                                             "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _api_token(username: str, member_of: Any) -> str:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user, _ = get_user_model().objects.get_or_create(username=username)
    member_of.members.add(user)
    return str(Token.objects.get_or_create(user=user)[0].key)


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_control_worker_runs_a_reclaim_while_the_other_queues_worker_is_busy(split_stack: dict[str, Any]) -> None:
    from portal.core.models import Job, Placement, Provider, ReclaimEvent, ResearchGroup

    st, nodes, sims = split_stack["stack"], split_stack["nodes"], split_stack["sims"]
    app.send_task(SLEEP_TASK, args=[90.0], queue="placement")  # holds the only worker of the other queues
    harness.wait_for(lambda: b"Task tests.sleep" in st.procs["qu-others"].log_path.read_bytes(), 30,
                     what="the long task running on the other queues' worker")
    group, _ = ResearchGroup.objects.get_or_create(slug="qu-group", defaults={"name": "QU Group"})
    researcher = _api_token("qu-researcher", group)
    provider = _api_token("qu-provider", Provider.objects.get(slug="e2e-lab"))
    target = nodes["qu-b"][0]

    submit = _post(st.port, "/api/jobs/", researcher, {
        "name": "qu-job", "gpu_count": 1, "expected_runtime_s": 600, "ckpt_bytes_estimate": 10**6,
        "command": "python examples/train_numpy.py"})
    reclaim = _post(st.port, f"/api/nodes/{target}/emergency-reclaim/", provider)
    assert (submit, reclaim) == (201, 201)

    harness.wait_for(lambda: ReclaimEvent.objects.filter(node_id=target, finished_at__isnull=False).exists(), 30,
                     what="the reclaim run by the control worker")
    harness.wait_for(lambda: [c for c in sims.received(target, "killswitch") if c.get("engaged")], 30,
                     what="the kill-switch at the agent")
    assert b"Task control.run_reclaim" in st.procs["qu-control"].log_path.read_bytes()
    job = Job.objects.get(name="qu-job")
    assert job.state == "queued" and not Placement.objects.filter(job=job).exists()  # waits behind the long task
    assert st.procs["qu-others"].alive()
