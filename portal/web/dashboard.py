"""The admin dashboard's numbers: every chart and table is one function here returning a :class:`Table`.

Queries and arithmetic live here and in the campus read model (``portal.core.campus``,
``portal.core.services.summary``: the same definitions ``/metrics`` and ``/api/summary/`` use, docs/design.md
§9.1), not in templates. Each table is also a CSV export (``TABLES``) and each chart is drawn from its table by
``_build``. Every table covers one :class:`Window` — the last 24 hours, 7 days, 30 days or a custom range of days
— bucketed by hour up to two days, by six hours up to ten, else by day.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

import numpy as np
from django.db.models import Avg, Count, Q, Sum
from django.db.models.functions import ExtractHour
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from portal.core import campus, snapshots
from portal.core.lifecycle.jobs import JobState
from portal.core.models import (
    BandwidthSample,
    DecisionLog,
    Link,
    Migration,
    MigrationMode,
    Placement,
    ReclaimEvent,
    ReclaimKind,
    ResearchGroup,
)
from portal.core.services.summary import DEFINITIONS, utilization_summary, window_summary
from portal.web.dashboard_window import (  # noqa: F401 (re-exported: the dashboard's range)
    DATE_HELP,
    DEFAULT_RANGE,
    HOUR,
    MAX_RANGE_DAYS,
    PRESETS,
    Window,
    WindowError,
    default_window,
    parse_window,
)
from scheduler.estimators import adaptivity_gap
from scheduler.p3 import migration_budget_bytes_per_s

EMERGENCY_KINDS = (ReclaimKind.EMERGENCY, ReclaimKind.KILLSWITCH, ReclaimKind.HEARTBEAT_LOST)

# --- tables -------------------------------------------------------------------------------------------------------


@dataclass
class Table:
    """One dashboard table: what the CSV export writes and what a chart is drawn from."""

    name: str
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""  # what the numbers mean: shown under the chart and on hover of its title
    headline: float | None = None  # a single number the table sums up to (the adaptivity gap, in %)


def _label(t: datetime, step: timedelta) -> str:
    local = timezone.localtime(t)
    if step >= timedelta(days=1):
        return local.strftime("%b %d")
    return local.strftime("%a %H:00") if step == HOUR else local.strftime("%b %d %H:00")


def _percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def _hourly(window: Window) -> tuple[list[datetime], campus.GpuTime]:
    """The range's hours and the read model's GPU time in each (computed once per window)."""
    if "hourly" not in window._memo:
        edges = window.hours()
        now = window.until if window.live else max(window.until, timezone.now())
        window._memo["hourly"] = (edges, campus.gpu_time(edges, now=now))
    return cast(tuple[list[datetime], campus.GpuTime], window._memo["hourly"])


def utilisation(window: Window | None = None) -> Table:
    """GPU utilisation per period: busy GPU-hours on lent nodes / GPU-hours lent in that period (design §9.1).

    Both come from the read model's :func:`portal.core.campus.gpu_time` over the range's hours, summed into
    the chart's periods: a past hour is divided by the GPUs lent in that hour, not by those lent now."""
    window = window or default_window()
    labels, edges = window.buckets()
    hour_edges, gpu = _hourly(window)
    # Each hour cell belongs to the period whose edges enclose it (periods start on hour boundaries).
    period_of = np.searchsorted(np.array([e.timestamp() for e in edges]),
                                np.array([e.timestamp() for e in hour_edges[:-1]]), side="right") - 1
    lent = np.bincount(period_of, weights=gpu.lent_gpu_s, minlength=len(labels))
    busy = np.bincount(period_of, weights=gpu.busy_gpu_s, minlength=len(labels))
    table = Table(
        "utilisation",
        "GPU utilisation over time",
        ["period_start", "gpus_lent_mean", "gpu_hours_lent", "gpu_hours_busy", "utilisation_pct"],
        note=DEFINITIONS["utilisation_range"].replace("in the range", "in the period") + " Empty where no GPU "
        "was lent.",
    )
    step = window.step
    for i, start in enumerate(labels):
        length_s = max((edges[i + 1] - edges[i]).total_seconds(), 1.0)
        pct = round(min(100.0, 100.0 * busy[i] / lent[i]), 1) if lent[i] > 0 else None
        table.rows.append([_label(start, step), round(lent[i] / length_s, 1), round(lent[i] / 3600, 2),
                           round(busy[i] / 3600, 2), pct])
    return table


