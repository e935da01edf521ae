"""The admin dashboard's numbers: every chart and table is one function here returning a :class:`Table`.

Queries and arithmetic live here, not in templates. Each table is also a CSV export (``TABLES``) and each chart
is drawn from its table by ``chart_data``. Windows: the last ``WINDOW_DAYS`` days, bucketed by hour when the
data span two days or less, else by day.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

import numpy as np
from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Q, Sum
from django.utils import timezone

from portal.core import campus
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import (
    BandwidthSample,
    DecisionLog,
    Gpu,
    Link,
    Migration,
    MigrationMode,
    Node,
    Placement,
    ReclaimEvent,
    ReclaimKind,
    ResearchGroup,
)
from scheduler.estimators import adaptivity_gap
from scheduler.p3 import migration_budget_bytes_per_s

WINDOW_DAYS = 14
EMERGENCY_KINDS = (ReclaimKind.EMERGENCY, ReclaimKind.KILLSWITCH, ReclaimKind.HEARTBEAT_LOST)


@dataclass
class Table:
    """One dashboard table: what the CSV export writes and what a chart is drawn from."""

    name: str
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""
    headline: float | None = None  # a single number the table sums up to (the adaptivity gap, in %)


# --- time buckets ---------------------------------------------------------------------------------------------


def _buckets(earliest: datetime | None, now: datetime) -> list[datetime]:
    """Bucket starts covering [earliest, now]: hourly for spans up to two days, daily beyond."""
    start = max(earliest or now - timedelta(hours=24), now - timedelta(days=WINDOW_DAYS))
    if now - start <= timedelta(days=2):
        step, first = timedelta(hours=1), start.replace(minute=0, second=0, microsecond=0)
    else:
        step, first = timedelta(days=1), start.replace(hour=0, minute=0, second=0, microsecond=0)
    starts = []
    t = first
    while t <= now:
        starts.append(t)
        t += step
    return starts


def _step(starts: list[datetime]) -> timedelta:
    return starts[1] - starts[0] if len(starts) > 1 else timedelta(hours=1)


def _label(t: datetime, step: timedelta) -> str:
    local = timezone.localtime(t)
    return local.strftime("%a %H:00") if step < timedelta(days=1) else local.strftime("%b %d")


def _percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


# --- tables -----------------------------------------------------------------------------------------------------


def utilisation() -> Table:
    """GPU utilisation over time: busy GPU-time of placements / GPUs lent now (design §6 "GPU util %")."""
    now = timezone.now()
    since = now - timedelta(days=WINDOW_DAYS)
    placements = list(
        Placement.objects.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since))
        .select_related("job")
        .only("started_at", "ended_at", "gpu_indices", "job__gpu_count")
    )
    earliest = min((p.started_at for p in placements), default=None)
    starts = _buckets(earliest, now)
    step = _step(starts)
    lent = campus.lendable_gpus_total()
    table = Table(
        "utilisation",
        "GPU utilisation over time",
        ["period_start", "gpus_lent", "gpu_hours_busy", "utilisation_pct"],
        note="Busy GPU-hours of all placements divided by the GPUs lent now.",
    )
    for start in starts:
        end = min(start + step, now)
        busy_s = 0.0
        for p in placements:
            overlap = (min(p.ended_at or now, end) - max(p.started_at, start)).total_seconds()
            if overlap > 0:
                busy_s += overlap * (len(p.gpu_indices) or p.job.gpu_count)
        capacity_s = lent * max((end - start).total_seconds(), 1.0)
        pct = round(100.0 * busy_s / capacity_s, 1) if lent else 0.0
        table.rows.append([_label(start, step), lent, round(busy_s / 3600, 2), min(pct, 100.0)])
    return table


def reclaims_by_hour() -> Table:
    """Reclaims by hour of day, scheduled vs emergency (kill-switch and lost heartbeats count as emergency)."""
    since = timezone.now() - timedelta(days=WINDOW_DAYS)
    counts: dict[tuple[int, bool], int] = defaultdict(int)
    for requested_at, kind in ReclaimEvent.objects.filter(requested_at__gte=since).values_list(
        "requested_at", "kind"
    ):
        counts[(timezone.localtime(requested_at).hour, kind in EMERGENCY_KINDS)] += 1
    rows = [[h, counts[(h, False)], counts[(h, True)]] for h in range(24)]
    return Table("reclaims_by_hour", "Reclaims by hour of day", ["hour", "scheduled", "emergency"], rows)


def hazard_profile() -> Table:
    """Estimated emergency-reclaim hazard by hour against the observed rate (per lent node-hour)."""
    estimates = {h: v * 3600 for h, v in campus.campus_hazard_by_hour().items()}
    since = timezone.now() - timedelta(days=WINDOW_DAYS)
    events = list(
        ReclaimEvent.objects.filter(requested_at__gte=since, kind__in=EMERGENCY_KINDS).values_list(
            "requested_at", flat=True
        )
    )
    nodes = max(1, Node.objects.exclude(state=NodeState.RETIRED).count())
    days = 1.0
    if events:
        days = max(1.0, math.ceil((timezone.now() - min(events)).total_seconds() / 86400))
    observed: dict[int, int] = defaultdict(int)
    for t in events:
        observed[timezone.localtime(t).hour] += 1
    rows = [
        [h, round(estimates.get(h, 0.0), 4), round(observed[h] / (nodes * days), 4)]
        for h in range(24)
    ]
    return Table(
        "hazard_profile",
        "Hazard profile vs observed emergency reclaims",
        ["hour", "estimated_per_node_hour", "observed_per_node_hour"],
        rows,
        note=f"Observed: emergency reclaims at that hour / ({nodes} nodes x {days:.0f} days).",
    )


def migrations_over_time() -> Table:
    """Work lost, migration success and median/p99 downtime per period (design §6 columns)."""
    now = timezone.now()
    migrations = list(
        Migration.objects.filter(started_at__gte=now - timedelta(days=WINDOW_DAYS))
        .select_related("job")
        .only("started_at", "success", "work_lost_s", "downtime_s", "mode", "job__gpu_count")
    )
    starts = _buckets(min((m.started_at for m in migrations), default=None), now)
    step = _step(starts)
    table = Table(
        "migrations",
        "Migrations: work lost, success and downtime",
        [
            "period_start", "migrations", "planned", "degraded", "succeeded", "success_pct",
            "work_lost_gpu_h", "downtime_median_s", "downtime_p99_s",
        ],
    )
    for start in starts:
        inside = [m for m in migrations if start <= m.started_at < start + step]
        finished = [m for m in inside if m.success is not None]
        ok = sum(1 for m in finished if m.success)
        downtimes = [m.downtime_s for m in inside if m.downtime_s is not None]
        table.rows.append([
            _label(start, step),
            len(inside),
            sum(1 for m in inside if m.mode == MigrationMode.PLANNED),
            sum(1 for m in inside if m.mode == MigrationMode.DEGRADED),
            ok,
            round(100.0 * ok / len(finished), 1) if finished else None,
            round(sum(m.work_lost_s * m.job.gpu_count for m in inside) / 3600, 3),
            _percentile(downtimes, 50),
            _percentile(downtimes, 99),
        ])
    return table


def _p3_entries(decision: DecisionLog, link_names: dict[int, str]) -> list[dict[str, Any]]:
    """One entry per bottleneck a P3 decision covered.

    Two shapes are read: design §5's single bottleneck (``capacity_bytes_per_s`` + ``flows``) and the control
    plane's campus-wide one (``links: [{id, bytes_per_s}]``, each flow listing the indices of its path's links).
    """
    request, response = decision.request or {}, decision.response or {}
    rates = {str(f.get("id")): float(f.get("rate") or 0.0) for f in response.get("admitted") or []}
    degraded = {str(f.get("id")) for f in response.get("degraded") or []}
    beta = float(request.get("reserve_fraction", 0.3))
    reserve_min = float(request.get("reserve_min_bytes_per_s", 0.0))
    flows = request.get("flows") or []
    if "capacity_bytes_per_s" in request:
        name = next((str(request[k]) for k in ("bottleneck", "link", "link_id") if request.get(k) not in (None, "")),
                    f"decision {str(decision.decision_id)[:8]}")
        capacity = float(request["capacity_bytes_per_s"] or 0.0)
        budget = response.get("migration_budget_bytes_per_s")
        ids = [str(f.get("id")) for f in flows]
        return [_entry(name, capacity, budget, beta, reserve_min, ids, rates, degraded, request, decision)]
    links = request.get("links") or []
    entries = []
    for index, link in enumerate(links):
        ids = [str(f.get("id")) for f in flows if index in (f.get("links") or [])]
        if not ids:
            continue
        name = link_names.get(link.get("id"), str(link.get("id")))
        entries.append(_entry(name, float(link.get("bytes_per_s") or 0.0), None, beta, reserve_min, ids, rates,
                              degraded, {}, decision))
    return entries


def _entry(
    name: str, capacity: float, budget: float | None, beta: float, reserve_min: float, ids: list[str],
    rates: dict[str, float], degraded: set[str], request: dict[str, Any], decision: DecisionLog,
) -> dict[str, Any]:
    if budget is None:  # design §4: B_mig = max(0, B - max(beta B, B_min))
        budget = float(migration_budget_bytes_per_s(capacity, beta, reserve_min))
    rate = sum(rates.get(i, 0.0) for i in ids)
    return {
        "name": name, "capacity": capacity, "budget": float(budget), "rate": rate,
        "admitted": sum(1 for i in ids if i in rates), "degraded": sum(1 for i in ids if i in degraded),
        "demand": request.get("research_bytes_per_s"), "at": decision.created_at,
    }


def traffic() -> Table:
    """The latest P3 admission per bottleneck and what it leaves research traffic (design §4).

    Research-traffic degradation is the share of research demand the link cannot carry beside the admitted
    migrations, when the decision recorded that demand (``research_bytes_per_s``); else the share of the
    reserve ``B_res`` that migrations ate into (0 whenever P3 respected Theorem 4).
    """
    link_names = dict(Link.objects.values_list("pk", "name"))
    latest: dict[str, dict[str, Any]] = {}
    for decision in DecisionLog.objects.filter(kind=DecisionLog.Kind.P3).order_by("-created_at", "-id")[:500]:
        for entry in _p3_entries(decision, link_names):
            latest.setdefault(entry["name"], entry)
    table = Table(
        "traffic",
        "P3 admissions and research traffic per bottleneck",
        [
            "bottleneck", "capacity_mbit_s", "migration_budget_mbit_s", "admitted", "degraded",
            "migration_rate_mbit_s", "migration_share_pct", "research_left_mbit_s", "research_degradation_pct",
            "decided_at",
        ],
    )
    for name, e in sorted(latest.items()):
        capacity, budget, rate = e["capacity"], e["budget"], e["rate"]
        left = max(0.0, capacity - rate)
        if e["demand"]:
            degradation = 100.0 * max(0.0, float(e["demand"]) - left) / float(e["demand"])
        else:
            reserve = max(0.0, capacity - budget)
            degradation = 100.0 * max(0.0, rate - budget) / reserve if reserve else 0.0
        table.rows.append([
            name,
            round(capacity * 8 / 1e6, 1),
            round(budget * 8 / 1e6, 1),
            e["admitted"],
            e["degraded"],
            round(rate * 8 / 1e6, 1),
            round(100.0 * rate / capacity, 1) if capacity else None,
            round(left * 8 / 1e6, 1),
            round(degradation, 1),
            timezone.localtime(e["at"]).strftime("%Y-%m-%d %H:%M:%S"),
        ])
    return table


def building_bandwidth() -> Table:
    """Per building: its uplink's capacity, estimated mean and lower-bound available bandwidth (three statements
    whatever the number of buildings)."""
    table = Table(
        "building_bandwidth",
        "Bandwidth per building (uplink)",
        ["building", "link", "capacity_mbit_s", "mean_mbit_s", "lower_mbit_s", "samples_24h"],
    )
    since = timezone.now() - timedelta(hours=24)
    uplinks = list(Link.objects.filter(kind=Link.Kind.UPLINK, lower_switch__isnull=False).select_related(
        "lower_switch__building", "estimate"
    ).order_by("lower_switch__building__name", "name"))
    samples = {
        row["link_id"]: (row["n"], row["total"])
        for row in BandwidthSample.objects.filter(link__in=[link.pk for link in uplinks], sampled_at__gte=since)
        .values("link_id").annotate(n=Count("pk"), total=Sum("bytes_per_s"))
    }
    for link in uplinks:
        building = link.lower_switch.building
        estimate = getattr(link, "estimate", None)
        count, total = samples.get(link.pk, (0, 0.0))
        mean = estimate.mean_bytes_per_s if estimate else None
        if mean is None and count:
            mean = total / count
        table.rows.append([
            building.name if building else link.name,
            link.name,
            round(link.capacity_bytes_per_s * 8 / 1e6, 1),
            round(mean * 8 / 1e6, 1) if mean is not None else None,
            round(estimate.lower_bytes_per_s * 8 / 1e6, 1) if estimate else None,
            count,
        ])
    return table


def adaptivity() -> Table:
    """Theorem 2's adaptivity gap over the 24 hourly epochs: campus hazard λ_h and available bandwidth B_h."""
    hazard = campus.campus_hazard_by_hour()
    per_hour: dict[int, list[float]] = defaultdict(list)
    since = timezone.now() - timedelta(days=WINDOW_DAYS)
    for t, v in BandwidthSample.objects.filter(sampled_at__gte=since).values_list("sampled_at", "bytes_per_s")[
        :50000
    ]:
        if v > 0:
            per_hour[timezone.localtime(t).hour].append(v)
    table = Table(
        "adaptivity",
        "Adaptivity gap (Theorem 2) by hourly epoch",
        ["hour", "hazard_per_h", "bandwidth_mbit_s", "w_x1e6"],
        note="W = sqrt(λ / B_eff) per hourly epoch, times 10^6; gap = sqrt(E[λ] E[1/B_eff]) / E[W] - 1.",
    )
    hours = [h for h in range(24) if hazard.get(h, 0) > 0 and per_hour.get(h)]
    for h in hours:
        lam, bw = hazard[h], sum(per_hour[h]) / len(per_hour[h])
        table.rows.append([h, round(lam * 3600, 4), round(bw * 8 / 1e6, 1), round(1e6 * math.sqrt(lam / bw), 4)])
    if len(hours) >= 2:
        lam_arr = np.array([hazard[h] for h in hours])
        bw_arr = np.array([sum(per_hour[h]) / len(per_hour[h]) for h in hours])
        table.headline = round(100 * adaptivity_gap(lam_arr, bw_arr), 2)
    return table


