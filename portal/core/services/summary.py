"""Campus-wide utilization and reclaim summary (design §6 metrics: work lost, migration success, utilization).

One function feeds ``/api/summary/``, the Prometheus ``/metrics`` endpoint (both through one shared snapshot,
:func:`shared_utilization_summary`) and the admin dashboard's "now" numbers, so they never disagree in definition; :data:`DEFINITIONS` is what each number means, the text ``/metrics`` gives as
its HELP and the dashboard shows on hover (docs/design.md §9.1). :func:`window_summary` counts the same
quantities over a time range.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, Q, Sum

from portal.core import campus, snapshots
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Gpu, Job, Migration, MigrationMode, Node, ReclaimEvent, ReclaimKind

# What each number means, in the words a person reads on hover (the dashboard) and a scraper reads as HELP.
DEFINITIONS: dict[str, str] = {
    "nodes_online": "Nodes in the online state (their agent is connected and heartbeating), out of all nodes "
                    "that are not retired.",
    "gpus_total": "GPUs of registered nodes that are not retired.",
    "gpus_lent": "GPUs lent now: on nodes that are online with the kill-switch off, each node's GPUs minus the "
                 "floor its lab keeps.",
    "gpus_busy": "GPUs held now by running placements on lent nodes.",
    "gpu_utilization": "GPUs busy ÷ GPUs lent, now.",
    "jobs_running": "Jobs in the running state now (placed on a node and computing). Jobs being migrated are "
                    "not counted.",
    "utilisation_range": "Busy GPU-hours on lent nodes in the range ÷ GPU-hours lent in the range (each node's "
                         "lendable GPUs × the time it was lent).",
    "reclaims": "Reclaims requested in the range: scheduled, emergency, kill-switch and lost nodes.",
    "migration_success": "Of the migrations started in the range that have finished, the share that resumed the "
                         "job.",
    "work_lost_gpu_hours": "Work lost to reclaims, per GPU: a 4-GPU job that loses 15 minutes lost 1 GPU-hour.",
}


def _counts(queryset: Any, field: str, choices: list[str]) -> dict[str, int]:
    found = dict(queryset.values_list(field).annotate(n=Count("pk")).values_list(field, "n"))
    return {choice: int(found.get(choice, 0)) for choice in choices}


def _lost_gpu_s(migrations: Any) -> float:
    """Work lost charged per GPU: a gang job losing 60 s on 4 GPUs lost 4 GPU-minutes."""
    return float(sum(lost * gpus for lost, gpus in migrations.filter(work_lost_s__gt=0).values_list(
        "work_lost_s", "job__gpu_count")))


SUMMARY_KEY = "reclaimnet:summary:v1"


def shared_utilization_summary() -> dict[str, Any]:
    """:func:`utilization_summary`, computed at most once per ``RECLAIMNET_DASHBOARD_MAX_AGE_S`` for the whole
    deployment (:func:`portal.core.snapshots.shared`): ``/api/summary/`` and ``/metrics`` read this one snapshot,
    so at any moment they agree exactly. The dashboard computes the same function within its own snapshot."""
    return snapshots.shared(SUMMARY_KEY, utilization_summary)


def utilization_summary() -> dict[str, Any]:
    """Counts by state and kind, GPUs lent and busy, migrations and work lost (seconds and GPU-hours).

    ``gpu_utilization`` = GPUs held by open placements on lent nodes / their lendable GPUs (0 when none); both
    counts are the campus read model's. ``gpus_total`` counts GPUs of nodes that are not retired.
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
    finished = migrations["succeeded"] + migrations["failed"]
    return {
        "nodes_by_state": nodes_by_state,
        "jobs_by_state": jobs_by_state,
        "reclaims_by_kind": reclaims_by_kind,
        "gpus_total": Gpu.objects.exclude(node__state=NodeState.RETIRED).count(),
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
        "work_lost_gpu_hours": _lost_gpu_s(Migration.objects.all()) / 3600.0,
    }


def window_summary(since: datetime, until: datetime) -> dict[str, Any]:
    """The range's counts, defined as :func:`utilization_summary`'s: reclaims requested in [since, until),
    migrations started in it (their success rate among the finished ones, work lost per GPU)."""
    reclaims = ReclaimEvent.objects.filter(requested_at__gte=since, requested_at__lt=until).count()
    migrations = Migration.objects.filter(started_at__gte=since, started_at__lt=until)
    counts = migrations.aggregate(total=Count("pk"), succeeded=Count("pk", filter=Q(success=True)),
                                  failed=Count("pk", filter=Q(success=False)))
    finished = counts["succeeded"] + counts["failed"]
    return {
        "reclaims": reclaims,
        "migrations": counts["total"],
        "migration_success_rate": (counts["succeeded"] / finished) if finished else None,
        "work_lost_gpu_hours": _lost_gpu_s(migrations) / 3600.0,
    }