def reclaims_by_hour(window: Window | None = None) -> Table:
    """Reclaims in the range by hour of day, scheduled vs emergency (kill-switch and lost heartbeats count as
    emergency)."""
    window = window or default_window()
    counts: dict[tuple[int, bool], int] = defaultdict(int)
    for requested_at, kind in ReclaimEvent.objects.filter(
            requested_at__gte=window.since, requested_at__lt=window.until).values_list("requested_at", "kind"):
        counts[(timezone.localtime(requested_at).hour, kind in EMERGENCY_KINDS)] += 1
    rows = [[h, counts[(h, False)], counts[(h, True)]] for h in range(24)]
    return Table("reclaims_by_hour", "Reclaims by hour of day", ["hour", "scheduled", "emergency"], rows,
                 note="Reclaims requested in the range, by the hour of day they were requested; emergency "
                      "includes kill-switches and lost nodes.")


def hazard_profile(window: Window | None = None) -> Table:
    """Estimated emergency-reclaim hazard by hour against the rate observed in the range (per lent node-hour)."""
    window = window or default_window()
    estimates = {h: v * 3600 for h, v in campus.campus_hazard_by_hour().items()}
    hour_edges, gpu = _hourly(window)
    exposure_h: dict[int, float] = defaultdict(float)
    for start, node_s in zip(hour_edges[:-1], gpu.lent_node_s, strict=True):
        exposure_h[timezone.localtime(start).hour] += node_s / 3600
    observed: dict[int, int] = defaultdict(int)
    for t in ReclaimEvent.objects.filter(requested_at__gte=window.since, requested_at__lt=window.until,
                                         kind__in=EMERGENCY_KINDS).values_list("requested_at", flat=True):
        observed[timezone.localtime(t).hour] += 1
    rows = [[h, round(estimates.get(h, 0.0), 4),
             round(observed[h] / exposure_h[h], 4) if exposure_h[h] > 0 else None, round(exposure_h[h], 1)]
            for h in range(24)]
    return Table(
        "hazard_profile",
        "Hazard profile vs observed emergency reclaims",
        ["hour", "estimated_per_node_hour", "observed_per_node_hour", "lent_node_hours"],
        rows,
        note="Estimated: the campus hazard λ the scheduler uses now. Observed: emergency reclaims at that hour "
             "of day in the range ÷ the node-hours nodes were lent at that hour.",
    )


def migrations_over_time(window: Window | None = None) -> Table:
    """Per period of the range: migrations started, work lost, success and median/p99 downtime (design §6)."""
    window = window or default_window()
    labels, edges = window.buckets()
    migrations = list(
        Migration.objects.filter(started_at__gte=window.since, started_at__lt=window.until)
        .select_related("job")
        .only("started_at", "success", "work_lost_s", "downtime_s", "mode", "job__gpu_count")
    )
    table = Table(
        "migrations",
        "Migrations: work lost, success and downtime",
        [
            "period_start", "migrations", "planned", "degraded", "succeeded", "success_pct",
            "work_lost_gpu_h", "downtime_median_s", "downtime_p99_s",
        ],
        note="Migrations by the period they started in. " + DEFINITIONS["migration_success"].replace(
            "in the range", "in the period") + " " + DEFINITIONS["work_lost_gpu_hours"],
    )
    edges_s = np.array([e.timestamp() for e in edges])
    by_period: dict[int, list[Migration]] = defaultdict(list)
    for m in migrations:
        by_period[int(np.searchsorted(edges_s, m.started_at.timestamp(), side="right")) - 1].append(m)
    step = window.step
    for i, start in enumerate(labels):
        inside = by_period.get(i, [])
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


