"""The admin dashboard tells the truth (docs/design.md §9.1): its "now" numbers are ``/metrics``'s for the same
state, with the same definitions; a past hour's utilisation divides by the GPUs lent in that hour; what is in
flight now is apart from the history of P3 decisions; one time range drives every number and a bad one is
refused with a message naming the field; each range has its own cached computation."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from portal.control.models import Transfer, TransferPurpose, TransferState, hash_transfer_token
from portal.core import campus, snapshots
from portal.core.models import DecisionLog, Migration, Node, NodeAvailability, Placement
from portal.core.services.summary import DEFINITIONS
from portal.web import dashboard
from tests.portal import factories as f
from tests.portal.conftest import World

pytestmark = pytest.mark.django_db

LOCAL_CACHE = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                           "LOCATION": "dashboard-truth-test"}}


def _admin(world: World) -> Client:
    client = Client()
    client.force_login(world.users["admin"])
    return client


def _metrics(world: World) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics as {(sample name, labels): value}, and each family's HELP under ("HELP", name)."""
    body = _admin(world).get("/metrics").content.decode()
    out: dict[Any, Any] = {}
    for family in text_string_to_metric_families(body):
        out[("HELP", family.name)] = family.documentation
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _busy_campus(world: World) -> None:
    """Every way a node can count or not: a floor, offline, kill-switched, retired; a running job."""
    f.make_node(world.lab, world.building, gpus=4, gpu_floor=1, state="online")
    f.make_node(world.lab, world.building, gpus=4, state="offline")
    switched, _ = f.make_node(world.lab, world.building, gpus=2, state="online")
    Node.objects.filter(pk=switched.pk).update(killswitch_engaged=True)
    f.make_node(world.other_lab, world.building, gpus=8, state="retired")
    f.place_job(world.job, world.node, [0, 1])


def test_the_dashboards_now_numbers_are_the_metrics_for_the_same_state(world: World) -> None:
    _busy_campus(world)
    numbers = dashboard.summary()
    metrics = _metrics(world)
    assert numbers["nodes_online"] == metrics[("reclaimnet_nodes", (("state", "online"),))]
    assert numbers["gpus_lent"] == metrics[("reclaimnet_gpus_lendable", ())] == 2 + 1 + 3
    assert numbers["gpus_total"] == metrics[("reclaimnet_gpus", ())] == 2 + 1 + 4 + 4 + 2  # the retired 8 not
    assert numbers["gpus_busy"] == metrics[("reclaimnet_gpus_busy", ())] == 2
    assert numbers["gpu_utilization_pct"] == pytest.approx(100 * metrics[("reclaimnet_gpu_utilization", ())], abs=0.05)
    assert numbers["jobs_running"] == metrics[("reclaimnet_jobs", (("state", "running"),))] == 1
    # The same words: /metrics's HELP is the definition the dashboard shows on hover.
    assert metrics[("HELP", "reclaimnet_gpus_lendable")] == DEFINITIONS["gpus_lent"]
    assert metrics[("HELP", "reclaimnet_gpus_busy")] == DEFINITIONS["gpus_busy"]
    assert metrics[("HELP", "reclaimnet_gpus")] == DEFINITIONS["gpus_total"]


def test_every_headline_number_has_its_definition_on_hover(world: World) -> None:
    _busy_campus(world)
    page = html.unescape(_admin(world).get("/dashboard/").content.decode())
    for key, definition in [("nodes_online", "nodes_online"), ("gpus_lent", "gpus_lent"), ("gpus_busy", "gpus_busy"),
                            ("jobs_running", "jobs_running"), ("utilisation_range", "utilisation_range"),
                            ("reclaims", "reclaims"), ("migration_success", "migration_success"),
                            ("work_lost", "work_lost_gpu_hours")]:
        assert f'aria-describedby="def-{key}"' in page, key
        start = page.index(f'role="tooltip" id="def-{key}">')
        assert DEFINITIONS[definition] in page[start:start + 600], key
    assert "6 / 13" in page  # GPUs lent / GPUs of nodes not retired, as /metrics counts them


