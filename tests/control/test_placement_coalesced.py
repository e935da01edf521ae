"""A burst of submits shares placement passes (design §10): each submit's task joins the pass that is queued and
has not started, or queues one; the pass places every queued job. No submit is left unplaced while a node can
take it, and the outbox stays the one way work is queued (design §8).

The relay is run by hand here (``relay_once`` with the in-process publisher, as the embedded default runs it),
so each test sees what is queued between the steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from control_helpers import make_node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture(autouse=True)
def no_pass_pending() -> Iterator[None]:
    """No flag of another test's pass (the cache outlives a test's database)."""
    from django.core.cache import cache

    from portal.control.loop.ticks import PASS_PENDING_KEY

    cache.delete(PASS_PENDING_KEY)
    yield
    cache.delete(PASS_PENDING_KEY)


@pytest.fixture
def relayed_by_hand(settings: Any) -> None:
    """Outbox rows wait for :func:`_relay` (the embedded default's relay mode, its loop not running)."""
    settings.RECLAIMNET_OUTBOX_RELAY = "loop"


def _online(name: str, gpus: int = 2) -> Any:
    """A lent node whose agent is connected (open session, hello with no jobs)."""
    from portal.control.link.handlers import hello, open_session

    node, _ = make_node(name, gpus=gpus)
    session = open_session(node.pk, f"chan-{name}", "127.0.0.1")
    hello(node.pk, session, {"type": "hello", "agent_version": "t", "gpus": [], "data_host": "127.0.0.1",
                             "data_port": 9000 + node.pk, "jobs": []})
    return node


def _submit(count: int) -> list[Any]:
    """``count`` one-GPU jobs submitted as a researcher would (each commits with its outbox row)."""
    from django.contrib.auth import get_user_model

    from portal.core.models import ResearchGroup
    from portal.core.services.jobs import submit_job

    group, _ = ResearchGroup.objects.get_or_create(slug="g", defaults={"name": "G"})
    user, _ = get_user_model().objects.get_or_create(username="researcher")
    group.members.add(user)
    return [submit_job(user, group=group, name=f"burst-{i}", gpu_count=1, expected_runtime_s=600,
                       ckpt_bytes_estimate=1000, command="python examples/train_numpy.py", restart_s=1.0)
            for i in range(count)]


def _relay() -> int:
    """Run every due outbox row in this process; how many ran."""
    from portal.core import outbox

    total = 0
    while sent := outbox.relay_once(outbox.run_in_process)[0]:
        total += sent
    return total


def _passes_queued() -> int:
    from portal.core.models import OutboxMessage
    from portal.core.outbox import Task

    return OutboxMessage.objects.filter(task_name=Task.PLACE_QUEUED).count()


def _gather_ends() -> None:
    """The passes' gathering delay is over: they are due."""
    from django.utils import timezone

    from portal.core.models import OutboxMessage
    from portal.core.outbox import Task

    OutboxMessage.objects.filter(task_name=Task.PLACE_QUEUED, sent_at__isnull=True).update(
        available_at=timezone.now())


def _unplaced(jobs: list[Any]) -> list[str]:
    from portal.core.models import Placement

    placed = set(Placement.objects.filter(job__in=jobs, ended_at__isnull=True).values_list("job_id", flat=True))
    return [job.name for job in jobs if job.pk not in placed]


def test_a_burst_of_submits_is_placed_by_one_shared_pass(relayed_by_hand: None) -> None:
    for name in ("a", "b", "c"):
        _online(name)
    _relay()  # what registering the nodes queued
    jobs = _submit(5)
    assert _relay() == 5  # each submit's own task ran …
    assert _passes_queued() == 1  # … and all five joined one pass
    assert _unplaced(jobs) == [job.name for job in jobs]  # the pass gathers before it places
    _gather_ends()
    assert _relay() == 1 + 5  # the pass, and each placement's start command to its agent
    assert _unplaced(jobs) == []


def test_more_submits_than_gpus_fill_every_gpu_and_the_rest_wait(relayed_by_hand: None) -> None:
    from portal.core.models import Job

    _online("a")
    jobs = _submit(3)
    _relay()
    _gather_ends()
    _relay()
    assert len(_unplaced(jobs)) == 1
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], state="queued").count() == 3  # started once confirmed


def test_a_submit_after_the_pass_started_queues_a_pass_of_its_own(
        relayed_by_hand: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from portal.control.loop import ticks

    _online("a")
    first, second, third = _submit(3)
    assert ticks.request_placement(first.pk) == "pass queued"
    assert ticks.request_placement(second.pk) == "joined a pending pass"
    during: list[str] = []
    real_place_queued = ticks.place_queued

    def pass_meanwhile() -> int:  # the third submit's task runs while the pass reads the queue
        during.append(ticks.request_placement(third.pk))
        return real_place_queued()

    monkeypatch.setattr(ticks, "place_queued", pass_meanwhile)
    ticks.placement_pass()
    assert during == ["pass queued"] and _passes_queued() == 2


def test_a_pass_that_could_not_be_queued_holds_no_submit_back(
        relayed_by_hand: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import OperationalError

    from portal.control.loop import ticks

    _online("a")
    first, second = _submit(2)

    def broken(*args: object, **kwargs: object) -> None:
        raise OperationalError("the database went away")

    monkeypatch.setattr(ticks.outbox, "enqueue", broken)
    with pytest.raises(OperationalError):  # the task is retried (RETRY in portal/control/tasks.py)
        ticks.request_placement(first.pk)
    monkeypatch.undo()
    assert ticks.request_placement(second.pk) == "pass queued"


def test_a_job_placed_or_cancelled_meanwhile_needs_no_pass(relayed_by_hand: None) -> None:
    from portal.control.loop.ticks import request_placement
    from portal.core.models import Job

    _online("a")
    (job,) = _submit(1)
    Job.objects.filter(pk=job.pk).update(state="cancelled")
    assert request_placement(job.pk) == "not queued"
    assert _passes_queued() == 0


def test_with_the_inline_relay_a_submit_is_placed_as_it_commits() -> None:
    _online("a")
    jobs = _submit(1)
    assert _unplaced(jobs) == []