def _degradation_pct(e: dict[str, Any]) -> float:
    """Research-traffic degradation of one decision on one bottleneck (design §4): the share of the recorded
    research demand the link cannot carry beside the admitted migrations, else the share of the reserve the
    migrations ate into (0 whenever P3 respected Theorem 4)."""
    capacity, budget, rate = e["capacity"], e["budget"], e["rate"]
    left = max(0.0, capacity - rate)
    if e["demand"]:
        return 100.0 * max(0.0, float(e["demand"]) - left) / float(e["demand"])
    reserve = max(0.0, capacity - budget)
    return 100.0 * max(0.0, rate - budget) / reserve if reserve else 0.0


def traffic(window: Window | None = None) -> Table:
    """History: the P3 decisions made in the range, per bottleneck (design §4) — flows admitted and degraded
    summed over them, the capacity and budget of the newest, and the busiest decision's rate and what it left
    research traffic. What is on the wire now is :func:`traffic_now`."""
    window = window or default_window()
    link_names = dict(Link.objects.values_list("pk", "name"))
    per_link: dict[str, list[dict[str, Any]]] = {}
    for decision in DecisionLog.objects.filter(kind=DecisionLog.Kind.P3, created_at__gte=window.since,
                                               created_at__lt=window.until).order_by("-created_at", "-id")[:1000]:
        for entry in _p3_entries(decision, link_names):
            per_link.setdefault(entry["name"], []).append(entry)
    table = Table(
        "traffic",
        "P3 admissions and research traffic per bottleneck",
        [
            "bottleneck", "decisions", "capacity_mbit_s", "migration_budget_mbit_s", "admitted", "degraded",
            "migration_rate_mbit_s", "migration_share_pct", "research_left_mbit_s", "research_degradation_pct",
            "decided_at",
        ],
        note="History: P3's admission decisions made in the range, per bottleneck link. Admitted and degraded "
             "count flows over all of them; capacity and budget are the newest decision's; rate, share of the "
             "link and research-traffic degradation are the busiest decision's; decided_at is the newest.",
    )
    for name, entries in sorted(per_link.items()):
        newest = entries[0]
        busiest = max(entries, key=lambda e: e["rate"])
        capacity, rate = busiest["capacity"], busiest["rate"]
        table.rows.append([
            name,
            len(entries),
            round(newest["capacity"] * 8 / 1e6, 1),
            round(newest["budget"] * 8 / 1e6, 1),
            sum(e["admitted"] for e in entries),
            sum(e["degraded"] for e in entries),
            round(rate * 8 / 1e6, 1),
            round(100.0 * rate / capacity, 1) if capacity else None,
            round(max(0.0, capacity - rate) * 8 / 1e6, 1),
            round(max(_degradation_pct(e) for e in entries), 1),
            timezone.localtime(newest["at"]).strftime("%Y-%m-%d %H:%M:%S"),
        ])
    return table


def traffic_now() -> Table:
    """What is in flight now, per link: the read model's migration copies on the wire
    (:func:`portal.core.campus.migration_traffic_now`); empty when none is active."""
    table = Table(
        "traffic_now",
        "Migration traffic in flight now",
        ["link", "copies", "rate_mbit_s", "budget_mbit_s", "budget_used_pct", "capacity_mbit_s"],
        note="Checkpoint copies of migrations and recoveries on the wire now (issued, not yet received, failed "
             "or expired), on every link of their path: their P3 rates summed, against the link's migration "
             "budget (its lower-bound bandwidth minus the research reserve).",
    )
    for e in campus.migration_traffic_now():
        budget = e["budget_bytes_per_s"]
        table.rows.append([
            e["link"], e["flows"], round(e["rate_bytes_per_s"] * 8 / 1e6, 1), round(budget * 8 / 1e6, 1),
            round(100.0 * e["rate_bytes_per_s"] / budget, 1) if budget else None,
            round(e["capacity_bytes_per_s"] * 8 / 1e6, 1),
        ])
    return table


