"""The calibrated research reserve in the portal (design §4 "Calibrated reserve"): the daily task stores it per
link with its source, an admin's override wins (admin page and API, bad input answers 400 naming the field),
P3 reads it, the dashboard shows it."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from portal.core.models import AuditLog, Link, LinkClassSample, LinkReserve

DAY = dt.timedelta(days=1)


def _samples(link: Link, node: Any, shares: list[float], start: dt.datetime, end: dt.datetime) -> None:
    times = [start + (end - start) * k / max(1, len(shares) - 1) for k in range(len(shares))]
    LinkClassSample.objects.bulk_create([
        LinkClassSample(link=link, node=node, sampled_at=t, interval_s=2.0,
                        research_bytes=int(s * link.capacity_bytes_per_s * 2.0), checkpoint_bytes=0)
        for s, t in zip(shares, times, strict=True)])


def test_task_routes_to_the_evaluation_queue_daily() -> None:
    assert settings.CELERY_TASK_ROUTES["control.calibrate_reserves"] == {"queue": "evaluation"}
    entry = next(e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "control.calibrate_reserves")
    assert entry["schedule"] == 86400.0


def test_the_task_stores_the_p95_of_the_last_seven_days(campus: Any) -> None:
    from portal.control.tasks import calibrate_reserves

    now = timezone.now()
    link = campus.node.access_link
    _samples(link, campus.node, [0.9] * 40, now - 20 * DAY, now - 10 * DAY)  # old, and pruned (> 8 days)
    _samples(link, campus.node, [0.1] * 90 + [0.6] * 10, now - 6 * DAY, now - dt.timedelta(seconds=1))
    out = calibrate_reserves()
    row = LinkReserve.objects.get(link=link)
    assert row.source == "calibrated" and row.samples == 100
    assert row.p95_share == pytest.approx(np.quantile([0.1] * 90 + [0.6] * 10, 0.95), rel=1e-6)
    assert row.reserve_bytes_per_s == pytest.approx(row.p95_share * link.capacity_bytes_per_s, rel=1e-6)
    assert out["pruned"] == 40
    assert not LinkClassSample.objects.filter(sampled_at__lt=now - 8 * DAY).exists()
    # a link without samples: β·B, source "default" — never below β·B
    other = campus.other_node.access_link
    quiet = LinkReserve.objects.get(link=other)
    assert quiet.source == "default" and quiet.reserve_bytes_per_s == pytest.approx(0.3 * other.capacity_bytes_per_s)


def test_a_quiet_link_keeps_beta_b(campus: Any) -> None:
    from portal.control.reserve import calibrate_reserves

    link = campus.node.access_link
    _samples(link, campus.node, [0.01] * 20, timezone.now() - 3 * DAY, timezone.now())
    calibrate_reserves()
    row = LinkReserve.objects.get(link=link)
    assert row.source == "calibrated"
    assert row.reserve_bytes_per_s == pytest.approx(0.3 * link.capacity_bytes_per_s)


def test_override_wins_and_clearing_it_restores_the_calibration(campus: Any) -> None:
    from portal.control.reserve import calibrate_reserves, reserve_min_by_link, set_reserve_override

    link = campus.node.access_link
    cap = link.capacity_bytes_per_s
    _samples(link, campus.node, [0.5] * 20, timezone.now() - 2 * DAY, timezone.now())
    calibrate_reserves()
    set_reserve_override(campus.users["admin"], link, 0.8 * cap)
    calibrate_reserves()  # the next calibration keeps the override
    row = LinkReserve.objects.get(link=link)
    assert (row.source, row.reserve_bytes_per_s) == ("override", pytest.approx(0.8 * cap))
    assert row.calibrated_bytes_per_s == pytest.approx(0.5 * cap)
    assert reserve_min_by_link([link.pk])[0] == pytest.approx(0.8 * cap)
    assert AuditLog.objects.filter(action="link.reserve_override", object_id=str(link.pk)).exists()
    set_reserve_override(campus.users["admin"], link, None)
    row.refresh_from_db()
    assert (row.source, row.reserve_bytes_per_s) == ("calibrated", pytest.approx(0.5 * cap))


def test_p3_uses_the_stored_reserve(campus: Any) -> None:
    from portal.control.reserve import reserve_min_by_link, set_reserve_override
    from scheduler.p3 import P3Flows, admit_flows_on_paths

    link, other = campus.node.access_link, campus.other_node.access_link
    cap = link.capacity_bytes_per_s
    set_reserve_override(campus.users["admin"], link, 0.9 * cap)
    b_min = reserve_min_by_link([link.pk, other.pk])
    assert b_min.tolist() == [pytest.approx(0.9 * cap), 0.0]  # the other link: the global setting (0)
    flows = P3Flows(ids=("a",), bytes=np.array([1e9]), notice_s=np.array([600.0]), restart_s=np.array([0.0]),
                    cap_bytes_per_s=np.array([np.inf]))
    d = admit_flows_on_paths(flows, np.array([cap, cap]), [np.array([0, 1])], reserve_min_bytes_per_s=b_min)
    assert np.allclose(d.migration_budget_bytes_per_s, [0.1 * cap, 0.7 * cap])
    assert d.rate_bytes_per_s[0] == pytest.approx(0.1 * cap)  # the calibrated link is the bottleneck


def _patch(client: Client, link: Link, body: dict[str, Any]) -> Any:
    return client.patch(f"/api/campus/links/{link.pk}/reserve/", data=json.dumps(body),
                        content_type="application/json")


def test_api_reads_and_admins_override(campus: Any, client_as: Callable[[str | None], Client]) -> None:
    link = campus.node.access_link
    cap = link.capacity_bytes_per_s
    got = client_as("researcher").get(f"/api/campus/links/{link.pk}/reserve/")
    assert got.status_code == 200 and got.json()["source"] == "default"
    assert got.json()["reserve_bytes_per_s"] == pytest.approx(0.3 * cap)
    assert _patch(client_as("researcher"), link, {"override_bytes_per_s": 0.5 * cap}).status_code == 403
    done = _patch(client_as("admin"), link, {"override_bytes_per_s": 0.5 * cap})
    assert done.status_code == 200 and done.json()["source"] == "override"
    for bad in (0.1 * cap, 2 * cap, "lots"):
        refused = _patch(client_as("admin"), link, {"override_bytes_per_s": bad})
        assert refused.status_code == 400 and "override_bytes_per_s" in refused.json()
    missing = _patch(client_as("admin"), link, {})
    assert missing.status_code == 400 and "override_bytes_per_s" in missing.json()
    assert LinkReserve.objects.get(link=link).reserve_bytes_per_s == pytest.approx(0.5 * cap)  # unchanged
    cleared = _patch(client_as("admin"), link, {"override_bytes_per_s": None})
    assert cleared.status_code == 200 and cleared.json()["source"] == "default"


def test_admin_page_override_is_validated(campus: Any, client_as: Callable[[str | None], Client]) -> None:
    from portal.control.reserve import calibrate_reserves

    calibrate_reserves()
    link = campus.node.access_link
    row = LinkReserve.objects.get(link=link)
    url = f"/admin/core/linkreserve/{row.pk}/change/"
    refused = client_as("admin").post(url, {"override_bytes_per_s": "1"})
    assert refused.status_code == 200 and b"between" in refused.content
    row.refresh_from_db()
    assert row.override_bytes_per_s is None
    ok = client_as("admin").post(url, {"override_bytes_per_s": str(0.6 * link.capacity_bytes_per_s)})
    assert ok.status_code == 302
    row.refresh_from_db()
    assert row.source == "override"


def test_dashboard_shows_the_reserve(campus: Any, client_as: Callable[[str | None], Client]) -> None:
    from portal.control.reserve import set_reserve_override

    link = campus.node.access_link
    set_reserve_override(campus.users["admin"], link, 0.5 * link.capacity_bytes_per_s)
    page = client_as("admin").get("/dashboard/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "Research reserve per link" in text and 'data-testid="reserve-source">override<' in text


def test_agents_are_told_their_links_reserve(campus: Any) -> None:
    from portal.control.models import AgentCommand
    from portal.control.reserve import calibrate_reserves, set_reserve_override

    link = campus.node.access_link
    set_reserve_override(campus.users["admin"], link, 0.5 * link.capacity_bytes_per_s)
    sent = AgentCommand.objects.filter(node=campus.node, kind="set_reserve", superseded_at__isnull=True).get()
    assert sent.payload["reserve_share"] == pytest.approx(0.5)
    calibrate_reserves()  # the override still counts: nothing changed for this link, nothing sent again
    assert AgentCommand.objects.filter(node=campus.node, kind="set_reserve").count() == 1
    # the other node's link got its first stored reserve (β·B): told once
    other = AgentCommand.objects.get(node=campus.other_node, kind="set_reserve")
    assert other.payload["reserve_share"] == pytest.approx(0.3)


def test_research_use_is_each_nodes_newest_recent_sample_summed_per_link_however_many_links_are_asked(
        campus: Any) -> None:
    """What P1 lends out of the reserve (design §4 "Work-conserving reserve"): per access link, the newest
    sample of each of its nodes within RESEARCH_USE_MAX_AGE_S, summed; trunk samples and older ones do not count,
    and a long list of links (read without an IN list) answers as a short one does."""
    from portal.control.reserve import (
        IN_LIST_MAX,
        RESEARCH_USE_MAX_AGE_S,
        research_use_by_link,
        reserve_min_by_link,
    )
    from portal.core.models import LinkScope

    now = timezone.now()
    link, other = campus.node.access_link, campus.other_node.access_link

    def sample(node: Any, on: Link, research_bytes: int, age_s: float, scope: str = LinkScope.ACCESS) -> None:
        LinkClassSample.objects.create(link=on, node=node, scope=scope, interval_s=10.0, checkpoint_bytes=0,
                                       research_bytes=research_bytes, sampled_at=now - dt.timedelta(seconds=age_s))

    sample(campus.node, link, 5_000, 50.0)
    sample(campus.node, link, 1_000, 5.0)  # the node's newest: 100 B/s
    sample(campus.node, link, 9_000_000, 1.0, scope=LinkScope.TRUNK)  # another scope
    sample(campus.other_node, link, 2_000, 20.0)  # a second node reporting on the same link: 200 B/s more
    sample(campus.other_node, other, 7_000, RESEARCH_USE_MAX_AGE_S + 30.0)  # too old: not measured now
    expected = {link.pk: 300.0}
    assert research_use_by_link([link.pk, other.pk], now=now) == pytest.approx(expected)
    many = [link.pk, other.pk, *range(10**6, 10**6 + IN_LIST_MAX)]  # past the IN-list bound
    assert research_use_by_link(many, now=now) == pytest.approx(expected)
    assert research_use_by_link([other.pk], now=now) == {}
    assert reserve_min_by_link(many).tolist() == reserve_min_by_link([link.pk, other.pk]).tolist() + [
        float(settings.RECLAIMNET["RESERVE_MIN_BYTES_PER_S"])] * IN_LIST_MAX