def groups() -> Table:
    """Usage and losses per research group (charged to the group, never to the wrong person).

    Used and lost GPU-hours are measured from placements and migrations (the rows the control plane
    writes); ``charged`` columns are the group's own counters, as accounting keeps them.
    """
    table = Table(
        "groups",
        "Usage and losses per research group",
        ["group", "jobs", "running", "gpu_hours_used", "work_lost_gpu_h", "migrations", "charged_gpu_h",
         "charged_lost_gpu_h"],
    )
    live = (JobState.RUNNING, JobState.MIGRATING)
    now = timezone.now()
    used_s: dict[int, float] = defaultdict(float)
    for p in Placement.objects.select_related("job").only("started_at", "ended_at", "gpu_indices", "job__group_id",
                                                          "job__gpu_count"):
        used_s[p.job.group_id] += ((p.ended_at or now) - p.started_at).total_seconds() * (
            len(p.gpu_indices) or p.job.gpu_count
        )
    lost_s: dict[int, float] = defaultdict(float)
    migrations: dict[int, int] = defaultdict(int)
    for m in Migration.objects.select_related("job").only("work_lost_s", "job__group_id", "job__gpu_count"):
        lost_s[m.job.group_id] += m.work_lost_s * m.job.gpu_count
        migrations[m.job.group_id] += 1
    for group in ResearchGroup.objects.annotate(
        n_jobs=Count("jobs", distinct=True),
        n_running=Count("jobs", filter=Q(jobs__state__in=live), distinct=True),
    ).order_by("name"):
        table.rows.append([
            group.name,
            group.n_jobs,
            group.n_running,
            round(used_s[group.pk] / 3600, 2),
            round(lost_s[group.pk] / 3600, 3),
            migrations[group.pk],
            round(group.gpu_hours_used, 2),
            round(group.gpu_hours_lost_to_reclaims, 3),
        ])
    return table


