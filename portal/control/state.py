"""Adapter: load the campus from the database into the scheduler core's inputs (design §2-§4, docs/scheduler-api.md).

The scheduler never imports Django; this module is the only place that turns rows into its frozen dataclasses
(and the JSON views of them that go into the decision log).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.db import connection
from django.utils import timezone

from portal.control.models import AgentSession, MigrationPhase, MigrationWork
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import (
    Checkpoint,
    HazardEstimate,
    HazardScope,
    Job,
    Link,
    LinkEstimate,
    Node,
    Placement,
)
from scheduler.p2 import P2Decision, P2Request
from scheduler.topology import CampusTree

ALLOCATION_LOCK_KEY = 0x52434C41  # "RCLA": one transaction at a time hands out GPUs and link bandwidth

PRIOR_HAZARD_PER_S = 1 / 3600.0  # one emergency reclaim per lent hour until the estimator has data


def _node_vertex(pk: int) -> str:
    return f"node:{pk}"


@dataclass
class Campus:
    """One snapshot of the campus for a decision; arrays are indexed like ``node_pks`` / ``link_pks``."""

    tree: CampusTree
    node_pks: list[int]
    index_of: dict[int, int]
    link_pks: list[int]
    link_names: list[str]
    link_capacity_bytes_per_s: np.ndarray
    link_available_bytes_per_s: np.ndarray
    building: np.ndarray
    free_gpus: np.ndarray
    free_indices: dict[int, list[int]]
    vram_gb: np.ndarray
    capability: np.ndarray
    hazard_per_s_by_hour: np.ndarray
    now_hour: float

    def path_links(self, src_pk: int, dst_pk: int) -> np.ndarray:
        return self.tree.path_links(self.index_of[src_pk], self.index_of[dst_pk])

    def bottleneck_bytes_per_s(self, src_pk: int, dst_pk: int, capacity: bool = False) -> float:
        links = self.path_links(src_pk, dst_pk)
        values = self.link_capacity_bytes_per_s if capacity else self.link_available_bytes_per_s
        return float(values[links].min()) if len(links) else math.inf


def live_nodes() -> set[int]:
    """Nodes with an open agent session that reported a data address, not declared lost (offline) or retired.

    A partitioned node's websocket can stay open long after its heartbeat stopped; the lost-heartbeat check
    marks it offline, and from then on it holds no usable replica and receives no copy."""
    return set(AgentSession.objects.filter(closed_at__isnull=True, data_port__isnull=False)
               .exclude(node__state__in=[NodeState.OFFLINE, NodeState.RETIRED])
               .values_list("node_id", flat=True))


def used_gpu_indices() -> tuple[dict[int, set[int]], dict[int, int]]:
    """GPU indices held per node by open placements, and GPUs reserved per node by migrations in flight
    whose destination is chosen but whose job has not started there yet."""
    used: dict[int, set[int]] = {}
    for node_id, indices in Placement.objects.filter(ended_at__isnull=True).values_list("node_id", "gpu_indices"):
        used.setdefault(node_id, set()).update(int(i) for i in indices or [])
    reserved: dict[int, int] = {}
    for node_id, count in MigrationWork.objects.filter(
        phase__in=[MigrationPhase.CHECKPOINTING, MigrationPhase.TRANSFERRING, MigrationPhase.STARTING],
        migration__destination__isnull=False,
    ).values_list("migration__destination_id", "migration__job__gpu_count"):
        reserved[node_id] = reserved.get(node_id, 0) + count
    return used, reserved


def hazard_profiles(node_pks: list[int]) -> np.ndarray:
    """(n, 24) upper-bound hazard per node by hour: node estimate, else provider, else campus, else the prior."""
    out = np.full((len(node_pks), 24), PRIOR_HAZARD_PER_S)
    campus = {h: v for h, v in HazardEstimate.objects.filter(scope=HazardScope.CAMPUS)
              .values_list("hour_of_day", "hazard_upper_per_s")}
    for h, v in campus.items():
        out[:, h % 24] = max(v, 1e-9)
    index = {pk: i for i, pk in enumerate(node_pks)}
    provider_of = dict(Node.objects.filter(pk__in=node_pks).values_list("pk", "provider_id"))
    by_provider: dict[int, dict[int, float]] = {}
    for prov, h, v in HazardEstimate.objects.filter(scope=HazardScope.PROVIDER).values_list(
        "provider_id", "hour_of_day", "hazard_upper_per_s"
    ):
        by_provider.setdefault(prov, {})[h] = v
    for pk, prov in provider_of.items():
        for h, v in by_provider.get(prov, {}).items():
            out[index[pk], h % 24] = max(v, 1e-9)
    for pk, h, v in HazardEstimate.objects.filter(scope=HazardScope.NODE, node_id__in=node_pks).values_list(
        "node_id", "hour_of_day", "hazard_upper_per_s"
    ):
        out[index[pk], h % 24] = max(v, 1e-9)
    return out


def lock_allocation() -> None:
    """Serialise the transactions that hand out GPUs and link bandwidth (placements, migration destinations)
    across every worker process and host: each reads free capacity and then claims it, and two of them
    interleaved would hand the same GPU out twice. PostgreSQL: a transaction-scoped advisory lock (re-entrant,
    released at commit or rollback); SQLite's IMMEDIATE write transactions are serialised already."""
    if connection.vendor == "postgresql" and connection.in_atomic_block:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [ALLOCATION_LOCK_KEY])


