"""Every process of the production setup exits within 10 s of SIGTERM with its database connections closed
(docs/design.md §10): daphne with an agent's websocket open and a request stuck in the database, a prefork
Celery worker (concurrency 2) in the middle of a long task, and beat with its outbox relay. Afterwards
``pg_stat_activity`` for the test database holds none of their connections (each process kind names its
connections ``reclaimnet-<kind>``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import psycopg
import pytest
import redis
from simagents import RecordingAgents

from tests.e2e.slow_task import SLEEP_TASK

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

EXIT_WITHIN_S = 10.0
KINDS = ("reclaimnet-daphne", "reclaimnet-worker", "reclaimnet-beat")
REDIS_DB = 9  # this module's own queues on the shared server


@pytest.mark.django_db
def test_runs_on_the_test_database() -> None:
    """Makes pytest-django create the test database (see test_e2e_migration)."""
    from django.conf import settings

    assert settings.DATABASES["default"]["NAME"].startswith("test_")


def connections_by_kind(database_url: str) -> dict[str, int]:
    """Backends on the test database per application name of the stack's processes."""
    with psycopg.connect(database_url, autocommit=True, application_name="reclaimnet-test-observer") as conn:
        rows = conn.execute("SELECT application_name, count(*) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND application_name = ANY(%s) "
                            "GROUP BY application_name", [list(KINDS)]).fetchall()
    return {name: int(count) for name, count in rows}


def flush_queues(redis_url: str) -> None:
    """Drop this module's stale Celery messages (its own Redis database only)."""
    from portal.celery import app

    client = redis.Redis.from_url(redis_url)
    client.delete(*[q.name for q in app.conf.task_queues], "unacked", "unacked_index", "unacked_mutex")


@pytest.fixture(scope="module")
def stack(django_db_setup: Any, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        pytest.skip("needs PostgreSQL")
    if not os.environ.get("REDIS_URL"):
        pytest.skip("needs REDIS_URL")
    database_url = harness.stack_database_url()
    redis_url = harness.redis_db(os.environ["REDIS_URL"], REDIS_DB)
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-shutdown-"))
    flush_queues(redis_url)
    restore_broker = harness.use_broker(redis_url)
    with django_db_blocker.unblock():
        st = harness.Stack(workdir, database_url, redis_url, heartbeat_timeout_s=60.0)
        nodes = harness.make_campus([("sd-a", "A")], gpus_per_node=1)
        sims = RecordingAgents("", {})
        try:
            baseline = connections_by_kind(database_url)
            st.start_portal()
            st.start_worker("sd-worker", beat=False, pool="prefork", concurrency=2,
                            extra_args=("-I", "tests.e2e.slow_task"))
            st.start_beat()
            sims = RecordingAgents(st.portal_ws, {pk: token for pk, token in nodes.values()})
            sims.start()
            from portal.core.models import Node

            harness.wait_for(lambda: Node.objects.filter(name="sd-a", state="online").exists(), 30,
                             what="the simulated agent online")
            yield {"stack": st, "nodes": nodes, "baseline": baseline, "database_url": database_url}
        finally:
            try:
                sims.stop()
            finally:
                st.stop_all()
                restore_broker()
                shutil.rmtree(workdir, ignore_errors=True)


def _api_token(username: str) -> str:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user, _ = get_user_model().objects.get_or_create(username=username)
    return str(Token.objects.get_or_create(user=user)[0].key)


def _get_in_background(port: int, path: str, token: str) -> threading.Thread:
    def get() -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Token {token}"})
        try:
            with urllib.request.urlopen(request, timeout=60):
                pass
        except (urllib.error.URLError, OSError, ValueError):
            pass  # the server went away under it: expected

    thread = threading.Thread(target=get, daemon=True)
    thread.start()
    return thread


def test_every_process_exits_within_10_s_of_sigterm_and_leaves_no_connection(stack: dict[str, Any]) -> None:
    from portal.celery import app

    st, database_url = stack["stack"], stack["database_url"]
    token = _api_token("sd-researcher")
    app.send_task(SLEEP_TASK, args=[120.0], queue="placement")  # a task the worker could not finish in time
    harness.wait_for(lambda: b"Task tests.sleep" in st.procs["sd-worker"].log_path.read_bytes(), 30,
                     what="the long task started")
    # A request stuck in the database: the test holds the jobs table, the request waits for it.
    with psycopg.connect(database_url, application_name="reclaimnet-test-lock") as locker:
        locker.execute("LOCK TABLE core_job IN ACCESS EXCLUSIVE MODE")
        request = _get_in_background(st.port, "/api/jobs/", token)
        # Every process kind is seen connected (so "back to the baseline" below means something).
        harness.wait_for(lambda: set(connections_by_kind(database_url)) == set(KINDS), 30,
                         what="daphne, the worker and beat holding database connections")
        time.sleep(1.0)  # the request is now waiting on the lock

        procs = [st.procs["daphne"], st.procs["sd-worker"], st.procs["beat"]]
        started = time.monotonic()
        for proc in procs:
            proc.signal(signal.SIGTERM)
        exited_after_s: dict[str, float] = {}
        while len(exited_after_s) < len(procs) and time.monotonic() - started < EXIT_WITHIN_S + 20:
            for proc in procs:
                if proc.name not in exited_after_s and not proc.alive():
                    exited_after_s[proc.name] = time.monotonic() - started
            time.sleep(0.05)
        locker.rollback()  # the stuck request's backend finishes its wait and sees its client gone
    request.join(30)
    print(f"exited after SIGTERM: {json.dumps({k: round(v, 2) for k, v in exited_after_s.items()})}")

    for proc in procs:
        assert exited_after_s.get(proc.name, float("inf")) < EXIT_WITHIN_S, (
            f"{proc.name} still running {EXIT_WITHIN_S} s after SIGTERM:\n{proc.tail()}")
    harness.wait_for(lambda: connections_by_kind(database_url) == stack["baseline"], 10,
                     what="pg_stat_activity back to its baseline")
    broker = redis.Redis.from_url(st.redis_url)  # the cancelled task is not lost: requeued, or awaiting redelivery
    assert broker.llen("placement") + broker.zcard("unacked_index") == 1