def building_bandwidth(window: Window | None = None) -> Table:
    """Per building: its uplink's capacity, estimated mean and lower-bound available bandwidth, and the samples
    recorded in the range (three statements whatever the number of buildings)."""
    window = window or default_window()
    table = Table(
        "building_bandwidth",
        "Bandwidth per building (uplink)",
        ["building", "link", "capacity_mbit_s", "mean_mbit_s", "lower_mbit_s", "samples"],
        note="Mean and lower bound: the bandwidth estimator's current estimate for the building's uplink (the "
             "lower bound is the B⁻ P2 and P3 plan with); before any, the mean of the range's samples.",
    )
    uplinks = list(Link.objects.filter(kind=Link.Kind.UPLINK, lower_switch__isnull=False).select_related(
        "lower_switch__building", "estimate"
    ).order_by("lower_switch__building__name", "name"))
    samples = {
        row["link_id"]: (row["n"], row["total"])
        for row in BandwidthSample.objects.filter(link__in=[link.pk for link in uplinks],
                                                  sampled_at__gte=window.since, sampled_at__lt=window.until)
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


def adaptivity(window: Window | None = None) -> Table:
    """Theorem 2's adaptivity gap over the 24 hourly epochs: campus hazard λ_h and the mean bandwidth sampled at
    hour h in the range (one grouped statement)."""
    window = window or default_window()
    hazard = campus.campus_hazard_by_hour()
    per_hour = {int(h): float(v) for h, v in BandwidthSample.objects.filter(
        sampled_at__gte=window.since, sampled_at__lt=window.until, bytes_per_s__gt=0,
    ).annotate(h=ExtractHour("sampled_at")).values("h").annotate(mean=Avg("bytes_per_s")).values_list("h", "mean")}
    table = Table(
        "adaptivity",
        "Adaptivity gap (Theorem 2) by hourly epoch",
        ["hour", "hazard_per_h", "bandwidth_mbit_s", "w_x1e6"],
        note="W = sqrt(λ / B_eff) per hourly epoch, times 10^6; gap = sqrt(E[λ] E[1/B_eff]) / E[W] - 1. λ: the "
             "campus hazard now; B_eff: the mean bandwidth sampled at that hour in the range.",
    )
    hours = [h for h in range(24) if hazard.get(h, 0) > 0 and per_hour.get(h)]
    for h in hours:
        lam, bw = hazard[h], per_hour[h]
        table.rows.append([h, round(lam * 3600, 4), round(bw * 8 / 1e6, 1), round(1e6 * math.sqrt(lam / bw), 4)])
    if len(hours) >= 2:
        lam_arr = np.array([hazard[h] for h in hours])
        bw_arr = np.array([per_hour[h] for h in hours])
        table.headline = round(100 * adaptivity_gap(lam_arr, bw_arr), 2)
    return table


def groups(window: Window | None = None) -> Table:
    """Usage and losses per research group in the range (charged to the group, never to the wrong person).

    Used GPU-hours: placements' time inside the range × the GPUs each held (the read model's ``gpus_held``);
    lost: migrations started in the range. ``charged`` columns are the group's own all-time counters, as
    accounting keeps them.
    """
    window = window or default_window()
    table = Table(
        "groups",
        "Usage and losses per research group",
        ["group", "jobs", "running", "gpu_hours_used", "work_lost_gpu_h", "migrations", "charged_gpu_h",
         "charged_lost_gpu_h"],
        note="Used: GPU-hours the group's placements held in the range. Lost: by migrations started in the "
             f"range. {DEFINITIONS['work_lost_gpu_hours']} Jobs and running: now. Charged: the group's all-time "
             "accounting counters.",
    )
    live = (JobState.RUNNING, JobState.MIGRATING)
    since, until = window.since, window.until
    used_s: dict[int, float] = defaultdict(float)
    for started, ended, indices, group_id, count in Placement.objects.filter(
            Q(ended_at__isnull=True) | Q(ended_at__gt=since), started_at__lt=until).values_list(
            "started_at", "ended_at", "gpu_indices", "job__group_id", "job__gpu_count"):
        overlap = (min(ended or until, until) - max(started, since)).total_seconds()
        if overlap > 0:
            used_s[group_id] += overlap * campus.gpus_held(indices, count)
    lost_s: dict[int, float] = defaultdict(float)
    migrations: dict[int, int] = defaultdict(int)
    for group_id, lost, count in Migration.objects.filter(started_at__gte=since, started_at__lt=until).values_list(
            "job__group_id", "work_lost_s", "job__gpu_count"):
        lost_s[group_id] += lost * count
        migrations[group_id] += 1
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


TABLES: dict[str, Callable[[Window | None], Table]] = {
    "utilisation": utilisation,
    "reclaims_by_hour": reclaims_by_hour,
    "hazard_profile": hazard_profile,
    "migrations": migrations_over_time,
    "traffic": traffic,
    "building_bandwidth": building_bandwidth,
    "adaptivity": adaptivity,
    "groups": groups,
}


# --- the summary ----------------------------------------------------------------------------------------------------

# The /metrics series each "now" number is, beside its definition on hover.
METRIC_OF = {"nodes_online": 'reclaimnet_nodes{state="online"}', "gpus_lent": "reclaimnet_gpus_lendable",
             "gpus_busy": "reclaimnet_gpus_busy", "jobs_running": 'reclaimnet_jobs{state="running"}'}


@dataclass(frozen=True)
class Stat:
    """One headline number: its value as shown, its label, and the definition a hover shows."""

    key: str
    value: str
    label: str
    definition: str
    metric: str = ""


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:g}%"