def load_campus() -> Campus:
    """Snapshot the tree, link bandwidths (lower confidence bound, else capacity) and node availability.

    Inside a transaction this takes the allocation lock first, so the snapshot stays true until commit."""
    lock_allocation()
    now = timezone.localtime(timezone.now())
    links = list(Link.objects.select_related("upper", "lower_switch", "node").order_by("pk"))
    # Only nodes whose access link was in that read: a node registered between the two queries (READ
    # COMMITTED sees it in the second) would otherwise hang off a link the tree does not have.
    nodes = list(Node.objects.filter(access_link_id__in=[link.pk for link in links])
                 .prefetch_related("gpus").order_by("pk"))
    node_pks = [n.pk for n in nodes]
    ends_b = []
    for link in links:
        if link.lower_switch_id is not None:
            ends_b.append(f"switch:{link.lower_switch.name}")
        else:
            node = getattr(link, "node", None)
            ends_b.append(_node_vertex(node.pk) if node is not None else f"dangling:{link.pk}")
    tree = CampusTree.from_links([str(link.pk) for link in links], [f"switch:{link.upper.name}" for link in links],
                                 ends_b, [_node_vertex(pk) for pk in node_pks])
    capacity = np.array([link.capacity_bytes_per_s for link in links], dtype=float)
    lower = dict(LinkEstimate.objects.values_list("link_id", "lower_bytes_per_s"))
    available = np.array([max(1.0, min(lower.get(link.pk, link.capacity_bytes_per_s), link.capacity_bytes_per_s))
                          for link in links])
    live = live_nodes()
    used, reserved = used_gpu_indices()
    free = np.zeros(len(nodes))
    free_indices: dict[int, list[int]] = {}
    vram = np.zeros(len(nodes))
    cap = np.zeros(len(nodes))
    buildings = np.array([n.building_id for n in nodes], dtype=np.int64)
    for i, n in enumerate(nodes):
        gpus = sorted(n.gpus.all(), key=lambda g: g.index)
        vram[i] = min((g.vram_gb for g in gpus), default=0.0)
        cap[i] = float(min((g.compute_capability for g in gpus), default=0))
        held = used.get(n.pk, set())
        lendable = max(0, len(gpus) - n.gpu_floor)
        idle = [g.index for g in gpus if g.index not in held]
        n_free = max(0, min(len(idle), lendable - len(held)) - reserved.get(n.pk, 0))
        if n.state == NodeState.ONLINE and n.pk in live and not n.killswitch_engaged:
            free[i] = n_free
            free_indices[n.pk] = idle
    return Campus(
        tree=tree, node_pks=node_pks, index_of={pk: i for i, pk in enumerate(node_pks)},
        link_pks=[link.pk for link in links], link_names=[link.name for link in links],
        link_capacity_bytes_per_s=capacity, link_available_bytes_per_s=available, building=buildings,
        free_gpus=free, free_indices=free_indices, vram_gb=vram, capability=cap,
        hazard_per_s_by_hour=hazard_profiles(node_pks), now_hour=now.hour + now.minute / 60.0,
    )


