"""``/metrics``: Prometheus text, for a staff session or the METRICS_TOKEN bearer token only."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from portal.core.models import Migration
from portal.core.services.reclaims import emergency_reclaim
from tests.portal.conftest import World


@pytest.mark.django_db
def test_metrics_refuses_anonymous_and_non_staff(world: World, settings: Any) -> None:
    settings.METRICS_TOKEN = "scrape-secret"
    assert Client().get("/metrics").status_code == 401
    client = Client()
    client.force_login(world.users["provider"])
    assert client.get("/metrics").status_code == 403
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Token scrape-secret").status_code == 401


@pytest.mark.django_db
def test_metrics_without_configured_token_accepts_no_bearer(world: World, settings: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    settings.METRICS_TOKEN = ""
    monkeypatch.delenv("METRICS_TOKEN", raising=False)
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


@pytest.mark.django_db
def test_metrics_token_from_environment(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRICS_TOKEN", "env-secret")
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer env-secret").status_code == 200


@pytest.mark.django_db
def test_metrics_content(world: World, settings: Any) -> None:
    settings.METRICS_TOKEN = "scrape-secret"
    emergency_reclaim(world.node, world.users["provider"])
    Migration.objects.create(job=world.job, source=world.node, mode="degraded", work_lost_s=120, success=False)
    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    body = response.content.decode()
    assert 'reclaimnet_nodes{state="reclaimed"} 1.0' in body
    assert 'reclaimnet_nodes{state="online"} 1.0' in body
    assert 'reclaimnet_jobs{state="queued"} 1.0' in body
    assert 'reclaimnet_reclaims_total{kind="emergency"} 1.0' in body
    assert 'reclaimnet_migrations_total{mode="degraded"} 1.0' in body
    assert "reclaimnet_work_lost_seconds_total 120.0" in body
    staff = Client()
    staff.force_login(world.users["admin"])
    assert staff.get("/metrics").status_code == 200
