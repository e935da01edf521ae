"""Generic API test helpers (netbox ``utilities/testing/api.py`` style): resources declare data, not code.

- ``Endpoint``: one write endpoint, how to reach it and what each role should get;
- ``snapshot``: every row a write could touch, to prove a refused call changed nothing;
- ``bad_field_cases``: expands ``{field: [bad values]}`` into parametrized cases;
- ``assert_no_n_plus_one``: the list query count does not grow with the number of rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from portal.core.models import (
    AuditLog,
    Gpu,
    Job,
    LendingWindow,
    Link,
    Node,
    Placement,
    ReclaimEvent,
)
from tests.portal.conftest import ROLES, World


@dataclass(frozen=True)
class Endpoint:
    """A write endpoint: ``url``/``body`` are built from the world; ``setup`` puts the target in a state where
    the call is meaningful; ``allowed`` maps role → success status; every other role gets ``denied``."""

    name: str
    method: str
    url: Callable[[World], str]
    allowed: Mapping[str, int]
    denied: int = 403
    body: Callable[[World], Any] | None = None
    setup: Callable[[World], None] | None = None
    denied_overrides: Mapping[str, int] = field(default_factory=dict)

    def expected(self, role: str) -> int:
        if role in self.allowed:
            return self.allowed[role]
        return self.denied_overrides.get(role, self.denied)

    def call(self, client: APIClient, world: World, body: Any = None) -> Any:
        payload = body if body is not None else (self.body(world) if self.body else None)
        method = getattr(client, self.method.lower())
        if self.method.upper() == "GET":
            return method(self.url(world))
        return method(self.url(world), payload, format="json")


def role_cases(endpoints: Iterable[Endpoint]) -> list[Any]:
    return [pytest.param(ep, role, id=f"{ep.name}-{role}") for ep in endpoints for role in ROLES]


def snapshot() -> dict[str, Any]:
    """Every row a write endpoint can touch (token hashes, states, windows, events, audit trail)."""
    return {
        "nodes": list(Node.objects.order_by("pk").values()),
        "gpus": Gpu.objects.count(),
        "links": list(Link.objects.order_by("pk").values()),
        "windows": list(LendingWindow.objects.order_by("pk").values()),
        "reclaims": ReclaimEvent.objects.count(),
        "jobs": list(Job.objects.order_by("pk").values()),
        "placements": list(Placement.objects.order_by("pk").values()),
        "audit": AuditLog.objects.count(),
    }


def bad_field_cases(name: str, fields: Mapping[str, Iterable[Any]]) -> list[Any]:
    return [
        pytest.param(name, field_name, value, id=f"{name}-{field_name}-{value!r:.30}")
        for field_name, values in fields.items()
        for value in values
    ]


def assert_no_n_plus_one(client: APIClient, url: str, add_rows: Callable[[int], None]) -> None:
    """The list endpoint costs the same number of queries for 2 rows as for 6."""
    add_rows(2)
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    add_rows(4)
    with CaptureQueriesContext(connection) as many:
        assert client.get(url).status_code == 200
    assert len(many) == len(few), f"{url}: {len(few)} queries for few rows, {len(many)} for more (N+1)"
