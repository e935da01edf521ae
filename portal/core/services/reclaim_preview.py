"""What a reclaim with a given notice would cost each hosted job (design §1: show C/B + T_r before reclaim).

Contract (used by the provider reclaim dialog and ``/api/nodes/{id}/reclaim-preview/``):

``preview_reclaim(node, notice_s) -> dict`` with
``{"notice_s", "shortest_loss_free_notice_s", "jobs": [{"job_id", "name", "ckpt_bytes", "bandwidth_bytes_per_s",
"restart_s", "leave_s", "loss_free", "work_lost_s"}]}``.

For each job running on the node, with B⁻ the lower-confidence bandwidth of the node's access link (its capacity
before any estimate) and B_mig = max(0, B⁻ − max(β·B⁻, B_min)) what P3 may give migrations there (design §4):
``leave_s = ckpt_bytes / B_mig + restart_s`` (design §2 "final checkpoint iff C/b + T_r ≤ τ", for the job alone);
``loss_free`` = P3 admits the job's final-checkpoint flow with that notice, jointly with every other hosted job
(so two jobs that each fit alone may not fit together); ``work_lost_s`` = seconds since the job's last completed
checkpoint when not loss-free (0 when loss-free); ``shortest_loss_free_notice_s`` = the smallest notice with which
P3 admits all of them (0 when nothing runs there).

``campus_topology()`` returns the campus in the design §5 p2 shape (``links`` and ``nodes``; ids are names).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from django.conf import settings
from django.db.models import Prefetch
from django.utils import timezone

from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Checkpoint, HazardEstimate, HazardScope, Job, Link, Node, Placement
from portal.core.services.nodes import ACCESS_LINK_DEFAULT_BYTES_PER_S  # also when a node has no access link
from scheduler.p3 import P3Flows, admit_flows, migration_budget_bytes_per_s

DEFAULT_HAZARD_PER_S = 1 / 3600.0  # prior before any estimate exists (design §6: ≈ 0.99 per GPU-hour)


def _reserve_fraction() -> float:
    return float(settings.RECLAIMNET.get("RESERVE_FRACTION", 0.3))


def _reserve_min_bytes_per_s() -> float:
    return float(settings.RECLAIMNET.get("RESERVE_MIN_BYTES_PER_S", 0.0))


def access_bandwidth_lower_bytes_per_s(node: Node) -> float:
    """B⁻ on ``node``'s access link: its estimate's lower bound (at most the capacity), else the capacity."""
    link = node.access_link
    if link is None:
        return float(ACCESS_LINK_DEFAULT_BYTES_PER_S)
    estimate = getattr(link, "estimate", None)
    if estimate is not None and estimate.lower_bytes_per_s > 0:
        return float(min(estimate.lower_bytes_per_s, link.capacity_bytes_per_s))
    return float(link.capacity_bytes_per_s)


def _admitted(ckpt_bytes: np.ndarray, restart_s: np.ndarray, notice_s: float, available: float) -> np.ndarray:
    """Which hosted jobs P3 admits together with ``notice_s`` on the access link (design §4)."""
    n = len(ckpt_bytes)
    flows = P3Flows(ids=tuple(str(i) for i in range(n)), bytes=ckpt_bytes, notice_s=np.full(n, float(notice_s)),
                    restart_s=restart_s, cap_bytes_per_s=np.full(n, np.inf))
    return admit_flows(flows, available, reserve_fraction=_reserve_fraction(),
                       reserve_min_bytes_per_s=_reserve_min_bytes_per_s()).admitted


def _shortest_notice_s(ckpt_bytes: np.ndarray, restart_s: np.ndarray, available: float, budget: float) -> float:
    """The smallest notice with which P3 admits every hosted job at once (bisection; admission is monotone)."""
    if len(ckpt_bytes) == 0 or budget <= 0:
        return 0.0 if len(ckpt_bytes) == 0 else float("inf")
    low = float(np.max(ckpt_bytes / budget + restart_s))  # each job alone needs this much
    high = float(np.max(restart_s) + ckpt_bytes.sum() / budget)  # all of them at the latest restart: enough
    if _admitted(ckpt_bytes, restart_s, low, available).all():
        return low
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if _admitted(ckpt_bytes, restart_s, mid, available).all() else (mid, high)
        if high - low <= 1e-3:
            break
    return high


def jobs_on_node(node: Node) -> list[Job]:
    """Jobs with an open placement on ``node`` that are running or migrating off it."""
    return list(
        Job.objects.filter(
            placements__node=node,
            placements__ended_at__isnull=True,
            state__in=[JobState.RUNNING, JobState.MIGRATING],
        ).order_by("pk")
    )


def preview_reclaim(node: Node, notice_s: float) -> dict[str, Any]:
    """Per hosted job: can it leave with no loss under ``notice_s``, and what would it lose otherwise."""
    node = Node.objects.select_related("access_link", "access_link__estimate").get(pk=node.pk)
    available = access_bandwidth_lower_bytes_per_s(node)
    budget = float(migration_budget_bytes_per_s(available, _reserve_fraction(), _reserve_min_bytes_per_s()))
    jobs = jobs_on_node(node)
    lasts = [
        Checkpoint.objects.filter(job=job, completed_at__isnull=False).order_by("-completed_at", "-pk").first()
        for job in jobs
    ]
    # The final checkpoint is about as large as the last one; before any, trust the submitted estimate.
    ckpt_bytes = np.array([float(last.size_bytes if last else job.ckpt_bytes_estimate) for job, last in zip(jobs, lasts, strict=True)])
    restart_s = np.array([float(job.restart_s) for job in jobs])
    admitted = _admitted(ckpt_bytes, restart_s, notice_s, available) if jobs else np.zeros(0, dtype=bool)
    now = timezone.now()
    rows = []
    for i, (job, last) in enumerate(zip(jobs, lasts, strict=True)):
        loss_free = bool(admitted[i])
        work_lost_s = 0.0
        if not loss_free:
            since = last.completed_at if last is not None else _running_since(job, node)
            work_lost_s = max(0.0, (now - since).total_seconds()) if since is not None else 0.0
        rows.append(
            {
                "job_id": job.pk,
                "name": job.name,
                "ckpt_bytes": int(ckpt_bytes[i]),
                "bandwidth_bytes_per_s": budget,
                "restart_s": float(restart_s[i]),
                "leave_s": float(ckpt_bytes[i] / budget + restart_s[i]) if budget > 0 else float("inf"),
                "loss_free": loss_free,
                "work_lost_s": work_lost_s,
            }
        )
    return {
        "notice_s": float(notice_s),
        "shortest_loss_free_notice_s": _shortest_notice_s(ckpt_bytes, restart_s, available, budget),
        "jobs": rows,
    }


def _running_since(job: Job, node: Node) -> Any:
    placement = job.placements.filter(node=node, ended_at__isnull=True).order_by("-started_at").first()
    return placement.started_at if placement is not None else job.started_at


def _hazard_profiles() -> tuple[dict[int, list[float]], dict[int, list[float]], list[float]]:
    """Hourly λ⁺ profiles by node, by provider and for the campus (missing hours: the campus, then the prior)."""
    by_node: dict[int, list[float]] = {}
    by_provider: dict[int, list[float]] = {}
    campus = [DEFAULT_HAZARD_PER_S] * 24
    for row in HazardEstimate.objects.all().only("scope", "node_id", "provider_id", "hour_of_day",
                                                 "hazard_upper_per_s"):
        if not 0 <= row.hour_of_day < 24:
            continue
        if row.scope == HazardScope.CAMPUS:
            campus[row.hour_of_day] = row.hazard_upper_per_s
        elif row.scope == HazardScope.NODE and row.node_id is not None:
            by_node.setdefault(row.node_id, [None] * 24)[row.hour_of_day] = row.hazard_upper_per_s  # type: ignore[call-overload]
        elif row.scope == HazardScope.PROVIDER and row.provider_id is not None:
            by_provider.setdefault(row.provider_id, [None] * 24)[row.hour_of_day] = row.hazard_upper_per_s  # type: ignore[call-overload]
    return by_node, by_provider, campus


def _merge(*profiles: list[float] | None) -> list[float]:
    merged = []
    for hour in range(24):
        value = next((p[hour] for p in profiles if p is not None and p[hour] is not None), DEFAULT_HAZARD_PER_S)
        merged.append(float(value))
    return merged


def campus_topology(*, available: bool = True) -> dict[str, list[dict[str, Any]]]:
    """The campus tree and its nodes in the design §5 p2 request shape.

    ``links``: ``{"id", "a", "b", "bytes_per_s"}`` with ``a`` the switch nearer the core and ``b`` the lower
    switch or node; ``bytes_per_s`` is the link estimate's lower bound when ``available`` and one exists, else
    the nominal capacity. ``nodes``: every node that is not retired, ``{"id", "building", "free_gpus",
    "vram_gb", "capability", "hazard_per_s_by_hour"}``; ``free_gpus`` counts lendable GPUs (above the floor)
    not held by an open placement, and is 0 unless the node is online.
    """
    links = []
    for link in Link.objects.select_related("upper", "lower_switch", "node", "estimate").order_by("name"):
        lower = link.lower_endpoint_name()
        if lower is None:
            continue  # an access link whose node was deleted: not part of the tree
        estimate = getattr(link, "estimate", None)
        rate = link.capacity_bytes_per_s
        if available and estimate is not None and estimate.lower_bytes_per_s > 0:
            rate = estimate.lower_bytes_per_s
        links.append({"id": link.name, "a": link.upper.name, "b": lower, "bytes_per_s": float(rate)})
    by_node, by_provider, campus = _hazard_profiles()
    open_placements = Prefetch("placements", queryset=Placement.objects.filter(ended_at__isnull=True),
                               to_attr="open_placements")
    nodes = []
    for node in (
        Node.objects.exclude(state=NodeState.RETIRED)
        .select_related("building")
        .prefetch_related("gpus", open_placements)
        .order_by("name")
    ):
        gpus = list(node.gpus.all())
        busy = sum(len(p.gpu_indices or []) for p in node.open_placements)
        free = max(0, len(gpus) - node.gpu_floor - busy) if node.state == NodeState.ONLINE else 0
        nodes.append(
            {
                "id": node.name,
                "building": node.building.name,
                "free_gpus": free,
                "vram_gb": min((g.vram_gb for g in gpus), default=0.0),
                "capability": float(min((g.compute_capability for g in gpus), default=0)),
                "hazard_per_s_by_hour": _merge(by_node.get(node.pk), by_provider.get(node.provider_id), campus),
            }
        )
    return {"links": links, "nodes": nodes}
