"""A portal of several processes (design §18): two daphne processes on two ports and two Celery workers (beat
single, on its own), sharing one PostgreSQL and one Redis (channel layer and broker), with four agents, each
listing both daphnes (two prefer the first, two the second).

- A reclaim requested through one daphne's HTTP API reaches an agent held by the other: its job is checkpointed
  there and resumes on another node.
- The kill-switch pressed through one daphne is enforced by an agent held by the other: it kills its job.
- SIGKILL of one daphne: its agents reconnect to the other within the heartbeat timeout, no node is declared
  lost and no job moves (the same open placements on the same nodes, every node online).

Which daphne holds an agent is read from the agent's own log ("connected as node N to URL").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

NODES = [("mp-a1", "A"), ("mp-a2", "A"), ("mp-b1", "B"), ("mp-b2", "B")]
PREFERS_SECOND = {"mp-a2", "mp-b2"}  # these list the second daphne first
STEPS, STEP_SLEEP_S = 100_000, 0.05  # far longer than the module: the jobs run until stopped
HEARTBEAT_TIMEOUT_S = 5.0
CONNECTED = re.compile(rb"connected as node \d+ to ws://127\.0\.0\.1:(\d+)/")


@pytest.mark.django_db
def test_runs_on_the_test_database() -> None:
    """Makes pytest-django create the test database (see test_e2e_migration)."""
    from django.conf import settings

    assert settings.DATABASES["default"]["NAME"].startswith("test_")


@pytest.fixture(scope="module")
def multi(django_db_setup: Any, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")) or not os.environ.get("REDIS_URL"):
        pytest.skip("e2e needs DATABASE_URL=postgres://… and REDIS_URL")
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-multiportal-"))
    # The e2e suite's Redis database (3), or RECLAIMNET_E2E_REDIS_DB for a run beside another one.
    redis_url = harness.redis_db(os.environ["REDIS_URL"], int(os.environ.get("RECLAIMNET_E2E_REDIS_DB", "3")))
    restore_broker = harness.use_broker(redis_url)
    with django_db_blocker.unblock():
        st = harness.Stack(workdir, harness.stack_database_url(), redis_url, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)
        st.flush_redis()
        nodes = harness.make_campus(NODES)
        try:
            st.start_portal("daphne1")
            second_port = harness.free_port()
            st.start_portal("daphne2", second_port)
            ports = {"daphne1": st.port, "daphne2": second_port}
            urls = {name: f"ws://127.0.0.1:{port}/ws/agent/" for name, port in ports.items()}
            st.start_beat()
            workers = [st.start_worker(name, beat=False) for name in ("worker1", "worker2")]
            for name, (_, token) in nodes.items():
                order = ["daphne2", "daphne1"] if name in PREFERS_SECOND else ["daphne1", "daphne2"]
                st.start_agent(name, token, portals=[urls[d] for d in order])
            from portal.core.models import Node

            harness.wait_for(lambda: Node.objects.filter(state="online", name__startswith="mp-").count() == 4,
                             60, what="four agents online")
            harness.wait_for(lambda: all(_held_by(st, n) for n in nodes), 30, what="every agent connected")
            yield {"stack": st, "nodes": nodes, "ports": ports, "workers": workers, "token": _provider_token()}
        finally:
            _cancel_jobs_on_module_nodes()
            st.stop_all()
            restore_broker()
            if os.environ.get("RECLAIMNET_E2E_KEEP"):
                print(f"e2e logs kept in {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)


def _cancel_jobs_on_module_nodes() -> None:
    """Cancel the jobs still placed on this module's nodes: their agents stop with the module, and a later
    module's tick would otherwise declare those nodes lost (a reclaim the later module did not cause)."""
    from portal.core.models import Job
    from portal.core.services.jobs import cancel_job

    for job in Job.objects.filter(placements__node__name__startswith="mp-", placements__ended_at__isnull=True
                                  ).distinct():
        cancel_job(job, None)


