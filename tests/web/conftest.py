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
    t = f.make_two_labs()
    job = f.make_job(t.group, t.users["researcher"], name="bert-finetune", restart_s=30)
    f.place_job(job, t.node)
    f.make_checkpoint(job, t.node, size_bytes=2_000_000_000, completed_ago_s=300).replica_nodes.add(t.other_node)
    other_job = f.make_job(t.other_group, t.users["other_researcher"], name="protein-fold")
    return Campus(t.lab, t.other_lab, t.group, t.other_group, t.users, t.node, t.other_node, job, other_job)


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