def summary(window: Window | None = None) -> dict[str, Any]:
    """The headline numbers above the charts: "now" from ``utilization_summary()`` (what ``/metrics`` and
    ``/api/summary/`` report, read here with the rest of the dashboard's snapshot so that it is no older than
    it), the range's from ``window_summary()`` and the read model's GPU time."""
    window = window or default_window()
    now = utilization_summary()
    ranged = window_summary(window.since, window.until)
    _, gpu = _hourly(window)
    lent_s, busy_s = float(gpu.lent_gpu_s.sum()), float(gpu.busy_gpu_s.sum())
    nodes_total = sum(n for state, n in now["nodes_by_state"].items() if state != "retired")
    success = ranged["migration_success_rate"]
    numbers = {
        "nodes_online": now["nodes_by_state"].get("online", 0),
        "nodes_total": nodes_total,
        "gpus_lent": now["gpus_lendable_online"],
        "gpus_total": now["gpus_total"],
        "gpus_busy": now["gpus_busy"],
        "gpu_utilization_pct": round(100.0 * now["gpu_utilization"], 1),
        "jobs_running": now["jobs_by_state"].get("running", 0),
        "utilisation_range_pct": round(100.0 * busy_s / lent_s, 1) if lent_s > 0 else None,
        "gpu_hours_lent": round(lent_s / 3600, 1),
        "reclaims": ranged["reclaims"],
        "migrations": ranged["migrations"],
        "migration_success_pct": round(100.0 * success, 1) if success is not None else None,
        "work_lost_gpu_h": round(ranged["work_lost_gpu_hours"], 2),
    }
    d = DEFINITIONS
    numbers["now"] = [
        Stat("nodes_online", f"{numbers['nodes_online']} / {nodes_total}", "nodes online", d["nodes_online"],
             METRIC_OF["nodes_online"]),
        Stat("gpus_lent", f"{numbers['gpus_lent']} / {numbers['gpus_total']}", "GPUs lent",
             f"{d['gpus_lent']} After the slash: {d['gpus_total']}", METRIC_OF["gpus_lent"]),
        Stat("gpus_busy", f"{numbers['gpus_busy']} ({_pct(numbers['gpu_utilization_pct'])})", "GPUs busy",
             f"{d['gpus_busy']} In brackets, utilisation now: {d['gpu_utilization']}", METRIC_OF["gpus_busy"]),
        Stat("jobs_running", str(numbers["jobs_running"]), "jobs running", d["jobs_running"],
             METRIC_OF["jobs_running"]),
    ]
    numbers["range"] = [
        Stat("utilisation_range", _pct(numbers["utilisation_range_pct"]), "GPU utilisation",
             d["utilisation_range"]),
        Stat("reclaims", str(numbers["reclaims"]), "reclaims", d["reclaims"]),
        Stat("migration_success", _pct(numbers["migration_success_pct"]),
             f"migration success ({numbers['migrations']} started)", d["migration_success"]),
        Stat("work_lost", f"{numbers['work_lost_gpu_h']:g} GPU-h", "work lost",
             d["work_lost_gpu_hours"] + " Counted for the migrations started in the range."),
    ]
    return numbers


