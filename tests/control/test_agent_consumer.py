"""The agent websocket: authentication, hello/heartbeat, and refusals that change nothing (design §1 identity)."""

from __future__ import annotations

import asyncio
import json

import pytest
from control_helpers import FakeAgent, db, make_node, make_running_job, until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.timeout(30)]


async def test_header_token_hello_brings_node_online() -> None:
    from portal.control.models import AgentSession
    from portal.core.models import Node

    node, token = await db(make_node)("n1")
    agent = FakeAgent(token)
    assert await agent.connect()
    welcome = await agent.hello()
    assert welcome["node_id"] == node.pk and welcome["heartbeat_interval_s"] > 0
    node = await db(Node.objects.get)(pk=node.pk)
    assert node.state == "online" and node.last_heartbeat_at is not None
    session = await db(AgentSession.objects.get)(node=node, closed_at__isnull=True)
    assert session.data_port == 9000
    await agent.close()
    session = await db(AgentSession.objects.get)(pk=session.pk)
    assert session.closed_at is not None


@pytest.mark.parametrize("revoke", [False, True], ids=["wrong", "revoked"])
async def test_wrong_or_revoked_token_is_refused(revoke: bool) -> None:
    from portal.control.link import limits
    from portal.control.models import AgentSession, LinkCounter, RejectedMessage
    from portal.core.models import Node
    from portal.core.services.nodes import revoke_agent_token

    node, token = await db(make_node)("n1")
    if revoke:
        await db(revoke_agent_token)(node, None)
    agent = FakeAgent(token if revoke else token + "x")
    assert not await agent.connect()
    assert (await db(Node.objects.get)(pk=node.pk)).state == "registered"
    assert await db(AgentSession.objects.count)() == 0
    # Counted for /metrics (portal.control.link.limits), not written as a row per attempt.
    assert await db(RejectedMessage.objects.count)() == 0
    await db(limits.flush)()
    assert await db(LinkCounter.objects.filter(name=limits.AUTH_REFUSED, value__gte=1).exists)()