def compatible_nodes(campus: Campus, checkpoint: Checkpoint | None) -> np.ndarray | None:
    """A checkpoint taken on capability X is restorable on nodes with capability >= X (design §1 compat record)."""
    if checkpoint is None or checkpoint.compute_capability is None:
        return None
    return campus.capability >= float(checkpoint.compute_capability)


def remaining_s(job: Job) -> float:
    return max(1.0, job.expected_runtime_s - job.work_done_s)


def build_p2(
    campus: Campus, job: Job, source_pk: int, holder_pk: int, ckpt_bytes: float, notice_s: float | None,
    checkpoint: Checkpoint | None, alpha: float, k_min: int,
) -> tuple[P2Request, dict[str, Any]]:
    """The P2 request for one job (design §3) and its JSON view (design §5 p2 shape, node ids = pks)."""
    req = P2Request(
        tree=campus.tree, link_bytes_per_s=campus.link_available_bytes_per_s, building=campus.building,
        free_gpus=campus.free_gpus, vram_gb=campus.vram_gb, capability=campus.capability,
        hazard_per_s_by_hour=campus.hazard_per_s_by_hour, compatible=compatible_nodes(campus, checkpoint),
        source=campus.index_of[source_pk], ckpt_holder=campus.index_of[holder_pk], ckpt_bytes=float(ckpt_bytes),
        restart_s=float(job.restart_s), notice_s=notice_s, remaining_s=remaining_s(job), gpus=job.gpu_count,
        vram_gb_needed=job.vram_gb_per_gpu, min_capability=float(job.min_capability), alpha=alpha, k_min=k_min,
        now_hour=campus.now_hour,
    )
    view = {
        "source": source_pk, "ckpt_holder": holder_pk, "ckpt_bytes": float(ckpt_bytes),
        "restart_s": float(job.restart_s), "notice_s": notice_s, "remaining_s": remaining_s(job),
        "gpus": job.gpu_count, "vram_gb": job.vram_gb_per_gpu, "min_capability": float(job.min_capability),
        "alpha": alpha, "k_min": k_min, "now_hour": campus.now_hour,
        "links": [{"id": pk, "bytes_per_s": float(b)} for pk, b in
                  zip(campus.link_pks, campus.link_available_bytes_per_s, strict=True)],
        "nodes": [{"id": pk, "building": int(campus.building[i]), "free_gpus": int(campus.free_gpus[i]),
                   "vram_gb": float(campus.vram_gb[i]), "capability": float(campus.capability[i])}
                  for i, pk in enumerate(campus.node_pks)],
    }
    return req, view


def p2_view(campus: Campus, decision: P2Decision) -> dict[str, Any]:
    """design §5 p2 response with node pks."""
    pk = campus.node_pks
    return {
        "destination": None if decision.destination is None else pk[int(decision.destination)],
        "candidates": [
            {"id": pk[int(c)], "transfer_s": float(t), "survival": float(s), "score": float(sc), "local": bool(lo)}
            for c, t, s, sc, lo in zip(decision.candidate, decision.transfer_s, decision.survival,
                                       decision.score, decision.local, strict=True)
        ],
        "excluded": [{"id": pk[int(i)], "reason": r} for i, r in decision.excluded],
    }


def freshest_replica(job: Job, exclude_node_pk: int | None, live: set[int]) -> tuple[Checkpoint, int] | None:
    """The newest completed checkpoint of ``job`` held by a live node other than ``exclude_node_pk``
    (its own writer counts when that node is alive and not excluded), with the holder's pk (design §3)."""
    for ckpt in Checkpoint.objects.filter(job=job, completed_at__isnull=False).order_by("-sequence")[:20]:
        holders = set(ckpt.replica_nodes.values_list("pk", flat=True))
        if ckpt.node_id is not None:
            holders.add(ckpt.node_id)
        usable = sorted(h for h in holders if h != exclude_node_pk and h in live)
        if usable:
            return ckpt, usable[0]
    return None