def _hour_start(t: dt.datetime) -> dt.datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def test_a_past_hours_utilisation_divides_by_the_gpus_lent_in_that_hour(world: World) -> None:
    # vision-01 (2 GPUs) lent for ten hours; robotics-01 (1 GPU) only for the last two. Now both: 3 GPUs.
    now = timezone.now()
    hour = _hour_start(now)
    NodeAvailability.objects.create(node=world.node, at=hour - dt.timedelta(hours=10), state="online", lent=True)
    NodeAvailability.objects.create(node=world.other_node, at=hour - dt.timedelta(hours=10), state="offline",
                                    lent=False)
    NodeAvailability.objects.create(node=world.other_node, at=hour - dt.timedelta(hours=2), state="online", lent=True)
    # One GPU of vision-01 busy from 6 h to 3 h ago.
    f.place_job(world.job, world.node, [0], started_at=hour - dt.timedelta(hours=6))
    Placement.objects.filter(job=world.job).update(ended_at=hour - dt.timedelta(hours=3))
    window = dashboard.parse_window({"range": "24h"}, now=now)
    table = dashboard.utilisation(window)
    rows = {row[0]: dict(zip(table.columns, row, strict=True)) for row in table.rows}
    past = rows[dashboard._label(hour - dt.timedelta(hours=5), dashboard.HOUR)]
    assert past["gpus_lent_mean"] == 2.0 and past["gpu_hours_busy"] == 1.0
    assert past["utilisation_pct"] == 50.0  # 1 busy GPU-hour of 2 lent, not of the 3 lent now
    recent = rows[dashboard._label(hour - dt.timedelta(hours=1), dashboard.HOUR)]
    assert recent["gpus_lent_mean"] == 3.0 == campus.lendable_gpus_total()
    assert recent["utilisation_pct"] == 0.0
    before = rows[dashboard._label(hour - dt.timedelta(hours=12), dashboard.HOUR)]
    assert before["gpus_lent_mean"] == 0.0 and before["utilisation_pct"] is None  # nothing lent: no utilisation
    # The range's headline is the same arithmetic: 3 busy GPU-hours over the GPU-hours lent in the range.
    lent_h = sum(r["gpu_hours_lent"] for r in rows.values())
    assert dashboard.summary(window)["utilisation_range_pct"] == pytest.approx(100 * 3 / lent_h, abs=0.1)


def test_gpu_time_integrates_the_read_models_lent_and_busy_counts(world: World) -> None:
    now = timezone.now()
    edges = [now - dt.timedelta(hours=2), now - dt.timedelta(hours=1), now]
    f.place_job(world.job, world.node, [0], started_at=now - dt.timedelta(minutes=30))
    gpu = campus.gpu_time(edges, now=now)
    # No availability rows: both nodes lent throughout, as they are now (2 + 1 GPUs).
    assert gpu.lent_gpu_s.tolist() == pytest.approx([3 * 3600, 3 * 3600])
    assert gpu.busy_gpu_s.tolist() == pytest.approx([0, 1800], abs=1)
    assert gpu.lent_node_s.tolist() == pytest.approx([2 * 3600, 2 * 3600])


def _transfer(world: World, state: str) -> Transfer:
    f.place_job(world.job, world.node, [0])
    checkpoint = f.make_checkpoint(world.job, world.node)
    migration = Migration.objects.create(job=world.job, source=world.node, destination=world.other_node,
                                         mode="planned", bytes=checkpoint.size_bytes)
    now = timezone.now()
    return Transfer.objects.create(
        job=world.job, checkpoint=checkpoint, migration=migration, source=world.node, destination=world.other_node,
        purpose=TransferPurpose.MIGRATION, token_hash=hash_transfer_token("t"), rate_bytes_per_s=50e6, state=state,
        finished_at=now if state != TransferState.ISSUED else None, expires_at=now + dt.timedelta(minutes=10))


