"""Fixtures for the page tests: two labs, two groups, one user per role, a node and a job on each side."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client

from portal.core.models import Job, Node, Provider, ResearchGroup
from tests.portal import factories as f


@dataclass
class Campus:
    lab: Provider
    other_lab: Provider
    group: ResearchGroup
    other_group: ResearchGroup
    users: dict[str, Any]
    node: Node
    other_node: Node
    job: Job
    other_job: Job


@pytest.fixture
def campus(db: Any) -> Campus:
    users = {
        "admin": f.make_user("admin", staff=True),
        "provider": f.make_user("provider"),
        "other_provider": f.make_user("other_provider"),
        "researcher": f.make_user("researcher"),
        "other_researcher": f.make_user("other_researcher"),
        "outsider": f.make_user("outsider"),
    }
    building = f.make_building("Engineering")
    lab = f.make_provider("Vision Lab", (users["provider"],))
    other_lab = f.make_provider("Robotics Lab", (users["other_provider"],))
    group = f.make_group("NLP Group", (users["researcher"],))
    other_group = f.make_group("Bio Group", (users["other_researcher"],))
    node, _ = f.make_node(lab, building, name="vision-01", gpus=2, state="online")
    other_node, _ = f.make_node(other_lab, building, name="robotics-01", state="online")
    job = f.make_job(group, users["researcher"], name="bert-finetune", restart_s=30)
    f.place_job(job, node)
    f.make_checkpoint(job, node, size_bytes=2_000_000_000, completed_ago_s=300)
    other_job = f.make_job(other_group, users["other_researcher"], name="protein-fold")
    return Campus(lab, other_lab, group, other_group, users, node, other_node, job, other_job)


@pytest.fixture
def client_as(campus: Campus) -> Callable[[str | None], Client]:
    """A Django test client logged in as the named role (None = anonymous)."""

    def make(role: str | None) -> Client:
        client = Client()
        if role is not None:
            client.force_login(campus.users[role])
        return client

    return make



@pytest.fixture(autouse=True)
def dispatch_spy(monkeypatch: pytest.MonkeyPatch) -> f.DispatchSpy:
    """The control plane is not under test here: record its hooks instead of running them."""
    return f.install_dispatch_spy(monkeypatch)
