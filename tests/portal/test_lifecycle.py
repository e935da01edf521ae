"""Every state-machine transition, allowed and refused (design §1 lifecycles)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from portal.core.lifecycle import ConcurrentTransition, InvalidTransition
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.lifecycle import nodes as node_lifecycle
from portal.core.lifecycle.base import apply_transition
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Job, Node
from tests.portal import factories as f

# The public function that moves a node / job into each target state.
NODE_MOVES: dict[str, Callable[[Node], None]] = {
    NodeState.ONLINE: node_lifecycle.come_online,
    NodeState.OFFLINE: node_lifecycle.go_offline,
    NodeState.DRAINING: node_lifecycle.start_draining,
    NodeState.RECLAIMED: node_lifecycle.reclaim,
    NodeState.RETIRED: node_lifecycle.retire,
}
JOB_MOVES: dict[str, Callable[[Job], None]] = {
    JobState.RUNNING: job_lifecycle.start,
    JobState.MIGRATING: job_lifecycle.begin_migration,
    JobState.QUEUED: job_lifecycle.requeue,
    JobState.COMPLETED: job_lifecycle.complete,
    JobState.FAILED: lambda job: job_lifecycle.fail(job, "boom"),
    JobState.CANCELLED: job_lifecycle.cancel,
    JobState.SUSPENDED: job_lifecycle.suspend,  # released by the idle watchdog or the loan timer (design §15)
}


def _pairs(allowed: dict[str, frozenset[str]], states: list[str], *, want: bool) -> list[Any]:
    return [
        pytest.param(a, b, id=f"{a}->{b}")
        for a in states
        for b in states
        if (b in allowed[a]) is want
    ]


def _node(state: str) -> Node:
    lab = f.make_provider()
    node, _ = f.make_node(lab, f.make_building(), state=state)
    return node


def _job(state: str) -> Job:
    return f.make_job(f.make_group(), f.make_user(), state=state)


def test_tables_cover_every_state() -> None:
    assert set(node_lifecycle.ALLOWED) == set(NodeState.values)
    assert set(job_lifecycle.ALLOWED) == set(JobState.values)
    assert set(JOB_MOVES) == set(JobState.values)
    # No transition leads back to "registered", so it has no public move function.
    assert set(NODE_MOVES) == set(NodeState.values) - {NodeState.REGISTERED}
    assert not any(NodeState.REGISTERED in targets for targets in node_lifecycle.ALLOWED.values())


@pytest.mark.django_db
@pytest.mark.parametrize(("source", "target"), _pairs(node_lifecycle.ALLOWED, NodeState.values, want=True))
def test_node_transition_allowed(source: str, target: str) -> None:
    node = _node(source)
    NODE_MOVES[target](node)
    assert node.state == target
    assert Node.objects.get(pk=node.pk).state == target


@pytest.mark.django_db
@pytest.mark.parametrize(("source", "target"), _pairs(node_lifecycle.ALLOWED, NodeState.values, want=False))
def test_node_transition_refused(source: str, target: str) -> None:
    node = _node(source)
    before = Node.objects.filter(pk=node.pk).values().get()
    move = NODE_MOVES.get(target) or (lambda n: apply_transition("node", node_lifecycle.ALLOWED, n, target))
    with pytest.raises(InvalidTransition):
        move(node)
    assert Node.objects.filter(pk=node.pk).values().get() == before
    assert node.state == source


@pytest.mark.django_db
@pytest.mark.parametrize("source", NodeState.values)
def test_node_lend_again_only_from_reclaimed(source: str) -> None:
    node = _node(source)
    Node.objects.filter(pk=node.pk).update(killswitch_engaged=True)
    node.refresh_from_db()
    if source == NodeState.RECLAIMED:
        node_lifecycle.lend_again(node)
        node.refresh_from_db()
        assert (node.state, node.killswitch_engaged) == (NodeState.OFFLINE, False)
    else:
        with pytest.raises(InvalidTransition):
            node_lifecycle.lend_again(node)
        node.refresh_from_db()
        assert (node.state, node.killswitch_engaged) == (source, True)


@pytest.mark.django_db
def test_node_reclaim_with_killswitch_sets_flag_in_same_update() -> None:
    node = _node(NodeState.ONLINE)
    node_lifecycle.reclaim(node, killswitch=True)
    node.refresh_from_db()
    assert (node.state, node.killswitch_engaged) == (NodeState.RECLAIMED, True)


@pytest.mark.django_db
@pytest.mark.parametrize(("source", "target"), _pairs(job_lifecycle.ALLOWED, JobState.values, want=True))
def test_job_transition_allowed(source: str, target: str) -> None:
    job = _job(source)
    JOB_MOVES[target](job)
    assert Job.objects.get(pk=job.pk).state == target
    if target in job_lifecycle.TERMINAL:
        assert Job.objects.get(pk=job.pk).finished_at is not None


@pytest.mark.django_db
@pytest.mark.parametrize(("source", "target"), _pairs(job_lifecycle.ALLOWED, JobState.values, want=False))
def test_job_transition_refused(source: str, target: str) -> None:
    job = _job(source)
    before = Job.objects.filter(pk=job.pk).values().get()
    with pytest.raises(InvalidTransition):
        JOB_MOVES[target](job)
    assert Job.objects.filter(pk=job.pk).values().get() == before


@pytest.mark.django_db
def test_concurrent_transition_loses_and_changes_nothing() -> None:
    job = _job(JobState.QUEUED)
    stale = Job.objects.get(pk=job.pk)
    job_lifecycle.cancel(job)
    with pytest.raises(ConcurrentTransition):
        job_lifecycle.start(stale)  # its in-memory state is still "queued"
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
