"""The portal's own history as a campus trace (design §7; mapping in design "The what-if report").

Times are seconds since ``since``; the horizon is ``until − since``. What each table holds:

- ``nodes``: nodes registered before ``until`` that have an access link and lend at least one GPU (their GPUs
  less the provider's floor); ``vram_gb`` and ``capability`` are the node's smallest GPU's;
- ``links``: the campus tree (``a`` the switch nearer the core, ``b`` the lower switch or the node); the access
  links of nodes left out are left out with them;
- ``jobs``: jobs submitted in the window: ``work_s`` = the expected runtime, ``ckpt_bytes`` = the checkpoint
  estimate, ``group`` = the research group's slug; a job with no loss budget gets ``NO_BUDGET_S``;
- ``reclaims``: reclaims requested in the window (every kind: scheduled, emergency, kill-switch, lost heartbeat,
  end of a lending window), ``return_s`` = when the node was next lent again (absent if not in the window);
- ``bandwidth``: each link's capacity (the portal does not measure capacity over time: one row per link at 0);
- ``research``: per link, the research bytes the agents counted by traffic class (``LinkClassSample``: research
  bytes / interval) where the window has any for that link; otherwise the egress the agents measured on it
  (``BandwidthSample``, whatever its resolution), which also holds the migration and checkpoint traffic the portal
  itself caused (an upper bound on research demand). Averaged over ``sample_s`` buckets (0 = every sample).
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections import defaultdict
from typing import Any

from django.apps import apps

from portal.core.models import BandwidthSample, Job, Link, Node, NodeAvailability, ReclaimEvent
from scheduler.sim.trace import Trace, TraceError, from_rows
from scheduler.topology import CampusTree

NO_BUDGET_S = 1e9  # a job with no loss budget (scheduler.sim: the evaluation's "no budget")
DEFAULT_SAMPLE_S = 600.0  # the simulator's control period


def _s(when: dt.datetime, since: dt.datetime) -> float:
    return round((when - since).total_seconds(), 3)


def history_rows(since: dt.datetime, until: dt.datetime, sample_s: float = DEFAULT_SAMPLE_S) -> dict[str, Any]:
    """The design §7 rows (JSON shape) of the portal's history in [since, until). Raises TraceError naming the
    table when the window or the campus cannot make a trace."""
    if not until > since:
        raise TraceError("until", "must be after since")
    if sample_s < 0:
        raise TraceError("sample_s", "must be >= 0")
    nodes: list[dict[str, Any]] = []
    node_names: set[str] = set()
    node_pk: dict[int, str] = {}
    for node in Node.objects.filter(created_at__lt=until, access_link__isnull=False).select_related(
            "building").prefetch_related("gpus").order_by("name"):
        gpus = list(node.gpus.all())
        lendable = Node.lendable_of(len(gpus), node.gpu_floor)
        if lendable < 1:
            continue
        nodes.append({"id": node.name, "building": node.building.name, "gpus": lendable,
                      "vram_gb": min(g.vram_gb for g in gpus),
                      "capability": float(min(g.compute_capability for g in gpus))})
        node_names.add(node.name)
        node_pk[node.pk] = node.name
    links: list[dict[str, Any]] = []
    link_names: dict[int, str] = {}
    for link in Link.objects.select_related("upper", "lower_switch", "node").order_by("name"):
        if link.lower_switch_id is not None:
            lower = link.lower_switch.name
            if lower in node_names:
                raise TraceError("links.b", f"switch {lower!r} has the name of a node")
        else:
            node = getattr(link, "node", None)
            if node is None or node.pk not in node_pk:
                continue
            lower = node.name
        if link.upper.name in node_names:
            raise TraceError("links.a", f"switch {link.upper.name!r} has the name of a node")
        links.append({"id": link.name, "a": link.upper.name, "b": lower, "bytes_per_s": link.capacity_bytes_per_s})
        link_names[link.pk] = link.name
    jobs = [{"id": f"job-{j.pk}", "submit_s": _s(j.submitted_at, since), "gpus": j.gpu_count,
             "vram_gb": j.vram_gb_per_gpu, "min_capability": float(j.min_capability),
             "work_s": j.expected_runtime_s, "ckpt_bytes": j.ckpt_bytes_estimate, "restart_s": j.restart_s,
             "loss_budget_s": j.loss_budget_s if j.loss_budget_s is not None else NO_BUDGET_S,
             "group": j.group.slug}
            for j in Job.objects.filter(submitted_at__gte=since, submitted_at__lt=until).select_related("group")
            .order_by("submitted_at", "pk")]
    lent_again: dict[int, list[dt.datetime]] = defaultdict(list)
    for node_id, at in NodeAvailability.objects.filter(node_id__in=list(node_pk), lent=True, at__gte=since,
                                                       at__lt=until).order_by("at").values_list("node_id", "at"):
        lent_again[node_id].append(at)
    reclaims = []
    for r in ReclaimEvent.objects.filter(requested_at__gte=since, requested_at__lt=until,
                                         node_id__in=list(node_pk)).order_by("requested_at", "pk"):
        row: dict[str, Any] = {"node": node_pk[r.node_id], "t_s": _s(r.requested_at, since),
                               "notice_s": float(r.notice_s)}
        times = lent_again.get(r.node_id, [])
        k = bisect.bisect_left(times, max(r.deadline_at, r.requested_at + dt.timedelta(seconds=r.notice_s)))
        if k < len(times):
            row["return_s"] = _s(times[k], since)
        reclaims.append(row)
    bandwidth = [{"link": link["id"], "t_s": 0, "bytes_per_s": link["bytes_per_s"]} for link in links]
    by_class, covered = _class_research(since, until, link_names, sample_s)
    research = [*by_class, *_research(BandwidthSample.objects.filter(
        sampled_at__gte=since, sampled_at__lt=until, link_id__in=[pk for pk in link_names if pk not in covered]),
        link_names, since, sample_s)]
    research.sort(key=lambda row: (row["t_s"], row["link"]))
    return {"nodes": nodes, "links": links, "jobs": jobs, "reclaims": reclaims, "bandwidth": bandwidth,
            "research": research, "horizon_s": (until - since).total_seconds()}


def _research(samples: Any, link_names: dict[int, str], since: dt.datetime, sample_s: float) -> list[dict[str, Any]]:
    rows = samples.order_by("sampled_at", "pk").values_list("link_id", "sampled_at", "bytes_per_s")
    if sample_s == 0:
        return [{"link": link_names[link], "t_s": _s(at, since), "bytes_per_s": value}
                for link, at, value in rows.iterator(chunk_size=5000)]
    sums: dict[tuple[int, int], list[float]] = {}
    for link, at, value in rows.iterator(chunk_size=5000):
        acc = sums.setdefault((int((at - since).total_seconds() // sample_s), link), [0.0, 0])
        acc[0] += value
        acc[1] += 1
    return [{"link": link_names[link], "t_s": bucket * sample_s, "bytes_per_s": round(total / n, 3)}
            for (bucket, link), (total, n) in sorted(sums.items(), key=lambda kv: (kv[0][0], link_names[kv[0][1]]))]


def _class_research(since: dt.datetime, until: dt.datetime, link_names: dict[int, str],
                    sample_s: float) -> tuple[list[dict[str, Any]], set[int]]:
    """Research rows from the per-class byte counters (design §4 classes), and the links they cover."""
    covered: set[int] = set()
    try:
        model = apps.get_model("core", "LinkClassSample")
    except LookupError:
        return [], covered
    sums: dict[tuple[float, int], list[float]] = {}
    for link, at, interval_s, research in model.objects.filter(
            sampled_at__gte=since, sampled_at__lt=until, link_id__in=list(link_names)).order_by(
            "sampled_at", "pk").values_list("link_id", "sampled_at", "interval_s", "research_bytes").iterator(
            chunk_size=5000):
        t_s = (at - since).total_seconds()
        key = (t_s // sample_s * sample_s if sample_s else round(t_s, 3), link)
        acc = sums.setdefault(key, [0.0, 0.0])
        acc[0] += float(research)
        acc[1] += float(interval_s)
        covered.add(link)
    return [{"link": link_names[link], "t_s": t_s, "bytes_per_s": round(total / interval, 3)}
            for (t_s, link), (total, interval) in sums.items() if interval > 0], covered


def check_tree(trace: Trace) -> None:
    """The simulator needs the links to form one tree over the nodes (``scheduler.topology``); TraceError
    naming ``links`` otherwise."""
    links = trace.tables["links"]
    try:
        CampusTree.from_links([str(x) for x in links["id"]], [str(x) for x in links["a"]],
                              [str(x) for x in links["b"]], [str(x) for x in trace.tables["nodes"]["id"]])
    except ValueError as e:
        raise TraceError("links", str(e)) from None


def history_trace(since: dt.datetime, until: dt.datetime, sample_s: float = DEFAULT_SAMPLE_S) -> Trace:
    """`history_rows` loaded and validated by the simulator's own loader (and the tree checked)."""
    trace = from_rows(history_rows(since, until, sample_s))
    check_tree(trace)
    return trace