async def test_token_revoked_mid_session_ends_the_session() -> None:
    from portal.control.models import RejectedMessage
    from portal.core.models import Node
    from portal.core.services.nodes import revoke_agent_token

    node, token = await db(make_node)("n1")
    agent = FakeAgent(token)
    assert await agent.connect()
    await agent.hello()
    before = (await db(Node.objects.get)(pk=node.pk)).last_heartbeat_at
    await db(revoke_agent_token)(node, None)
    await agent.send({"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {}, "jobs": []})
    closed = await agent.comm.receive_output(timeout=3)
    if closed["type"] == "websocket.send":  # the receipt (fencing evidence) comes first; the batch then refuses it
        assert json.loads(closed["text"])["type"] == "heartbeat_ack"
        closed = await agent.comm.receive_output(timeout=3)
    assert closed["type"] == "websocket.close" and closed["code"] == 4401
    assert (await db(Node.objects.get)(pk=node.pk)).last_heartbeat_at == before
    assert await db(RejectedMessage.objects.filter(node=node, reason__contains="revoked").count)() == 1


async def test_first_message_token_and_refusal() -> None:
    from portal.core.models import Node

    node, token = await db(make_node)("n1")
    good = FakeAgent(None)
    assert await good.connect()
    await good.send({"type": "hello", "token": token, "agent_version": "t", "data_host": "127.0.0.1",
                     "data_port": 9001, "jobs": [], "gpus": []})
    assert (await good.expect("welcome"))["node_id"] == node.pk
    await good.close()

    bad = FakeAgent(None)
    assert await bad.connect()
    await bad.send({"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {}, "jobs": []})
    closed = await bad.comm.receive_output(timeout=2)
    assert closed["type"] == "websocket.close" and closed["code"] == 4401
    assert (await db(Node.objects.get)(pk=node.pk)).state == "online"  # only the good hello changed it


@pytest.mark.parametrize(
    "frame",
    [
        "not json",
        "[1, 2]",
        json.dumps({"type": "no_such_type"}),
        json.dumps({"type": "checkpoint_done", "job_id": 1}),
        json.dumps({"type": "checkpoint_done", "job_id": 1, "sequence": 1, "step": 1, "size_bytes": 10,
                    "sha256": "zz", "taken_at": 1.0, "final": False, "compat": {}}),
        json.dumps({"type": "heartbeat", "seq": "1", "gpu_util": [], "egress": {}, "jobs": []}),
        json.dumps({"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {}, "jobs": [],
                    "pad": "x" * (65 * 1024)}),
        "[" * 60_000,
        json.dumps({"type": "heartbeat", "seq": 2**70, "gpu_util": [], "egress": {}, "jobs": []}),
        json.dumps({"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {}, "jobs": [{"job_id": 2**64}]}),
        json.dumps({"type": "checkpoint_done", "job_id": 1, "sequence": 1, "step": 1, "size_bytes": 10,
                    "sha256": "a" * 64, "taken_at": float("nan"), "final": False, "compat": {}}),
    ],
    ids=["not-json", "not-object", "unknown-type", "missing-fields", "bad-sha", "wrong-type", "oversized",
         "deeply-nested", "huge-int", "huge-job-id", "nan"],
)
async def test_malformed_or_oversized_messages_are_rejected(frame: str) -> None:
    from portal.control.models import RejectedMessage
    from portal.core.models import Checkpoint, Node

    node, token = await db(make_node)("n1")
    agent = FakeAgent(token)
    assert await agent.connect()
    await agent.hello()
    before = (await db(Node.objects.get)(pk=node.pk)).last_heartbeat_at
    await agent.send(frame)
    error = await agent.expect("error")
    assert error["reason"]
    assert await db(RejectedMessage.objects.filter(node=node).count)() == 1
    assert await db(Checkpoint.objects.count)() == 0
    assert (await db(Node.objects.get)(pk=node.pk)).last_heartbeat_at == before
    # The connection stays usable after a refusal.
    await agent.send({"type": "heartbeat", "seq": 2, "gpu_util": [0.0], "egress": {}, "jobs": []})
    assert (await agent.expect("heartbeat_ack"))["seq"] == 2  # recorded (design §9.10), nothing else said
    assert await agent.nothing()
    await agent.close()


async def test_messages_about_another_nodes_job_are_rejected() -> None:
    from portal.control.models import RejectedMessage
    from portal.core.models import Checkpoint, Job

    node_a, token_a = await db(make_node)("na")
    node_b, _ = await db(make_node)("nb")
    job = await db(make_running_job)(node_b)
    agent = FakeAgent(token_a)
    assert await agent.connect()
    await agent.hello()
    await agent.send({"type": "checkpoint_done", "job_id": job.pk, "sequence": 1, "step": 5, "size_bytes": 10,
                      "sha256": "a" * 64, "taken_at": 1.0, "final": True, "compat": {}})
    assert "not placed on this node" in (await agent.expect("error"))["reason"]
    await agent.send({"type": "job_exited", "job_id": job.pk, "returncode": 0, "step": 9, "result": {},
                      "reason": "completed"})
    assert "never placed" in (await agent.expect("error"))["reason"]
    await agent.send({"type": "job_started", "job_id": job.pk, "restored_sequence": None})
    await agent.expect("error")
    assert await db(Checkpoint.objects.count)() == 0
    assert (await db(Job.objects.get)(pk=job.pk)).state == "running"
    assert await db(RejectedMessage.objects.filter(node=node_a).count)() == 3
    await agent.close()


async def test_heartbeat_brings_offline_node_back_and_records_progress() -> None:
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import Job, Node

    node, token = await db(make_node)("n1")
    agent = FakeAgent(token)
    assert await agent.connect()
    await agent.hello()
    job = await db(make_running_job)(node)
    node = await db(Node.objects.get)(pk=node.pk)
    await db(node_lifecycle.go_offline)(node)
    await agent.send({"type": "heartbeat", "seq": 1, "gpu_util": [100.0, 0.0],
                      "egress": {"mean_bytes_per_s": 10.0}, "jobs": [{"job_id": job.pk, "step": 42}]})
    await until(lambda: Job.objects.get(pk=job.pk).progress_step == 42, what="heartbeat recorded")
    assert (await db(Node.objects.get)(pk=node.pk)).state == "online"
    assert (await db(Job.objects.get)(pk=job.pk)).progress_step == 42
    await agent.close()


async def test_second_session_supersedes_the_first() -> None:
    _, token = await db(make_node)("n1")
    first = FakeAgent(token)
    assert await first.connect()
    await first.hello()
    second = FakeAgent(token)
    assert await second.connect()
    closed = await first.comm.receive_output(timeout=2)
    assert closed["type"] == "websocket.close" and closed["code"] == 4409
    await second.hello()
    await second.close()


async def test_a_hostile_hello_stores_no_unregistered_or_infinite_gpu_and_the_api_keeps_answering() -> None:
    """One agent claiming an unregistered GPU with ``"vram_gb": Infinity`` must not break the node list for
    everyone (it answered 500 "Out of range float values are not JSON compliant")."""
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from portal.control.models import RejectedMessage
    from portal.core.models import Gpu

    node, token = await db(make_node)("n1", gpus=2)
    agent = FakeAgent(token)
    assert await agent.connect()
    gpus = [{"index": 0, "model": "RTX 3090", "uuid": "u0", "vram_gb": 24, "capability": "NaN"},
            {"index": 1, "model": "RTX 3090", "uuid": "u1", "vram_gb": 24, "capability": 8.6},
            {"index": 7, "model": "H100", "uuid": "u7", "vram_gb": 80, "capability": 9.0}]
    # Raw JSON: Python's json writes the non-standard Infinity/NaN tokens the attacker sends.
    await agent.send('{"type": "hello", "agent_version": "x", "data_host": "127.0.0.1", "data_port": 9000, '
                     '"jobs": [], "gpus": ' + json.dumps(gpus) + "}")
    await agent.expect("welcome")
    await agent.send('{"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {"mean_bytes_per_s": NaN}, '
                     '"jobs": []}')
    await agent.send({"type": "heartbeat", "seq": 2, "gpu_util": [], "egress": {"mean_bytes_per_s": 1e30},
                      "jobs": []})

    def check() -> None:
        from portal.core.models import BandwidthSample

        indices = sorted(Gpu.objects.filter(node=node).values_list("index", flat=True))
        assert indices == [0, 1]  # index 7 was never registered
        assert all(str(g.compute_capability) != "NaN" for g in Gpu.objects.filter(node=node))
        assert not BandwidthSample.objects.filter(node=node).exists()
        assert RejectedMessage.objects.filter(node=node, reason__contains="not registered").exists()
        user = get_user_model().objects.create(username="reader", is_staff=True)
        client = APIClient()
        client.force_authenticate(user)
        assert client.get("/api/nodes/").status_code == 200

    await until(lambda: RejectedMessage.objects.filter(node=node).exists(), what="the refusal recorded")
    await asyncio.sleep(0.5)  # both heartbeats handled (they are refused silently: nothing to wait for)
    await agent.close()
    await db(check)()


async def test_the_hello_says_how_the_node_runs_jobs_and_a_malformed_account_is_refused() -> None:
    """Design §19.6: the agent's one-line account of its confinement is kept on the node (the node page and
    ``/api/nodes/`` show it); one that is not a string starting "confined: " or "unconfined: " is refused and the
    kept one stays."""
    from portal.control.models import RejectedMessage
    from portal.core.models import Node

    node, token = await db(make_node)("n1")
    agent = FakeAgent(token)
    assert await agent.connect()
    unconfined = "unconfined: no usable cgroup hierarchy (confinement off; needs memory/cpu/pids writable)"
    await agent.hello(confinement=unconfined)
    node = await db(Node.objects.get)(pk=node.pk)
    assert node.job_confinement == unconfined and node.jobs_unconfined
    assert node.job_confinement_detail.startswith("no usable cgroup hierarchy")
    for bad in (5, "jobs are fine", "confined: " + "x" * 400):
        await agent.send({"type": "hello", "agent_version": "test", "data_host": "127.0.0.1", "data_port": 9000,
                          "jobs": [], "gpus": [], "confinement": bad})
        assert "hello.confinement" in (await agent.expect("error"))["reason"]
    assert await db(RejectedMessage.objects.filter(node=node, reason__contains="hello.confinement").count)() == 3
    assert (await db(Node.objects.get)(pk=node.pk)).job_confinement == unconfined
    await agent.close()