TABLES: dict[str, Callable[[], Table]] = {
    "utilisation": utilisation,
    "reclaims_by_hour": reclaims_by_hour,
    "hazard_profile": hazard_profile,
    "migrations": migrations_over_time,
    "traffic": traffic,
    "building_bandwidth": building_bandwidth,
    "adaptivity": adaptivity,
    "groups": groups,
}


# --- charts -----------------------------------------------------------------------------------------------------


def _column(table: Table, name: str) -> list[Any]:
    i = table.columns.index(name)
    return [row[i] for row in table.rows]


def _series(table: Table, x: str, ys: Iterable[tuple[str, str]], kind: str = "line") -> dict[str, Any]:
    return {
        "type": kind,
        "labels": _column(table, x),
        "datasets": [{"label": label, "data": _column(table, y)} for y, label in ys],
    }


def summary() -> dict[str, Any]:
    """The headline numbers above the charts."""
    week = timezone.now() - timedelta(days=7)
    migrations = Migration.objects.filter(started_at__gte=week)
    finished = migrations.exclude(success__isnull=True)
    ok = finished.filter(success=True).count()
    lost_gpu_s = sum(m.work_lost_s * m.job.gpu_count for m in migrations.select_related("job"))
    return {
        "nodes_online": Node.objects.filter(state=NodeState.ONLINE).count(),
        "nodes_total": Node.objects.exclude(state=NodeState.RETIRED).count(),
        "gpus_lent": campus.lendable_gpus_total(),
        "gpus_total": Gpu.objects.exclude(node__state=NodeState.RETIRED).count(),
        "jobs_running": Placement.objects.filter(ended_at__isnull=True).count(),
        "reclaims_week": ReclaimEvent.objects.filter(requested_at__gte=week).count(),
        "migration_success_pct": round(100.0 * ok / finished.count(), 1) if finished.exists() else None,
        "work_lost_h_week": round(lost_gpu_s / 3600, 2),
    }