def test_in_flight_now_lists_only_copies_on_the_wire(world: World) -> None:
    transfer = _transfer(world, TransferState.ISSUED)
    rows = {row[0]: dict(zip(dashboard.traffic_now().columns, row, strict=True)) for row in dashboard.traffic_now().rows}
    # Both nodes hang off the same building switch: the copy crosses their two access links, not the uplink.
    assert set(rows) == {world.node.access_link.name, world.other_node.access_link.name}
    assert rows[world.node.access_link.name]["copies"] == 1 and rows[world.node.access_link.name]["rate_mbit_s"] == 400.0
    Transfer.objects.filter(pk=transfer.pk).update(state=TransferState.RECEIVED, finished_at=timezone.now())
    assert dashboard.traffic_now().rows == []


def test_a_finished_migration_is_history_not_in_flight(world: World) -> None:
    _transfer(world, TransferState.RECEIVED)
    access = world.node.access_link
    DecisionLog.objects.create(
        kind=DecisionLog.Kind.P3,
        request={"links": [{"id": access.pk, "bytes_per_s": 1.25e8}], "reserve_fraction": 0.3,
                 "flows": [{"id": "job-1", "bytes": 3e9, "notice_s": 120, "restart_s": 30, "links": [0]}]},
        response={"admitted": [{"id": "job-1", "min_rate": 3.3e7, "rate": 5e7}], "degraded": []},
    )
    page = _admin(world).get("/dashboard/").content.decode()
    now_section = page[page.index('data-testid="traffic-now"'):page.index("</section>", page.index(
        'data-testid="traffic-now"'))]
    assert 'data-testid="traffic-now-empty"' in now_section and access.name not in now_section
    history = {row[0]: row for row in dashboard.traffic().rows}
    assert history[access.name][dashboard.traffic().columns.index("admitted")] == 1
    # A decision older than the range is not in that range's history.
    DecisionLog.objects.update(created_at=timezone.now() - dt.timedelta(days=3))
    assert dashboard.traffic(dashboard.parse_window({"range": "24h"})).rows == []
    assert dashboard.traffic(dashboard.parse_window({"range": "7d"})).rows != []


def test_presets_and_custom_days_name_their_range() -> None:
    now = timezone.make_aware(dt.datetime(2025, 3, 20, 15, 45))
    day = dashboard.parse_window({"range": "24h"}, now=now)
    assert (day.since, day.until, day.step, day.query) == (now - dt.timedelta(hours=24), now, dashboard.HOUR,
                                                           "range=24h")
    assert dashboard.parse_window({}, now=now).key == "7d" and dashboard.parse_window({}, now=now).query == ""
    assert dashboard.parse_window({"range": "30d"}, now=now).step == dt.timedelta(days=1)
    custom = dashboard.parse_window({"from": "2025-03-01", "to": "2025-03-07"}, now=now)
    assert custom.key == "custom" and custom.since == timezone.make_aware(dt.datetime(2025, 3, 1))
    assert custom.until == timezone.make_aware(dt.datetime(2025, 3, 8))  # the last day is included
    assert custom.query == "range=custom&from=2025-03-01&to=2025-03-07" and not custom.live
    to_today = dashboard.parse_window({"range": "custom", "from": "2025-03-19"}, now=now)
    assert to_today.until == now and to_today.live
    labels, edges = dashboard.parse_window({"range": "7d"}, now=now).buckets()
    assert edges[0] == now - dt.timedelta(days=7) and edges[-1] == now and len(labels) == len(edges) - 1
    assert all(e.hour % 6 == 0 and e.minute == 0 for e in edges[1:-1])