def _provider_token() -> str:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from portal.core.models import Provider

    user, _ = get_user_model().objects.get_or_create(username="mp-provider")
    Provider.objects.get(slug="e2e-lab").members.add(user)
    return str(Token.objects.get_or_create(user=user)[0].key)


def _held_by(st: harness.Stack, name: str, after_bytes: int = 0) -> int | None:
    """The port of the daphne the agent last connected to (after byte ``after_bytes`` of its log), or None."""
    found = CONNECTED.findall(st.procs[f"agent-{name}"].log_path.read_bytes()[after_bytes:])
    return int(found[-1]) if found else None


def _post(port: int, path: str, token: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST",
                                     data=json.dumps(body or {}).encode(),
                                     headers={"Authorization": f"Token {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()[:300]


def _running_job(name: str) -> tuple[int, Any]:
    """Submit the trainer, wait until it runs; (job id, its node)."""
    from portal.core.models import Job, Placement

    job_id = harness.submit_training_job(name, STEPS, STEP_SLEEP_S)
    harness.wait_for(lambda: Job.objects.get(pk=job_id).state == "running" and Job.objects.get(pk=job_id)
                     .progress_step > 0, 60, what=f"{name} running")
    return job_id, Placement.objects.select_related("node").get(job_id=job_id, ended_at__isnull=True).node


def _other(multi: dict[str, Any], port: int) -> int:
    (other,) = [p for p in multi["ports"].values() if p != port]
    return other


def _stop(job_id: int, node_names: list[str]) -> None:
    """Cancel the job and lend its nodes again, so the next scenario starts with every node online."""
    from portal.core.models import Job, Node
    from portal.core.services.jobs import cancel_job
    from portal.core.services.nodes import lend_again

    cancel_job(Job.objects.get(pk=job_id), None)
    for name in node_names:
        node = Node.objects.get(name=name)
        if node.state == "reclaimed" or node.killswitch_engaged:
            lend_again(node, None)
    harness.wait_for(lambda: Node.objects.filter(name__startswith="mp-", state="online",
                                                 killswitch_engaged=False).count() == 4, 30,
                     what="every node online again")


def test_multiportal_reclaim_through_one_daphne_reaches_an_agent_on_the_other(multi: dict[str, Any]) -> None:
    from portal.core.models import Migration, Placement

    st: harness.Stack = multi["stack"]
    job_id, source = _running_job("mp-reclaim")
    holder = _held_by(st, source.name)
    assert holder is not None
    trainer = set(st.procs[f"agent-{source.name}"].children())
    assert trainer, "the source agent runs no job process"

    status, body = _post(_other(multi, holder), f"/api/nodes/{source.pk}/reclaim/", multi["token"],
                         {"notice_s": 20.0})
    assert status == 201, body
    mig = harness.wait_for(lambda: Migration.objects.filter(job_id=job_id, finished_at__isnull=False).first(), 60,
                           what="the job's migration finished")
    assert mig.success and mig.mode == "planned", (mig.success, mig.mode)
    destination = Placement.objects.select_related("node").get(job_id=job_id, ended_at__isnull=True).node
    assert destination.pk != source.pk
    # The source agent acted: it checkpointed and stopped its job process; the destination runs the job.
    harness.wait_for(lambda: not trainer & set(st.procs[f"agent-{source.name}"].children()), 20,
                     what="the source's job process gone")
    assert st.procs[f"agent-{destination.name}"].children()
    _stop(job_id, [source.name, destination.name])


def test_multiportal_killswitch_through_one_daphne_is_enforced_by_an_agent_on_the_other(
        multi: dict[str, Any]) -> None:
    from portal.core.models import Node, ReclaimEvent

    st: harness.Stack = multi["stack"]
    job_id, node = _running_job("mp-killswitch")
    holder = _held_by(st, node.name)
    assert holder is not None
    agent = st.procs[f"agent-{node.name}"]
    trainer = set(agent.children())
    assert trainer
    log_at = agent.log_path.stat().st_size

    status, body = _post(_other(multi, holder), f"/api/nodes/{node.pk}/killswitch/", multi["token"])
    assert status == 201, body
    assert ReclaimEvent.objects.filter(node=node, pk=body["id"]).exists()
    assert Node.objects.get(pk=node.pk).killswitch_engaged
    # The agent, connected to the other daphne all along, killed its job process at once.
    harness.wait_for(lambda: not trainer & set(agent.children()), 20, what="the kill-switched job process gone")
    assert _held_by(st, node.name, log_at) is None, "the agent reconnected: the command did not cross daphnes"
    _stop(job_id, [node.name])


def test_multiportal_a_killed_daphne_moves_its_agents_and_loses_no_node(multi: dict[str, Any]) -> None:
    from portal.control.link import presence
    from portal.core.models import Job, Migration, Node, Placement, ReclaimEvent

    st: harness.Stack = multi["stack"]
    jobs = [_running_job(f"mp-failover-{k}")[0] for k in range(3)]
    held = {name: _held_by(st, name) for name in multi["nodes"]}
    placed = dict(Placement.objects.filter(job_id__in=jobs, ended_at__isnull=True).values_list("job_id", "node_id"))
    assert len(placed) == 3
    job_nodes = dict(Node.objects.filter(pk__in=placed.values()).values_list("pk", "name"))
    # Kill the daphne that holds the first job's agent (so a node running a job must move).
    victim_port = held[job_nodes[placed[jobs[0]]]]
    assert victim_port is not None
    (victim_name,) = [n for n, p in multi["ports"].items() if p == victim_port]
    survivor = _other(multi, victim_port)
    moving = sorted(n for n, p in held.items() if p == victim_port)
    assert moving
    states_before = dict(Node.objects.filter(name__startswith="mp-").values_list("name", "state"))
    assert set(states_before.values()) == {"online"}
    reclaims_before = ReclaimEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    migrations_before = Migration.objects.filter(job_id__in=jobs).count()
    log_at = {n: st.procs[f"agent-{n}"].log_path.stat().st_size for n in moving}

    victim = st.procs[victim_name]
    killed_wall = time.time()
    killed_at = time.monotonic()
    victim.signal(harness.SIGKILL)  # a PID this test started
    victim.popen.wait(10)
    reconnect_s: dict[str, float] = {}

    def reconnected() -> bool:
        for n in moving:
            if n not in reconnect_s and _held_by(st, n, log_at[n]) == survivor:
                reconnect_s[n] = time.monotonic() - killed_at
        return len(reconnect_s) == len(moving)

    harness.wait_for(reconnected, 3 * HEARTBEAT_TIMEOUT_S, interval_s=0.05, what="agents on the surviving daphne")
    assert max(reconnect_s.values()) <= HEARTBEAT_TIMEOUT_S, reconnect_s
    # Heard past the time by which a lost node would have been declared (the link servers' reconnect grace,
    # the heartbeat timeout and two control periods after the kill).
    heard_by = killed_wall + presence.RECONNECT_GRACE_S + HEARTBEAT_TIMEOUT_S + 2 * st.control_period_s

    def all_heard() -> bool:
        stamps = Node.objects.filter(name__startswith="mp-").values_list("last_heartbeat_at", flat=True)
        return all(s is not None and s.timestamp() > heard_by for s in stamps)

    harness.wait_for(all_heard, heard_by - time.time() + 15, what="heartbeats past the loss horizon")

    lost = list(ReclaimEvent.objects.filter(pk__gt=reclaims_before).values_list("node__name", "kind"))
    assert lost == [], f"reclaims raised by a daphne's death: {lost}"
    assert dict(Node.objects.filter(name__startswith="mp-").values_list("name", "state")) == states_before
    assert Migration.objects.filter(job_id__in=jobs).count() == migrations_before
    assert dict(Placement.objects.filter(job_id__in=jobs, ended_at__isnull=True)
                .values_list("job_id", "node_id")) == placed
    assert Job.objects.filter(pk__in=jobs, state="running").count() == 3
    assert all(_held_by(st, n) == survivor for n in multi["nodes"])  # every agent on the surviving daphne
    for w in multi["workers"]:
        assert w.alive(), w.tail()
