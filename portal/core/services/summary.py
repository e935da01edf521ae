"""Campus-wide utilization and reclaim summary (design §6 metrics: work lost, migration success, utilization).

One function feeds both ``/api/summary/`` and the Prometheus ``/metrics`` endpoint, so they never disagree.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, Sum

from portal.core import campus
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Gpu, Job, Migration, MigrationMode, Node, ReclaimEvent, ReclaimKind


def _counts(queryset: Any, field: str, choices: list[str]) -> dict[str, int]:
    found = dict(queryset.values_list(field).annotate(n=Count("pk")).values_list(field, "n"))
    return {choice: int(found.get(choice, 0)) for choice in choices}


def utilization_summary() -> dict[str, Any]:
    """Counts by state and kind, GPUs lent and busy, migrations and work lost (seconds and GPU-hours).

    ``gpu_utilization`` = GPUs held by open placements on lent nodes / their lendable GPUs (0 when none); both
    counts are the campus read model's.
    """
    nodes_by_state = _counts(Node.objects.all(), "state", list(NodeState.values))
    jobs_by_state = _counts(Job.objects.all(), "state", list(JobState.values))
    reclaims_by_kind = _counts(ReclaimEvent.objects.all(), "kind", list(ReclaimKind.values))
    lendable = campus.lendable_gpus_total()
    busy = campus.busy_gpus_on_lent_nodes()
    migrations = Migration.objects.aggregate(
        total=Count("pk"),
        planned=Count("pk", filter=Q(mode=MigrationMode.PLANNED)),
        degraded=Count("pk", filter=Q(mode=MigrationMode.DEGRADED)),
        succeeded=Count("pk", filter=Q(success=True)),
        failed=Count("pk", filter=Q(success=False)),
        work_lost_s=Sum("work_lost_s"),
    )
    # Work lost is charged per GPU: a gang job losing 60 s on 4 GPUs lost 4 GPU-minutes.
    lost_gpu_s = sum(
        lost * gpus
        for lost, gpus in Migration.objects.filter(work_lost_s__gt=0).values_list("work_lost_s", "job__gpu_count")
    )
    finished = migrations["succeeded"] + migrations["failed"]
    return {
        "nodes_by_state": nodes_by_state,
        "jobs_by_state": jobs_by_state,
        "reclaims_by_kind": reclaims_by_kind,
        "gpus_total": Gpu.objects.count(),
        "gpus_lendable_online": lendable,
        "gpus_busy": busy,
        "gpu_utilization": (busy / lendable) if lendable else 0.0,
        "migrations": {
            "total": migrations["total"],
            "planned": migrations["planned"],
            "degraded": migrations["degraded"],
            "succeeded": migrations["succeeded"],
            "failed": migrations["failed"],
            "success_rate": (migrations["succeeded"] / finished) if finished else None,
        },
        "work_lost_s": float(migrations["work_lost_s"] or 0.0),
        "work_lost_gpu_hours": lost_gpu_s / 3600.0,
    }