# --- charts -----------------------------------------------------------------------------------------------------


def _column(table: Table, name: str) -> list[Any]:
    i = table.columns.index(name)
    return [row[i] for row in table.rows]


def _series(table: Table, x: str, ys: Iterable[tuple[str, str]], kind: str = "line", *,
            axes: dict[str, str]) -> dict[str, Any]:
    """A Chart.js spec: ``axes`` titles each scale with its quantity and unit (x, y and, for a second
    quantity, y1 — or x1 for a horizontal chart)."""
    return {
        "type": kind,
        "labels": _column(table, x),
        "datasets": [{"label": label, "data": _column(table, y)} for y, label in ys],
        "axes": axes,
    }


def _charts(t: dict[str, Table], window: Window) -> dict[str, dict[str, Any]]:
    period = {HOUR: "hour", timedelta(hours=6): "6-hour period"}.get(window.step, "day")
    tz = timezone.get_current_timezone_name()
    hour_axis = f"Hour of day ({tz})"
    charts = {
        "utilisation": _series(t["utilisation"], "period_start", [("utilisation_pct", "GPU utilisation %")],
                               axes={"x": f"{period.capitalize()} starting ({tz})", "y": "GPU utilisation (%)"}),
        "reclaims_by_hour": _series(
            t["reclaims_by_hour"], "hour", [("scheduled", "scheduled"), ("emergency", "emergency")], "bar",
            axes={"x": hour_axis, "y": "Reclaims (count)"},
        ),
        "hazard_profile": _series(
            t["hazard_profile"],
            "hour",
            [("estimated_per_node_hour", "estimated λ"), ("observed_per_node_hour", "observed")],
            axes={"x": hour_axis, "y": "Per lent node-hour"},
        ),
        "migrations": _series(
            t["migrations"], "period_start", [("work_lost_gpu_h", "work lost (GPU-h)"), ("success_pct", "success %")],
            axes={"x": f"{period.capitalize()} starting ({tz})", "y": "Work lost (GPU-hours)",
                  "y1": "Migration success (%)"},
        ),
        "downtime": _series(
            t["migrations"], "period_start", [("downtime_median_s", "median"), ("downtime_p99_s", "p99")],
            axes={"x": f"{period.capitalize()} starting ({tz})", "y": "Downtime (s)"},
        ),
        "traffic": _series(t["traffic"], "bottleneck", [("admitted", "admitted"), ("degraded", "degraded")], "bar",
                           axes={"y": "Bottleneck link", "x": "Flows in P3 decisions (count)"}),
        "degradation": _series(
            t["traffic"],
            "bottleneck",
            [("migration_share_pct", "migration share of link"),
             ("research_degradation_pct", "research-traffic degradation")],
            "bar",
            axes={"y": "Bottleneck link", "x": "Share (%)"},
        ),
        "building_bandwidth": _series(
            t["building_bandwidth"],
            "building",
            [("capacity_mbit_s", "capacity"), ("mean_mbit_s", "mean available"), ("lower_mbit_s", "lower bound")],
            "bar",
            axes={"y": "Building", "x": "Bandwidth (Mbit/s)"},
        ),
        "adaptivity": _series(t["adaptivity"], "hour", [("w_x1e6", "W = √(λ/B_eff), scaled by 10⁶")],
                              axes={"x": hour_axis, "y": "W × 10⁶"}),
        # Used and lost differ by orders of magnitude, so each has its own titled axis (used below, lost
        # above), coloured like its bars.
        "groups": _series(
            t["groups"], "group", [("gpu_hours_used", "GPU-h used"), ("work_lost_gpu_h", "GPU-h lost")], "bar",
            axes={"y": "Research group", "x": "GPU-hours used (bottom axis)",
                  "x1": "GPU-hours lost to reclaims (top axis)"},
        ),
    }
    # Named categories (links, buildings, groups) run down the side, where every name stays readable.
    for key in ("traffic", "degradation", "building_bandwidth", "groups"):
        charts[key]["indexAxis"] = "y"
    charts["migrations"]["datasets"][1]["yAxisID"] = "y1"
    charts["groups"]["datasets"][1]["xAxisID"] = "x1"
    return charts


