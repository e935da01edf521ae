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

from portal.core import snapshots
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Node
from portal.web import dashboard
from tests.load.conftest import tickcampus

pytestmark = pytest.mark.django_db

LOCAL_CACHE = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                           "LOCATION": "dashboard-cache-test"}}


def _build_at(monkeypatch: pytest.MonkeyPatch, now_s: float) -> tuple[dict[str, Any], int]:
    monkeypatch.setattr(snapshots, "_clock", lambda: now_s)
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


@override_settings(CACHES=LOCAL_CACHE, RECLAIMNET_DASHBOARD_MAX_AGE_S=5.0, RECLAIMNET_DASHBOARD_REFRESH_S=10.0)
def test_summary_api_and_metrics_read_one_shared_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """/api/summary/ and /metrics come from one snapshot: after a change inside the bound both still agree (on the
    old numbers, at no statement for the summary); past it, on the new. The dashboard reads its "now" numbers
    with its own snapshot, so they are never older than it."""
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from portal.core.metrics import CampusCollector
    from portal.core.services.summary import shared_utilization_summary

    cache.clear()
    tickcampus().build(8, samples_per_link=2)
    admin = get_user_model().objects.create_superuser("snap-admin", "a@example.org", "x")
    api = APIClient()
    api.force_authenticate(admin)
    monkeypatch.setattr(snapshots, "_clock", lambda: 1000.0)
    first = api.get("/api/summary/").json()
    online = first["nodes_by_state"]["online"]
    Node.objects.filter(pk=Node.objects.filter(state=NodeState.ONLINE).first().pk).update(state=NodeState.OFFLINE)

    def metric_online() -> float:
        family = next(m for m in CampusCollector().collect() if m.name == "reclaimnet_nodes")
        return next(s.value for s in family.samples if s.labels["state"] == "online")

    monkeypatch.setattr(snapshots, "_clock", lambda: 1004.0)
    with CaptureQueriesContext(connection) as captured:
        assert shared_utilization_summary()["nodes_by_state"]["online"] == online
    assert len(captured.captured_queries) == 0
    assert api.get("/api/summary/").json() == first
    assert metric_online() == online
    assert dashboard.build()["summary"]["nodes_online"] == online - 1  # a new dashboard snapshot reads now

    monkeypatch.setattr(snapshots, "_clock", lambda: 1006.0)
    assert api.get("/api/summary/").json()["nodes_by_state"]["online"] == online - 1
    assert metric_online() == online - 1


@override_settings(CACHES=LOCAL_CACHE, RECLAIMNET_DASHBOARD_MAX_AGE_S=5.0, RECLAIMNET_DASHBOARD_REFRESH_S=10.0)
def test_an_unreachable_cache_computes_the_answer_instead_of_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis down must not take /metrics and /api/summary/ with it: the snapshot is computed for the call."""
    class Unreachable:
        def __getattr__(self, name: str) -> Any:
            def fail(*_: Any, **__: Any) -> Any:
                raise ConnectionError("Redis is restarting")
            return fail

    monkeypatch.setattr(snapshots, "cache", Unreachable())
    calls: list[int] = []
    assert snapshots.shared("test-unreachable", lambda: calls.append(1) or len(calls)) == 1
    assert snapshots.shared("test-unreachable", lambda: calls.append(1) or len(calls)) == 2


@override_settings(CACHES=LOCAL_CACHE, RECLAIMNET_DASHBOARD_MAX_AGE_S=5.0, RECLAIMNET_DASHBOARD_REFRESH_S=10.0)
def test_an_older_computation_never_replaces_a_newer_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    cache.clear()
    cache.set("test-order", (1010.0, "newer"))  # written meanwhile by a request that started later
    monkeypatch.setattr(snapshots, "_clock", lambda: 1020.0)  # this request's read: the entry is past the bound
    assert snapshots.shared("test-order", lambda: "computed") == "computed"
    assert cache.get("test-order") == (1020.0, "computed")
    cache.set("test-order", (1030.0, "newest"))
    monkeypatch.setattr(snapshots, "_clock", lambda: 1036.0)

    def slow() -> str:
        cache.set("test-order", (1040.0, "finished first"))  # another request finished while this one computed
        return "older"

    assert snapshots.shared("test-order", slow) == "older"
    assert cache.get("test-order") == (1040.0, "finished first")


@override_settings(CACHES=LOCAL_CACHE, RECLAIMNET_DASHBOARD_MAX_AGE_S=5.0, RECLAIMNET_DASHBOARD_REFRESH_S=10.0)
def test_topology_is_shared_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from portal.core import snapshots

    cache.clear()
    tickcampus().build(4, samples_per_link=2)
    api = APIClient()
    api.force_authenticate(get_user_model().objects.create_superuser("topo-admin", "t@example.org", "x"))
    monkeypatch.setattr(snapshots, "_clock", lambda: 1000.0)
    first = api.get("/api/campus/topology/").json()
    assert first["nodes"]
    Node.objects.filter(name=first["nodes"][0]["id"]).update(state=NodeState.RETIRED)
    monkeypatch.setattr(snapshots, "_clock", lambda: 1003.0)
    assert api.get("/api/campus/topology/").json() == first
    monkeypatch.setattr(snapshots, "_clock", lambda: 1006.0)
    assert len(api.get("/api/campus/topology/").json()["nodes"]) == len(first["nodes"]) - 1