CACHE_KEY = "reclaimnet:dashboard:v1"
_REFRESH_LOCK_KEY = CACHE_KEY + ":refreshing"
_clock = time.time  # the tests inject theirs


def build(tables: dict[str, Table] | None = None) -> dict[str, Any]:
    """Every table, the Chart.js data drawn from them and the summary (the dashboard page, its summary fragment
    and its chart data all render this).

    Computed at most once per ``RECLAIMNET_DASHBOARD_MAX_AGE_S`` for the whole deployment (docs/design.md §9.1:
    the numbers are the read model's, only their age changes): the result is kept whole in Django's cache (Redis
    in production, shared by every process), so all its numbers come from one computation and agree with each
    other. When it is older than the bound, one request (the holder of a refresh lock) recomputes it while the
    others still get the previous one; an entry is dropped ``RECLAIMNET_DASHBOARD_REFRESH_S`` after the bound,
    so nothing older than their sum is ever shown. A bound of 0 computes on every call, as does passing
    ``tables``."""
    max_age_s = float(settings.RECLAIMNET_DASHBOARD_MAX_AGE_S)
    if tables is not None or max_age_s <= 0:
        return _build(tables)
    refresh_s = float(settings.RECLAIMNET_DASHBOARD_REFRESH_S)
    cached = cache.get(CACHE_KEY)
    now_s = _clock()
    if cached is not None and now_s - cached[0] <= max_age_s:
        return cast(dict[str, Any], cached[1])
    refreshing = cache.add(_REFRESH_LOCK_KEY, 1, timeout=refresh_s)
    if cached is not None and not refreshing:
        return cast(dict[str, Any], cached[1])  # another request is refreshing it: this one is still in bounds
    try:
        data = _build(None)
        # Dropped when max_age_s + refresh_s have passed since the numbers were read, whatever the build took.
        cache.set(CACHE_KEY, (now_s, data), timeout=max(0.001, max_age_s + refresh_s - (_clock() - now_s)))
    finally:
        if refreshing:
            cache.delete(_REFRESH_LOCK_KEY)
    return data


