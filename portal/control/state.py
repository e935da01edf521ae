"""Adapter between the campus read model and the scheduler core (design §2-§5, docs/scheduler-api.md).

The scheduler never imports Django. ``portal.core.campus`` turns rows into a :class:`~portal.core.campus.Campus`
snapshot; this module locks it for a decision, builds the scheduler's requests from it and the JSON views of
requests and answers that go into the decision log.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from portal.core import campus as campus_model
from portal.core.campus import Campus
from portal.core.models import Checkpoint, Job
from scheduler.p2 import P2Decision, P2Request, response_view

ALLOCATION_LOCK_KEY = 0x52434C41  # "RCLA": one transaction at a time hands out GPUs and link bandwidth


def lock_allocation() -> None:
    """Serialise the transactions that hand out GPUs and link bandwidth (placements, migration destinations)
    across every worker process and host: each reads free capacity and then claims it, and two of them
    interleaved would hand the same GPU out twice. PostgreSQL: a transaction-scoped advisory lock (re-entrant,
    released at commit or rollback); SQLite's IMMEDIATE write transactions are serialised already."""
    if connection.vendor == "postgresql" and connection.in_atomic_block:
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [ALLOCATION_LOCK_KEY])


def load_campus() -> Campus:
    """The campus read model's snapshot for a decision that will allocate: inside a transaction this takes the
    allocation lock first, so the snapshot stays true until commit."""
    lock_allocation()
    return campus_model.load()


def remaining_s(job: Job) -> float:
    """The work a job has left (design §3: P2's survival horizon): its expected runtime less the work it has done,
    measured from its progress as heartbeats report it (``portal.control.progress``); at least 1 s."""
    return max(1.0, job.expected_runtime_s - job.work_done_s)


def build_p2(
    campus: Campus, job: Job, source_pk: int, holder_pk: int, ckpt_bytes: float, notice_s: float | None,
    checkpoint: Checkpoint | None, alpha: float, k_min: int,
) -> tuple[P2Request, dict[str, Any]]:
    """The P2 request for one job (design §3) and its JSON view (design §5 p2 shape, node ids = pks)."""
    req = P2Request(
        tree=campus.tree, link_bytes_per_s=campus.link_available_bytes_per_s, building=campus.building,
        free_gpus=campus.free_gpus, vram_gb=campus.vram_gb, capability=campus.capability,
        hazard_per_s_by_hour=campus.hazard_per_s_by_hour, compatible=campus.compatible(checkpoint),
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
    """design §5 p2 response with node pks (the contract's own builder, ``scheduler.p2.response_view``)."""
    return response_view(decision, campus.node_pks)
