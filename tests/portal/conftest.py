"""Fixtures for the portal tests: a small campus with one lab and one group per side, and a dispatch spy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from portal.core.models import Building, Node, Provider, ResearchGroup
from tests.portal import factories as f


@dataclass
class World:
    """Two labs, two groups and one user per role; ``node`` belongs to ``lab``, ``job`` to ``group``."""

    building: Building
    lab: Provider
    other_lab: Provider
    group: ResearchGroup
    other_group: ResearchGroup
    users: dict[str, Any]
    node: Node
    other_node: Node
    token: str
    job: Any = None


ROLES = f.ROLES


@pytest.fixture
def world(db: Any) -> World:
    t = f.make_two_labs()
    job = f.make_job(t.group, t.users["researcher"], name="bert-finetune")
    return World(t.building, t.lab, t.other_lab, t.group, t.other_group, t.users, t.node, t.other_node,
                 t.node_token, job)


@pytest.fixture
def client_for(world: World) -> Callable[[str | None], APIClient]:
    """An API client authenticated as the named role (None = anonymous)."""

    def make(role: str | None) -> APIClient:
        client = APIClient()
        if role is not None:
            client.force_authenticate(world.users[role])
        return client

    return make



@pytest.fixture
def dispatch_spy(monkeypatch: pytest.MonkeyPatch) -> f.DispatchSpy:
    """Record calls to the control-plane hooks instead of running them."""
    return f.install_dispatch_spy(monkeypatch)