def _build(tables: dict[str, Table] | None) -> dict[str, Any]:
    t = tables or {name: fn() for name, fn in TABLES.items()}
    charts = {
        "utilisation": _series(t["utilisation"], "period_start", [("utilisation_pct", "GPU utilisation %")]),
        "reclaims_by_hour": _series(
            t["reclaims_by_hour"], "hour", [("scheduled", "scheduled"), ("emergency", "emergency")], "bar"
        ),
        "hazard_profile": _series(
            t["hazard_profile"],
            "hour",
            [("estimated_per_node_hour", "estimated λ (per node-hour)"), ("observed_per_node_hour", "observed")],
        ),
        "migrations": _series(
            t["migrations"], "period_start", [("work_lost_gpu_h", "work lost (GPU-h)"), ("success_pct", "success %")]
        ),
        "downtime": _series(
            t["migrations"], "period_start", [("downtime_median_s", "median (s)"), ("downtime_p99_s", "p99 (s)")]
        ),
        "traffic": _series(t["traffic"], "bottleneck", [("admitted", "admitted"), ("degraded", "degraded")], "bar"),
        "degradation": _series(
            t["traffic"],
            "bottleneck",
            [("migration_share_pct", "migration share of link %"),
             ("research_degradation_pct", "research-traffic degradation %")],
            "bar",
        ),
        "building_bandwidth": _series(
            t["building_bandwidth"],
            "building",
            [("capacity_mbit_s", "capacity"), ("mean_mbit_s", "mean available"), ("lower_mbit_s", "lower bound")],
            "bar",
        ),
        "adaptivity": _series(t["adaptivity"], "hour", [("w_x1e6", "W = √(λ/B_eff), scaled by 10⁶")]),
        "groups": _series(
            t["groups"], "group", [("gpu_hours_used", "GPU-h used"), ("work_lost_gpu_h", "GPU-h lost")], "bar"
        ),
    }
    # Quantities of different size get their own right-hand axis.
    charts["migrations"]["datasets"][1]["yAxisID"] = "y1"
    charts["groups"]["datasets"][1]["yAxisID"] = "y1"
    return {
        "tables": t,
        "charts": charts,
        "chart_scripts": [(f"chart-{key}", spec) for key, spec in charts.items()],
        "summary": summary(),
        "adaptivity_gap_pct": t["adaptivity"].headline,
    }
