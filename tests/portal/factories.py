"""Small model factories for the portal tests (plain functions; every object gets a unique name)."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.utils import timezone

from portal.core import outbox
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.models import (
    Building,
    Checkpoint,
    Job,
    Link,
    Node,
    Placement,
    Provider,
    ResearchGroup,
    Switch,
)
from portal.core.services import nodes as node_services

T = TypeVar("T")

_seq = itertools.count(1)
PASSWORD = "test-password-123"


def uid() -> int:
    return next(_seq)


def make_user(username: str | None = None, *, staff: bool = False, password: str | None = None) -> AbstractUser:
    """A user; without ``password`` it has none usable (API tests use ``force_authenticate``)."""
    return get_user_model().objects.create_user(
        username=username or f"user{uid()}", password=password, is_staff=staff, is_superuser=staff
    )


def make_provider(name: str | None = None, members: tuple[Any, ...] = ()) -> Provider:
    name = name or f"Lab {uid()}"
    provider = Provider.objects.create(name=name, slug=name.lower().replace(" ", "-"))
    provider.members.add(*members)
    return provider


def make_group(name: str | None = None, members: tuple[Any, ...] = ()) -> ResearchGroup:
    name = name or f"Group {uid()}"
    group = ResearchGroup.objects.create(name=name, slug=name.lower().replace(" ", "-"))
    group.members.add(*members)
    return group


def make_building(name: str | None = None, core: Switch | None = None) -> Building:
    """A building with its switch and a 10 Gbit/s uplink to ``core`` (created if needed)."""
    building = Building.objects.create(name=name or f"Building {uid()}")
    core = core or Switch.objects.filter(tier=Switch.Tier.CORE).first()
    if core is None:
        core = Switch.objects.create(name="core", tier=Switch.Tier.CORE)
    switch = Switch.objects.create(name=f"sw-{building.pk}", tier=Switch.Tier.BUILDING, building=building)
    Link.objects.create(name=f"uplink-{building.pk}", kind=Link.Kind.UPLINK, upper=core, lower_switch=switch,
                        capacity_bytes_per_s=1.25e9)
    return building


def make_node(provider: Provider, building: Building, *, name: str | None = None, gpus: int = 1,
              model: str = "RTX 3090", state: str | None = None, **kwargs: Any) -> tuple[Node, str]:
    """Register a node through the service; ``state`` then forces a lifecycle state (test setup only)."""
    node, token = node_services.register_node(
        None, provider=provider, building=building, name=name or f"node-{uid()}",
        gpus=[{"model": model}] * gpus, **kwargs,
    )
    if state is not None:
        Node.objects.filter(pk=node.pk).update(state=state)
        node.refresh_from_db()
    return node, token


def connect_agent(node: Node, data_port: int = 9000) -> None:
    """What a live agent leaves in the database: an open session with a data address (the campus read model
    counts a node's GPUs only while it has one)."""
    from portal.control.models import AgentSession

    AgentSession.objects.create(node=node, channel_name=f"test-{node.pk}", data_host="127.0.0.1",
                                data_port=data_port)


def make_job(group: ResearchGroup, owner: Any, *, state: str | None = None, **fields: Any) -> Job:
    values: dict[str, Any] = {
        "name": f"job-{uid()}", "command": "python train.py", "gpu_count": 1, "expected_runtime_s": 3600.0,
        "ckpt_bytes_estimate": 3_200_000_000,
    }
    values.update(fields)
    job = Job.objects.create(group=group, owner=owner, **values)
    if state is not None:
        Job.objects.filter(pk=job.pk).update(state=state)
        job.refresh_from_db()
    return job


def place_job(job: Job, node: Node, gpu_indices: list[int] | None = None,
              started_at: dt.datetime | None = None) -> Placement:
    """Open a placement and start the job (queued → running)."""
    placement = Placement.objects.create(job=job, node=node, gpu_indices=gpu_indices or [0])
    if started_at is not None:
        Placement.objects.filter(pk=placement.pk).update(started_at=started_at)
        placement.refresh_from_db()
    job_lifecycle.start(job)
    return placement


def make_checkpoint(job: Job, node: Node, *, sequence: int = 1, size_bytes: int = 1_000_000_000,
                    completed_ago_s: float = 60.0) -> Checkpoint:
    completed = timezone.now() - dt.timedelta(seconds=completed_ago_s)
    return Checkpoint.objects.create(
        job=job, node=node, sequence=sequence, size_bytes=size_bytes, sha256="0" * 64,
        taken_at=completed - dt.timedelta(seconds=5), completed_at=completed,
    )


@dataclass
class DispatchSpy:
    """Records what the outbox hands to the control plane after commit (task name, first argument), instead
    of running it."""

    calls: list[tuple[str, int]] = field(default_factory=list)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def install_dispatch_spy(monkeypatch: pytest.MonkeyPatch) -> DispatchSpy:
    """Relay the outbox right after each commit (``inline``) to a recorder; returns the recorder."""
    from django.conf import settings

    spy = DispatchSpy()
    monkeypatch.setattr(settings, "RECLAIMNET_OUTBOX_RELAY", "inline", raising=False)
    monkeypatch.setattr(outbox, "run_in_process",
                        lambda message: spy.calls.append((message.task_name, (message.args or [None])[0])))
    return spy


@dataclass
class TwoLabs:
    """Two labs with one online node each, two research groups, and a user for every role."""

    users: dict[str, AbstractUser]
    building: Building
    lab: Provider
    other_lab: Provider
    group: ResearchGroup
    other_group: ResearchGroup
    node: Node
    node_token: str
    other_node: Node


ROLES = ("admin", "provider", "other_provider", "researcher", "other_researcher", "outsider")


def make_two_labs() -> TwoLabs:
    """The permission tests' campus: "provider" is in Vision Lab, "researcher" in NLP Group, "outsider" in none."""
    users = {role: make_user(role, staff=role == "admin") for role in ROLES}
    building = make_building("Engineering")
    lab = make_provider("Vision Lab", (users["provider"],))
    other_lab = make_provider("Robotics Lab", (users["other_provider"],))
    group = make_group("NLP Group", (users["researcher"],))
    other_group = make_group("Bio Group", (users["other_researcher"],))
    node, token = make_node(lab, building, name="vision-01", gpus=2, state="online")
    other_node, _ = make_node(other_lab, building, name="robotics-01", state="online")
    connect_agent(node, 9001)
    connect_agent(other_node, 9002)
    return TwoLabs(users, building, lab, other_lab, group, other_group, node, token, other_node)


def at_once(count: int, action: Callable[[], T], timeout_s: float = 60.0) -> list[T]:
    """Run ``action`` in ``count`` threads released together (each with its own database connection, closed
    after); returns their results, re-raising the first error in the caller's thread."""
    import threading

    from django.db import connection

    barrier = threading.Barrier(count)
    results: list[T] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            barrier.wait(10)
            result = action()
            with lock:
                results.append(result)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    if errors:
        raise errors[0]
    return results