CHART_CARDS = [  # (chart key, table name, title) in page order
    ("utilisation", "utilisation", "GPU utilisation over time"),
    ("reclaims_by_hour", "reclaims_by_hour", "Reclaims by hour of day"),
    ("hazard_profile", "hazard_profile", "Hazard: estimated vs observed"),
    ("migrations", "migrations", "Work lost and migration success"),
    ("downtime", "migrations", "Downtime per migration (median, p99)"),
    ("traffic", "traffic", "P3 admissions per bottleneck (history)"),
    ("degradation", "traffic", "Research traffic per bottleneck (history)"),
    ("building_bandwidth", "building_bandwidth", "Bandwidth per building (Mbit/s)"),
    ("adaptivity", "adaptivity", "Adaptivity (Theorem 2)"),
    ("groups", "groups", "Usage and losses per research group"),
]


# --- build and cache -------------------------------------------------------------------------------------------------

CACHE_KEY = "reclaimnet:dashboard:v3"  # the default range's entry; other ranges append ":<range>"


def cache_key(window: Window) -> str:
    return CACHE_KEY if window.key == DEFAULT_RANGE else f"{CACHE_KEY}:{window.cache_id}"


def build(window: Window | None = None, tables: dict[str, Table] | None = None) -> dict[str, Any]:
    """The Chart.js data of every table of ``window`` (default: the last 7 days), the summary numbers, and the
    page's chart cards (with their tables), summary (with what is in flight now) and campus panels (fair share,
    owner use, reserves) already rendered: the dashboard page, its summary fragment and its chart data all serve
    this.

    Computed at most once per ``RECLAIMNET_DASHBOARD_MAX_AGE_S`` per range for the whole deployment and kept
    whole (:func:`portal.core.snapshots.shared`, docs/design.md §9.1: the numbers are the read model's, only
    their age changes), so all its numbers come from one computation and agree with each other. Passing
    ``tables`` computes at once."""
    window = window or default_window()
    if tables is not None:
        return _build(window, tables)
    return snapshots.shared(cache_key(window), lambda: _build(window, None))


def _build(window: Window, tables: dict[str, Table] | None) -> dict[str, Any]:
    t = tables or {name: fn(window) for name, fn in TABLES.items()}
    charts = _charts(t, window)
    now_table = traffic_now()
    numbers = summary(window)
    context = {"tables": t, "charts": charts, "summary": numbers, "traffic_now": now_table, "window": window,
               "cards": [(key, t[name], title) for key, name, title in CHART_CARDS],
               "chart_scripts": [(f"chart-{key}", spec) for key, spec in charts.items()],
               "adaptivity_gap_pct": t["adaptivity"].headline}
    # Rendered once per computation, not per request: the page only pastes them in (docs/design.md §9.1 cache).
    summary_html = render_to_string("web/dashboard/_summary.html", context)
    cards_html = render_to_string("web/dashboard/_charts.html", context)
    # The fair-share, owner-use and reserve panels are campus-wide too (the same for every admin, no form).
    panels_html = render_to_string("web/dashboard/_panels.html")
    # What is cached (and unpickled on every request): the tables themselves are already in the HTML.
    return {
        "charts": charts,
        "summary": {k: v for k, v in numbers.items() if k not in ("now", "range")},
        "adaptivity_gap_pct": t["adaptivity"].headline,
        "summary_html": summary_html,
        "cards_html": cards_html,
        "panels_html": panels_html,
    }


def html(fragment: str) -> SafeString:
    """A fragment ``_build`` rendered from our own templates (autoescaped there)."""
    return mark_safe(fragment)
