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


ROLES = ("admin", "provider", "other_provider", "researcher", "other_researcher", "outsider")


@pytest.fixture
def world(db: Any) -> World:
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
    node, token = f.make_node(lab, building, name="vision-01", gpus=2, state="online")
    other_node, _ = f.make_node(other_lab, building, name="robotics-01", state="online")
    job = f.make_job(group, users["researcher"], name="bert-finetune")
    return World(building, lab, other_lab, group, other_group, users, node, other_node, token, job)


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
