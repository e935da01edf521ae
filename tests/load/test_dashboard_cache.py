"""The admin dashboard's numbers are computed at most once per RECLAIMNET_DASHBOARD_MAX_AGE_S and shared
(portal/web/dashboard.py ``build``): within the bound a request costs no statement and shows one consistent
snapshot; past it the next request recomputes; while another request holds the refresh, the previous snapshot is
served. The clock is injected."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Node
from portal.web import dashboard
from tests.load.conftest import tickcampus

pytestmark = pytest.mark.django_db

LOCAL_CACHE = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                           "LOCATION": "dashboard-cache-test"}}


def _build_at(monkeypatch: pytest.MonkeyPatch, now_s: float) -> tuple[dict[str, Any], int]:
    monkeypatch.setattr(dashboard, "_clock", lambda: now_s)
    with CaptureQueriesContext(connection) as captured:
        data = dashboard.build()
    return data, len(captured.captured_queries)


@override_settings(CACHES=LOCAL_CACHE, RECLAIMNET_DASHBOARD_MAX_AGE_S=5.0, RECLAIMNET_DASHBOARD_REFRESH_S=10.0)
def test_dashboard_numbers_are_shared_within_the_bound_and_recomputed_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache.clear()
    tickcampus().build(20, samples_per_link=3)
    first, statements = _build_at(monkeypatch, 1000.0)
    assert statements > 0
    online = first["summary"]["nodes_online"]
    Node.objects.filter(pk=Node.objects.filter(state=NodeState.ONLINE).first().pk).update(state=NodeState.OFFLINE)

    within, statements = _build_at(monkeypatch, 1004.9)
    assert statements == 0
    assert within["summary"] == first["summary"] and within["charts"] == first["charts"]

    cache.add(dashboard.CACHE_KEY + ":refreshing", 1)  # another process is recomputing
    stale, statements = _build_at(monkeypatch, 1006.0)
    assert statements == 0 and stale["summary"]["nodes_online"] == online
    cache.delete(dashboard.CACHE_KEY + ":refreshing")

    after, statements = _build_at(monkeypatch, 1006.0)
    assert statements > 0
    assert after["summary"]["nodes_online"] == online - 1


@override_settings(CACHES=LOCAL_CACHE, RECLAIMNET_DASHBOARD_MAX_AGE_S=0.0)
def test_a_zero_bound_computes_the_dashboard_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    cache.clear()
    tickcampus().build(5, samples_per_link=2)
    _, first = _build_at(monkeypatch, 1000.0)
    _, second = _build_at(monkeypatch, 1000.0)
    assert first > 0 and second == first
