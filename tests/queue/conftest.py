"""Fixtures for the fair queue's tests (design §16.6): a campus of lent nodes with live agents, two groups with
one researcher each, and helpers that run a placement pass and end jobs through the lifecycle."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.models import Building, Job, Node, Placement, Provider, ResearchGroup
from tests.portal import factories as f


@dataclass
class QueueCampus:
    building: Building
    lab: Provider
    a: ResearchGroup
    b: ResearchGroup
    alice: Any  # member of a
    bob: Any  # member of b
    admin: Any

    def node(self, gpus: int, name: str | None = None, model: str = "RTX 3090") -> Node:
        """A lent node with a live agent."""
        node, _ = f.make_node(self.lab, self.building, name=name, gpus=gpus, model=model, state="online")
        f.connect_agent(node, 9000 + node.pk)
        return node

    def job(self, group: ResearchGroup, gpus: int = 1, **fields: Any) -> Job:
        owner = self.alice if group == self.a else self.bob
        return f.make_job(group, owner, gpu_count=gpus, **fields)

    def client(self, who: Any) -> APIClient:
        client = APIClient()
        client.force_authenticate(who)
        return client


@pytest.fixture(autouse=True)
def in_memory_layer(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def qc(db: Any) -> QueueCampus:
    alice, bob = f.make_user("alice"), f.make_user("bob")
    admin = f.make_user("queue-admin", staff=True)
    building = f.make_building("Queue Hall")
    lab = f.make_provider("Queue Lab")
    a = f.make_group("Group A", (alice,))
    b = f.make_group("Group B", (bob,))
    return QueueCampus(building, lab, a, b, alice, bob, admin)


@pytest.fixture
def place() -> Callable[[], int]:
    """One placement pass (what the control tick runs every period)."""
    from portal.control.loop.ticks import place_queued

    return place_queued


def confirm_started(job: Job) -> None:
    """What the agent's job_started does: queued → running."""
    job.refresh_from_db()
    job_lifecycle.start(job)


def end(job: Job, how: str = "complete") -> None:
    """End ``job`` (started or not) through the lifecycle, closing its placement like the link handlers do."""
    job.refresh_from_db()
    if how == "complete":
        if job.state == "queued":
            job_lifecycle.start(job)
        Placement.objects.filter(job=job, ended_at__isnull=True).update(ended_at=timezone.now(),
                                                                       end_reason="completed")
        job_lifecycle.complete(job)
    elif how == "fail":
        if job.state == "queued":
            job_lifecycle.start(job)
        Placement.objects.filter(job=job, ended_at__isnull=True).update(ended_at=timezone.now(), end_reason="failed")
        job_lifecycle.fail(job, "exit code 1: boom")
    else:
        job_lifecycle.cancel(job)


def open_placements(jobs: list[Job] | None = None) -> set[int]:
    rows = Placement.objects.filter(ended_at__isnull=True)
    if jobs is not None:
        rows = rows.filter(job__in=jobs)
    return set(rows.values_list("job_id", flat=True))


@pytest.fixture
def past_usage() -> Iterator[Callable[..., None]]:
    """Record finished usage for a group: a placement of ``gpus`` GPUs from ``hours_ago`` for ``hours``."""

    def record(qc: QueueCampus, group: ResearchGroup, node: Node, *, gpus: int, hours: float,
               ended_hours_ago: float) -> None:
        job = qc.job(group, gpus=gpus, state="completed")
        now = timezone.now()
        p = Placement.objects.create(job=job, node=node, gpu_indices=list(range(gpus)))
        Placement.objects.filter(pk=p.pk).update(
            started_at=now - dt.timedelta(hours=ended_hours_ago + hours),
            ended_at=now - dt.timedelta(hours=ended_hours_ago), end_reason="completed")

    yield record