@pytest.mark.parametrize(("params", "field", "words"), [
    ({"range": "custom", "from": "2025-03-10", "to": "2025-03-01"}, "from", "after it ends"),
    ({"range": "custom", "from": "2024-01-01", "to": "2025-03-01"}, "to", "at most 90"),
    ({"range": "custom", "from": "2025-13-01"}, "from", "is not a date"),
    ({"range": "custom", "from": "2025-02-30"}, "from", "is not a date"),
    ({"range": "custom", "from": "yesterday"}, "from", "YYYY-MM-DD"),
    ({"range": "custom"}, "from", "first day"),
    ({"range": "custom", "from": "2999-01-01", "to": "2999-01-02"}, "from", "future"),
    ({"range": "1y"}, "range", "24 hours, 7 days, 30 days"),
])
def test_a_range_the_dashboard_cannot_show_is_refused_with_the_field_named(
    world: World, params: dict[str, str], field: str, words: str,
) -> None:
    with pytest.raises(dashboard.WindowError) as refused:
        dashboard.parse_window(params)
    assert set(refused.value.errors) == {field} and words in refused.value.errors[field]
    client = _admin(world)
    page = client.get("/dashboard/", params)
    assert page.status_code == 400
    body = html.unescape(page.content.decode())
    assert 'data-testid="range-errors"' in body and words in body and "canvas" not in body
    data = client.get("/dashboard/charts.json", params)
    assert data.status_code == 400 and words in data.json()[field][0]
    assert client.get("/dashboard/", {**params, "fragment": "summary"}).status_code == 400
    assert client.get("/dashboard/export/utilisation.csv", params).status_code == 400


def test_the_range_in_the_url_drives_every_table_and_link(world: World) -> None:
    client = _admin(world)
    page = client.get("/dashboard/", {"range": "30d"}).content.decode()
    assert "/dashboard/export/groups.csv?range=30d" in page
    assert 'data-charts-url="/dashboard/charts.json?range=30d"' in page
    assert "fragment=summary&amp;range=30d" in page
    assert "The last 30 days" in page
    hourly = client.get("/dashboard/charts.json", {"range": "24h"}).json()
    daily = client.get("/dashboard/charts.json", {"range": "30d"}).json()
    assert len(hourly["utilisation"]["labels"]) in (24, 25) and len(daily["utilisation"]["labels"]) in (30, 31)
    assert "Hour starting" in hourly["utilisation"]["axes"]["x"] and "Day" in daily["utilisation"]["axes"]["x"]


def test_every_chart_titles_its_axes_with_units(world: World) -> None:
    charts = dashboard.build()["charts"]
    for key, spec in charts.items():
        assert spec["axes"].get("x") and spec["axes"].get("y"), key
        for ds in spec["datasets"]:
            second = ds.get("yAxisID") or ds.get("xAxisID")
            if second:
                assert spec["axes"][second], key
    groups = charts["groups"]
    assert groups["indexAxis"] == "y" and groups["datasets"][1]["xAxisID"] == "x1"
    assert "GPU-hours used" in groups["axes"]["x"] and "GPU-hours lost" in groups["axes"]["x1"]
    assert "(%)" in charts["migrations"]["axes"]["y1"] and "GPU-hours" in charts["migrations"]["axes"]["y"]


@override_settings(CACHES=LOCAL_CACHE, RECLAIMNET_DASHBOARD_MAX_AGE_S=5.0, RECLAIMNET_DASHBOARD_REFRESH_S=10.0)
def test_each_range_is_computed_once_per_bound_and_kept_apart(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.clear()
    monkeypatch.setattr(snapshots, "_clock", lambda: 1000.0)

    def statements(params: dict[str, str]) -> tuple[dict[str, Any], int]:
        with CaptureQueriesContext(connection) as captured:
            data = dashboard.build(dashboard.parse_window(params))
        return data, len(captured.captured_queries)

    day, first = statements({"range": "24h"})
    week, other = statements({})
    assert first > 0 and other > 0  # a different range is its own computation
    again, none = statements({"range": "24h"})
    assert none == 0 and again["charts"] == day["charts"]
    assert dashboard.cache_key(dashboard.parse_window({})) == dashboard.CACHE_KEY
    assert dashboard.cache_key(dashboard.parse_window({"range": "24h"})) != dashboard.CACHE_KEY
    assert week["summary"]["gpus_lent"] == day["summary"]["gpus_lent"]
