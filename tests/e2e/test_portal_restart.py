"""A portal restart is not a node failure (design §9.10): daphne restarted under three agents running jobs.

The stack is this module's own (daphne, a Celery worker with beat, three agents), started after the shared
stack of tests/e2e/conftest.py has stopped (module fixtures end with their module). The worker keeps running while
daphne stops and starts again, so the tick's own restart grace does not apply: only the link servers' evidence
(:mod:`portal.control.link.presence`) keeps the silent agents from being declared lost.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

NODES = [("rs-a1", "A"), ("rs-a2", "A"), ("rs-b1", "B")]
STEPS, STEP_SLEEP_S = 100_000, 0.05  # far longer than the test: the jobs are still running at its end


@pytest.mark.django_db
def test_runs_on_the_test_database() -> None:
    """Makes pytest-django create the test database (it does only when a collected test is marked
    ``django_db``; the scenario cannot be: the stack's processes must see its committed rows)."""
    from django.conf import settings

    assert settings.DATABASES["default"]["NAME"].startswith("test_")


@pytest.fixture(scope="module")
def restart_stack(django_db_setup: Any, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")) or not os.environ.get("REDIS_URL"):
        pytest.skip("e2e needs DATABASE_URL=postgres://… and REDIS_URL")
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-restart-"))
    # The e2e suite's Redis database (3, as tests/e2e/conftest.py's stack), or RECLAIMNET_E2E_REDIS_DB for a
    # run beside another one: the stack flushes its queues there.
    redis_url = harness.redis_db(os.environ["REDIS_URL"], int(os.environ.get("RECLAIMNET_E2E_REDIS_DB", "3")))
    restore_broker = harness.use_broker(redis_url)
    with django_db_blocker.unblock():
        st = harness.Stack(workdir, harness.stack_database_url(), redis_url)
        st.flush_redis()
        nodes = harness.make_campus(NODES)
        try:
            st.start_portal()
            st.start_worker()
            for name, (_, token) in nodes.items():
                st.start_agent(name, token)
            from portal.core.models import Node

            harness.wait_for(lambda: Node.objects.filter(state="online", name__startswith="rs-").count() == 3,
                             60, what="three agents online")
            yield {"stack": st, "nodes": nodes}
        finally:
            st.stop_all()
            restore_broker()
            shutil.rmtree(workdir, ignore_errors=True)


def _placements(job_ids: list[int]) -> dict[int, tuple[int, int]]:
    """job → (open placement id, node id)."""
    from portal.core.models import Placement

    return {p.job_id: (p.pk, p.node_id)
            for p in Placement.objects.filter(job_id__in=job_ids, ended_at__isnull=True)}


def _steps(job_ids: list[int]) -> dict[int, int]:
    from portal.core.models import Job

    return dict(Job.objects.filter(pk__in=job_ids).values_list("pk", "progress_step"))


def test_a_daphne_restart_under_running_jobs_loses_no_node_and_moves_no_job(restart_stack: dict[str, Any]) -> None:
    from django.utils import timezone

    from portal.control.link import presence
    from portal.control.models import AgentSession
    from portal.core.models import Job, Migration, Node, ReclaimEvent

    st: harness.Stack = restart_stack["stack"]
    jobs = [harness.submit_training_job(f"restart-{k}", STEPS, STEP_SLEEP_S) for k in range(3)]
    harness.wait_for(lambda: Job.objects.filter(pk__in=jobs, state="running").count() == 3, 60,
                     what="three jobs running")
    harness.wait_for(lambda: all(s > 0 for s in _steps(jobs).values()), 30, what="steps reported")
    placed = _placements(jobs)
    assert len(placed) == 3
    reclaims_before = ReclaimEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    migrations_before = Migration.objects.filter(job_id__in=jobs).count()

    restarted_at = timezone.now()
    old = st.procs["daphne"]
    old.stop(timeout_s=15)  # SIGTERM, as a deployment restarts it
    assert not old.alive()
    time.sleep(2 * st.heartbeat_timeout_s)  # down for longer than the heartbeat timeout
    st.start_portal()  # same port: the agents reconnect by themselves
    back_at = time.monotonic()
    harness.wait_for(lambda: AgentSession.objects.filter(node__name__startswith="rs-", connected_at__gt=restarted_at)
                     .values("node").distinct().count() == 3, 30, what="three agents reconnected")
    steps_back = _steps(jobs)
    # Past the reconnect grace and the timeout (and a few control periods) after the link came back.
    remaining_s = presence.RECONNECT_GRACE_S + st.heartbeat_timeout_s + 3 * st.control_period_s \
        - (time.monotonic() - back_at)
    time.sleep(max(0.0, remaining_s))

    # This module's nodes only: an earlier module's stack (tests/e2e/test_multiportal.py) leaves its nodes
    # online with their agents gone, and this worker's tick rightly declares those lost.
    lost = list(ReclaimEvent.objects.filter(pk__gt=reclaims_before, kind="heartbeat_lost",
                                            node__name__startswith="rs-").values_list("node__name", flat=True))
    assert lost == [], f"nodes declared lost by a portal restart: {lost}"
    assert Migration.objects.filter(job_id__in=jobs).count() == migrations_before
    assert Job.objects.filter(pk__in=jobs, state="running").count() == 3
    assert _placements(jobs) == placed  # the same placements, on the same nodes
    assert Node.objects.filter(name__startswith="rs-", state="online").count() == 3
    later = _steps(jobs)
    assert all(later[j] > steps_back[j] for j in jobs), (steps_back, later)  # the counters keep advancing
