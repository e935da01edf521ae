"""What the control loop does every control period (design §2 P1, §3 placement, §1 heartbeats and deadlines)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import defaultdict

import numpy as np
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from portal.control import commands
from portal.control import lifecycle as migration_lifecycle
from portal.control.config import rn
from portal.control.estimates import update_estimates
from portal.control.lifecycle import START_TIMEOUT_S
from portal.control.models import (
    JobRuntime,
    MigrationPhase,
    MigrationWork,
    Transfer,
    TransferPurpose,
    TransferState,
)
from portal.control.plan import recovery_rate
from portal.control.reclaims import enforce_deadline, expire_transfers, node_lost, release
from portal.control.state import build_p2, load_campus, lock_allocation, p2_view
from portal.control.workflow import (
    ckpt_bytes_of,
    issue_transfer,
    log_decision,
    resume_from,
    runtime,
    start_on,
    to_waiting,
)
from portal.core.campus import freshest_replica, hazard_upper_by_hour, live_node_pks
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import (
    Checkpoint,
    Job,
    Migration,
    MigrationMode,
    Node,
    Placement,
    PriorityClass,
    ReclaimEvent,
    ReclaimKind,
)
from scheduler.p1 import P1Jobs, plan_checkpoints
from scheduler.p2 import select_destination, survival

log = logging.getLogger(__name__)

TICK_LOCK_KEY = 0x52434C4E  # "RCLN": one control tick at a time across workers
INTERVAL_CHANGE = 0.05  # resend an interval only when it moved by more than 5 %


_started_monotonic = time.monotonic()


def detect_lost_heartbeats() -> list[int]:
    """Nodes silent for longer than HEARTBEAT_TIMEOUT_S: offline, jobs recovered (design §1).

    Nothing is declared lost during the first timeout after this process started: after a control-plane
    restart every node looks silent until its agent has reconnected.
    """
    if time.monotonic() - _started_monotonic < rn("HEARTBEAT_TIMEOUT_S"):
        return []
    cutoff = timezone.now() - dt.timedelta(seconds=rn("HEARTBEAT_TIMEOUT_S"))
    lost = list(Node.objects.filter(state__in=[NodeState.ONLINE, NodeState.DRAINING])
                .filter(Q(last_heartbeat_at__lt=cutoff) | Q(last_heartbeat_at__isnull=True))
                .values_list("pk", flat=True))
    events = []
    for node_id in lost:
        log.warning("node %s: heartbeat lost", node_id)
        reclaim_id = node_lost(node_id)
        if reclaim_id is not None:
            events.append(reclaim_id)
    return events


def enforce_due_deadlines() -> None:
    due = ReclaimEvent.objects.filter(kind=ReclaimKind.SCHEDULED, finished_at__isnull=True,
                                      deadline_at__lte=timezone.now()).values_list("pk", flat=True)
    for reclaim_id in due:
        enforce_deadline(reclaim_id)


def release_finished() -> None:
    open_reclaims = ReclaimEvent.objects.filter(kind=ReclaimKind.SCHEDULED, finished_at__isnull=True,
                                                work__planned_at__isnull=False).values_list("pk", flat=True)
    for reclaim_id in open_reclaims:
        with transaction.atomic():
            release(reclaim_id)


def _hazard_now(node_ids: list[int], hour: int) -> dict[int, float]:
    """λ⁺ per node for this hour (the campus read model's one fallback chain)."""
    return dict(zip(node_ids, hazard_upper_by_hour(node_ids, hour=hour).tolist(), strict=True))


def p1_tick() -> int:
    """P1 per source node: split the node's checkpoint budget among its running jobs, set their intervals.

    B_ckpt of a node = CHECKPOINT_BUDGET_FRACTION * its access link's available bandwidth, minus the rates of
    planned migrations leaving it (pre-sync uses what migrations leave, design §4). Logged when it changes.
    """
    placements = list(Placement.objects.filter(ended_at__isnull=True, job__state=JobState.RUNNING)
                      .select_related("job", "node", "node__access_link"))
    by_node: dict[int, list[Placement]] = defaultdict(list)
    for p in placements:
        by_node[p.node_id].append(p)
    hour = timezone.localtime(timezone.now()).hour
    hazards = _hazard_now(list(by_node), hour)
    changed = 0
    for node_id, group in by_node.items():
        node = group[0].node
        capacity = node.access_link.capacity_bytes_per_s if node.access_link else 125e6
        leaving = sum(Migration.objects.filter(source_id=node_id, finished_at__isnull=True,
                                               mode=MigrationMode.PLANNED)
                      .values_list("assigned_rate_bytes_per_s", flat=True).exclude(
                          assigned_rate_bytes_per_s__isnull=True))
        budget = max(0.01 * capacity, rn("CHECKPOINT_BUDGET_FRACTION") * capacity - leaving)
        jobs = [p.job for p in group]
        p1_jobs = P1Jobs.build(
            ids=tuple(str(j.pk) for j in jobs), hazard_per_s=np.array([hazards[node_id]] * len(jobs)),
            ckpt_bytes=np.array([ckpt_bytes_of(j) for j in jobs]),
            loss_budget_s=np.array([j.loss_budget_s or np.inf for j in jobs]),
            restart_s=np.array([j.restart_s for j in jobs]),
        )
        plan = plan_checkpoints(p1_jobs, budget, rn("BETA"))
        for k, job in enumerate(jobs):
            interval = float(plan.interval_s[k])
            bandwidth = float(plan.bandwidth_bytes_per_s[k])
            rt, _ = JobRuntime.objects.get_or_create(job=job)
            if rt.interval_sent_s and abs(interval - rt.interval_sent_s) <= INTERVAL_CHANGE * rt.interval_sent_s:
                continue
            changed += 1
            with transaction.atomic():
                Job.objects.filter(pk=job.pk).update(checkpoint_interval_s=interval,
                                                     checkpoint_bandwidth_bytes_per_s=bandwidth,
                                                     loss_budget_at_risk=bool(plan.loss_budget_at_risk[k]))
                JobRuntime.objects.filter(pk=rt.pk).update(interval_sent_s=interval)
                log_decision("p1", {"budget_bytes_per_s": budget, "beta": rn("BETA"), "node": node_id,
                                    "jobs": [{"id": j.pk, "hazard_per_s": hazards[node_id],
                                              "ckpt_bytes": float(p1_jobs.ckpt_bytes[i]),
                                              "loss_budget_s": j.loss_budget_s, "restart_s": j.restart_s}
                                             for i, j in enumerate(jobs)]},
                             {"jobs": [{"id": int(i), "bandwidth_bytes_per_s": float(b), "interval_s": float(d),
                                        "loss_budget_at_risk": bool(r)} for i, b, d, r in
                                       zip(plan.ids, plan.bandwidth_bytes_per_s, plan.interval_s,
                                           plan.loss_budget_at_risk, strict=True)],
                              "expected_cost": float(plan.expected_cost)}, job=job)
                commands.send(node_id, "set_interval", job_id=job.pk, interval_s=interval)
    return changed


PRIORITY_ORDER = {PriorityClass.INTERACTIVE: 0, PriorityClass.STANDARD: 1, PriorityClass.BEST_EFFORT: 2}


def place_job(job_id: int) -> str:
    """Place one queued job (design §3 feasibility): resume it from its freshest checkpoint if it has one
    (P2 from the holder; the holder itself if feasible), else start it on the feasible node with the highest
    survival over its remaining runtime (ties: smallest id). Idempotent: a job with an open placement or a
    migration on its way is left alone."""
    with transaction.atomic():
        lock_allocation()  # before the job's row lock: every allocating transaction takes the two in this order
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state != JobState.QUEUED or Placement.objects.filter(job=job, ended_at__isnull=True).exists():
            return "not placeable"
        work = (MigrationWork.objects.select_related("migration")
                .filter(migration__job=job, migration__finished_at__isnull=True)
                .exclude(phase__in=[MigrationPhase.DONE, MigrationPhase.FAILED]).first())
        if work is not None and work.phase != MigrationPhase.WAITING:
            return "migration in progress"
        campus = load_campus()
        found = freshest_replica(job, None, campus.live)
        feasible = campus.feasible(job, found[0] if found is not None else None)
        if not feasible.any():
            return "no capacity"
        if found is not None:
            ckpt, holder = found
            if work is None:
                mig = Migration.objects.create(job=job, source_id=holder, mode=MigrationMode.DEGRADED,
                                               degraded_reason="requeued", checkpoint=ckpt)
                work = MigrationWork.objects.create(migration=mig, phase=MigrationPhase.WAITING,
                                                    requested_at=timezone.now())
            if feasible[campus.index_of[holder]]:
                dest = holder
                log_decision("p2", {"placement": job.pk, "ckpt_holder": holder},
                             {"destination": holder, "reason": "holder has the checkpoint"}, job=job)
            else:
                req, view = build_p2(campus, job, holder, holder, ckpt.size_bytes, None, ckpt, rn("ALPHA"),
                                     rn("K_MIN"))
                response = p2_view(campus, select_destination(req))
                log_decision("p2", view, response, job=job)
                dest = response["destination"]
                if dest is None:
                    return "no destination"
            work.decided_at = timezone.now()
            taken = campus.take_gpus(dest, job.gpu_count)
            resume_from(work, ckpt, holder, dest, gpu_indices=taken if dest == holder else (),
                        rate_bytes_per_s=None if dest == holder else recovery_rate(campus, holder, dest))
            return f"resuming on {dest}"
        if work is not None:  # lost with no checkpoint anywhere: restart from scratch
            Migration.objects.filter(pk=work.migration_id).update(finished_at=timezone.now(), success=False)
            migration_lifecycle.move(work, MigrationPhase.DONE, detail="nothing copied off: restarted from scratch")
        surv = survival(campus.hazard_per_s_by_hour, campus.now_hour, max(1.0, job.expected_runtime_s))
        order = sorted(np.flatnonzero(feasible), key=lambda i: (-surv[i], campus.node_pks[i]))
        dest = campus.node_pks[int(order[0])]
        log_decision("p2", {"placement": job.pk, "gpus": job.gpu_count, "vram_gb": job.vram_gb_per_gpu,
                            "feasible": [campus.node_pks[int(i)] for i in np.flatnonzero(feasible)]},
                     {"destination": dest, "survival": float(surv[int(order[0])])}, job=job)
        start_on(job, dest, campus.take_gpus(dest, job.gpu_count), None, "placed")
        return f"placed on {dest}"


def place_queued() -> int:
    """Try every queued job in priority order, oldest first."""
    jobs = list(Job.objects.filter(state=JobState.QUEUED).values_list("pk", "priority_class"))
    jobs.sort(key=lambda t: (PRIORITY_ORDER.get(t[1], 1), t[0]))
    placed = 0
    for job_id, _ in jobs:
        if place_job(job_id).startswith(("placed", "resuming")):
            placed += 1
    return placed


def expire_starts() -> None:
    """Starts the agent never confirmed within START_TIMEOUT_S: a fresh placement releases its GPUs (the job
    stays queued and is placed again); a migration's resume goes back through placement (``waiting``)."""
    cutoff = timezone.now() - dt.timedelta(seconds=START_TIMEOUT_S)
    with transaction.atomic():
        for work in MigrationWork.objects.select_for_update().select_related("migration").filter(
            phase=MigrationPhase.STARTING, transferred_at__lt=cutoff
        ):
            to_waiting(work, "destination did not start the job in time")
        Placement.objects.filter(ended_at__isnull=True, job__state=JobState.QUEUED, started_at__lt=cutoff).update(
            ended_at=timezone.now(), end_reason="start timeout")


def presync(checkpoint_id: int) -> str:
    """Copy a completed checkpoint to a replica holder on another node (design §1 pre-sync, CS1 at P1's rate).

    The holder is sticky per job while it stays online; otherwise an online node in the same building first,
    then the lowest-hazard one, then the smallest id."""
    with transaction.atomic():
        ckpt = Checkpoint.objects.select_related("job", "node").get(pk=checkpoint_id)
        job = ckpt.job
        if ckpt.node_id is None or job.state != JobState.RUNNING:
            return "skipped"
        newer = Checkpoint.objects.filter(job=job, sequence__gt=ckpt.sequence).exists()
        if newer:
            return "superseded"
        if Transfer.objects.filter(checkpoint=ckpt, purpose=TransferPurpose.PRESYNC).exclude(
                state=TransferState.FAILED).exists():
            return "already issued"  # a second delivery of this task
        live = live_node_pks() - {ckpt.node_id}
        rt = runtime(job)
        candidates = list(Node.objects.filter(pk__in=live, state__in=[NodeState.ONLINE])
                          .values_list("pk", "building_id"))
        if not candidates:
            return "no holder"
        holder = rt.replica_node_id if rt.replica_node_id in {c[0] for c in candidates} else None
        hours = _hazard_now([c[0] for c in candidates], timezone.localtime(timezone.now()).hour)
        building = ckpt.node.building_id
        reason = "sticky: previous holder still online"
        if holder is None:
            holder = min(candidates, key=lambda c: (c[1] != building, hours[c[0]], c[0]))[0]
            reason = "same building first, then lowest hazard, then smallest id"
        rate = job.checkpoint_bandwidth_bytes_per_s or None
        # The holder choice is a decision like any other (design §5): its inputs and answer go to the log.
        log_decision("p2", {"presync": {"checkpoint": ckpt.pk, "sequence": ckpt.sequence, "source": ckpt.node_id,
                                        "source_building": building, "previous_holder": rt.replica_node_id,
                                        "candidates": [{"id": pk, "building": b, "hazard_per_s": hours[pk]}
                                                       for pk, b in candidates]}},
                     {"holder": holder, "reason": reason, "rate_bytes_per_s": rate}, job=job)
        transfer = issue_transfer(ckpt, ckpt.node_id, holder, TransferPurpose.PRESYNC, rate)
        return "issued" if transfer is not None else "holder unreachable"


def control_tick() -> dict[str, int]:
    """One control period: heartbeats, deadlines, P1, placement, releases (one tick at a time on PostgreSQL)."""
    locked = True
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", [TICK_LOCK_KEY])
            locked = bool(cur.fetchone()[0])
        if not locked:
            return {"skipped": 1}
    try:
        update_estimates()
        lost = detect_lost_heartbeats()
        enforce_due_deadlines()
        expired = expire_transfers()
        changed = p1_tick()
        expire_starts()
        placed = place_queued()
        release_finished()
        return {"lost": len(lost), "expired_transfers": expired, "p1_changed": changed, "placed": placed}
    finally:
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", [TICK_LOCK_KEY])
