"""Heartbeats are recorded in batches, in a fixed number of statements whatever the number of nodes (design
§9.10): 500 agents' heartbeats no longer queue, a few statements each, on the consumers' one database thread."""

from __future__ import annotations

from typing import Any

import pytest
from control_helpers import make_node, make_running_job
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

pytestmark = pytest.mark.django_db


def _beats(nodes: list[tuple[Any, str]], jobs: dict[int, int]) -> list[Any]:
    from portal.control.link.handlers import HeartbeatSeen

    now = timezone.now()
    return [HeartbeatSeen(node.pk, None, token, now, {
        "type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {"mean_bytes_per_s": 1e6},
        "jobs": [{"job_id": jobs[node.pk], "step": 7}] if node.pk in jobs else []}) for node, token in nodes]


def _statements(count: int, offset: int) -> int:
    from portal.control.link.handlers import record_heartbeats
    from portal.core.lifecycle import nodes as node_lifecycle

    nodes = [make_node(f"n{offset + k}") for k in range(count)]
    for node, _ in nodes:
        node_lifecycle.come_online(node)
    jobs = {node.pk: make_running_job(node).pk for node, _ in nodes[: count // 2]}
    with CaptureQueriesContext(connection) as captured:
        assert record_heartbeats(_beats(nodes, jobs)) == []
    return len(captured.captured_queries)


def test_recording_heartbeats_costs_as_many_statements_for_40_nodes_as_for_4() -> None:
    from portal.core.models import Job, Node

    assert _statements(4, 0) == _statements(40, 100)
    assert not Node.objects.filter(last_heartbeat_at__isnull=True).exists()
    assert set(Job.objects.values_list("progress_step", flat=True)) == {7}


def test_a_revoked_token_is_refused_in_the_batch_and_the_others_recorded() -> None:
    from portal.control.link.handlers import record_heartbeats
    from portal.control.models import RejectedMessage
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import Node
    from portal.core.services.nodes import revoke_agent_token

    good, bad = make_node("good"), make_node("bad")
    for node, _ in (good, bad):
        node_lifecycle.come_online(node)
    revoke_agent_token(bad[0], None)
    refused = record_heartbeats(_beats([good, bad], {}))
    assert [r.node_id for r in refused] == [bad[0].pk]
    assert Node.objects.get(pk=good[0].pk).last_heartbeat_at is not None
    assert Node.objects.get(pk=bad[0].pk).last_heartbeat_at is None
    assert RejectedMessage.objects.filter(node=bad[0], reason__contains="revoked").count() == 1
