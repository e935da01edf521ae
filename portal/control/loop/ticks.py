"""What the control loop does every control period (design §2 P1, §3 placement, §1 heartbeats and deadlines)."""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import OuterRef, Q, Subquery, Sum
from django.utils import timezone

from portal.control.config import rn
from portal.control.link import commands, presence
from portal.control.loop.estimates import EstimatorCache, EstimatorState, update_estimates
from portal.control.loop.loans import loans_tick
from portal.control.loop.windows import start_window_ends
from portal.control.models import (
    MigrationPhase,
    MigrationWork,
    ReclaimPhase,
    Transfer,
    TransferPurpose,
    TransferState,
)
from portal.control.reclaim import evict
from portal.control.reclaim import lifecycle as migration_lifecycle
from portal.control.reclaim.apply import (
    NOTICE_KINDS,
    draining_reclaims,
    enforce_deadline,
    expire_transfers,
    node_lost,
    release,
)
from portal.control.reclaim.lifecycle import START_TIMEOUT_S
from portal.control.reclaim.plan import migration_budget, recovery_rate
from portal.control.reclaim.workflow import (
    MAX_RESTORE_FAILURES,
    issue_transfer,
    log_decision,
    measured_work_lost_s,
    resume_from,
    runtime,
    start_on,
    to_waiting,
)
from portal.control.reserve import research_use_by_link, reserve_min_by_link, rows_of_links
from portal.control.state import build_p2, load_campus, lock_allocation, p2_view
from portal.core import campus as campus_model
from portal.core import events, outbox
from portal.core.bulk import update_columns
from portal.core.campus import (
    Campus,
    freshest_replica,
    hazard_upper_by_hour,
    live_node_pks,
    newest_checkpoint_bytes,
)
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import (
    Checkpoint,
    DecisionLog,
    Job,
    LendingWindow,
    LinkEstimate,
    Migration,
    MigrationMode,
    Node,
    Placement,
    ReclaimEvent,
)
from portal.core.services.nodes import ACCESS_LINK_DEFAULT_BYTES_PER_S
from portal.queue import placement as queue_placement
from scheduler.estimators import PLAN_HAZARD_QUANTILE, short_notice_rate_per_s
from scheduler.p1 import P1Jobs, plan_checkpoints
from scheduler.p2 import select_destination, survival
from scheduler.reserve import borrowable_reserve_bytes_per_s

log = logging.getLogger(__name__)

TICK_LOCK_KEY = 0x52434C4E  # "RCLN": one control tick at a time across workers
INTERVAL_CHANGE = 0.05  # resend an interval only when it moved by more than 5 %


@dataclass
class TickContext:
    """What the process running the tick keeps between ticks (the Celery task, the embedded loop): its copy of
    the estimator state (design §9.5) and when it started — no node is declared lost during the first heartbeat
    timeout after a control-plane restart, when every agent is still reconnecting."""

    estimators: EstimatorCache = field(default_factory=EstimatorCache)
    started_monotonic: float = field(default_factory=time.monotonic)


def detect_lost_heartbeats(started_monotonic: float = -math.inf, now: dt.datetime | None = None) -> list[int]:
    """Nodes silent for longer than HEARTBEAT_TIMEOUT_S while the portal was listening: offline, jobs recovered
    (design §1, §9.10).

    Silence counts from the later of the node's last heartbeat and the moment the agent link came back plus a
    reconnect grace (:func:`portal.control.link.presence.evidence`): after a daphne restart, a database or Redis
    outage, every agent looks silent until it has reconnected, and while no link server is serving at all
    nobody is judged. Nothing is declared lost during the first timeout after ``started_monotonic`` either
    (when the process running the tick started).
    """
    if time.monotonic() - started_monotonic < rn("HEARTBEAT_TIMEOUT_S"):
        return []
    now = now or timezone.now()
    cutoff = now - dt.timedelta(seconds=rn("HEARTBEAT_TIMEOUT_S"))
    link = presence.evidence(now)
    if link.recorded and not link.serving:
        log.warning("no agent-link server is serving: heartbeat silence is not judged until one is back")
        return []
    silence_from = link.silence_from()
    if silence_from is not None and silence_from >= cutoff:
        return []  # the link came back less than grace + timeout ago: agents are still reconnecting
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
    due = ReclaimEvent.objects.filter(kind__in=NOTICE_KINDS, finished_at__isnull=True,
                                      deadline_at__lte=timezone.now()).values_list("pk", flat=True)
    for reclaim_id in due:
        enforce_deadline(reclaim_id)


def release_finished() -> None:
    for reclaim_id in draining_reclaims():
        with transaction.atomic():
            release(reclaim_id)


def _hazard_now(node_ids: list[int], hour: int) -> dict[int, float]:
    """λ⁺ per node for this hour (the campus read model's one fallback chain)."""
    return dict(zip(node_ids, hazard_upper_by_hour(node_ids, hour=hour).tolist(), strict=True))


def _newest_async_stall_s() -> Subquery:
    """An annotation: the stall of the job's newest completed asynchronous checkpoint (NULL: it checkpoints
    synchronously, or reported no stall — an older agent), design §2 "Asynchronous snapshots"."""
    return Subquery(Checkpoint.objects.filter(job=OuterRef("job_id"), completed_at__isnull=False, mode="async",
                                              stall_s__isnull=False).order_by("-sequence").values("stall_s")[:1])


def _newest_transfer_s() -> Subquery:
    """An annotation: how long the copy of the job's newest copied checkpoint took (NULL before any)."""
    return Subquery(Checkpoint.objects.filter(job=OuterRef("job_id"), transfer_s__isnull=False)
                    .order_by("-sequence").values("transfer_s")[:1])


def _borrowable_reserve(nodes: np.ndarray, link_of: dict[int, int | None], capacity: np.ndarray) -> np.ndarray:
    """Per node, the part of its access link's research reserve that research leaves idle now (design §4
    "Work-conserving reserve"): the agent's HTB ceil lets checkpoints use it, so P1 plans with it. 0 where the
    link's research use is not measured (no recent class sample). Two statements."""
    links = [link_of.get(int(n)) for n in nodes]
    known = sorted({pk for pk in links if pk is not None})
    use = research_use_by_link(known)
    stored = dict(zip(known, reserve_min_by_link(known).tolist(), strict=True))
    fraction = rn("RESERVE_FRACTION")
    reserve = np.array([max(fraction * c, stored.get(pk, 0.0)) for pk, c in zip(links, capacity, strict=True)])
    research = np.array([use.get(pk, np.nan) if pk is not None else np.nan for pk in links])
    return np.asarray(borrowable_reserve_bytes_per_s(reserve, research), dtype=float)


def _short_notice_hazard(estimators: EstimatorState | None, node_of: np.ndarray, link_of: np.ndarray,
                         capacity: np.ndarray, ckpt_bytes: np.ndarray, restart_s: np.ndarray) -> np.ndarray:
    """Per job, the rate of scheduled reclaims on its node whose notice is shorter than its final checkpoint needs
    (design §2 "Estimators"): C/b + T_r with b the migration budget of its access link's B⁻ (its ``capacity``
    before the link has an estimate) less the link's calibrated reserve, as the reclaim planner's P3 tests it. 0
    without the estimator state (a one-off call) or where no short notice was recorded; two statements (the links'
    B⁻ and reserves) otherwise."""
    out = np.zeros(node_of.size)
    if estimators is None or not node_of.size:
        return out
    index = estimators.node_index
    known = np.array([int(n) in index for n in node_of])
    if not known.any():
        return out
    rates = estimators.hazard.short_notice_rates_per_s(estimators.until_s)[
        [index.get(int(n), 0) for n in node_of]]
    if not (rates[known] > 0).any():
        return out
    links = sorted({int(x) for x in link_of if x is not None})
    lower = dict(rows_of_links(LinkEstimate.objects, links).values_list("link_id", "lower_bytes_per_s"))
    reserve_min = dict(zip(links, reserve_min_by_link(links).tolist(), strict=True))
    rate = np.array([max(1.0, migration_budget(lower.get(link) or cap, reserve_min.get(link)))
                     for link, cap in zip(link_of, capacity, strict=True)])
    need = ckpt_bytes / rate + restart_s
    return np.where(known, short_notice_rate_per_s(rates, need), 0.0)


def p1_tick(now: dt.datetime | None = None, estimators: EstimatorState | None = None) -> int:
    """P1 for every running job at once (design §2): each source node's checkpoint budget is split among its
    jobs by the cube-root rule (``plan_checkpoints`` with one group per node), and intervals that moved by more
    than INTERVAL_CHANGE since the one stored on the job (the one its agent was last told: ``start_job`` carries
    it too) are stored, logged and sent — in a fixed number of statements whatever the campus size.

    B_ckpt of a node = CHECKPOINT_BUDGET_FRACTION × its access link's capacity (the share set aside for
    checkpoints, stable from tick to tick), minus the rates of planned migrations leaving it (pre-sync uses
    what migrations leave, design §4).

    λ (design §2 "Estimators"): the node's hazard at ``scheduler.estimators.PLAN_HAZARD_QUANTILE`` — the λ̂ rows
    when it is None (the posterior mean), the λ⁺ rows otherwise — plus, with ``estimators`` (the tick's estimator
    state), the rate of scheduled reclaims whose notice is shorter than the job's final checkpoint needs.
    """
    rows = list(Placement.objects.filter(ended_at__isnull=True, job__state=JobState.RUNNING).order_by()
                .annotate(newest_bytes=newest_checkpoint_bytes("job_id"), stall_s=_newest_async_stall_s(),
                          transfer_s=_newest_transfer_s())
                .values_list("job_id", "node_id", "job__restart_s", "job__loss_budget_s",
                             "job__checkpoint_interval_s", "node__access_link__capacity_bytes_per_s",
                             "newest_bytes", "job__ckpt_bytes_estimate", "node__provider_id",
                             "stall_s", "transfer_s", "job__loss_budget_mode", "node__access_link_id"))
    if not rows:
        return 0
    job_ids = [r[0] for r in rows]
    node_of = np.array([r[1] for r in rows])
    nodes, group = np.unique(node_of, return_inverse=True)
    capacity_of = {r[1]: r[5] or ACCESS_LINK_DEFAULT_BYTES_PER_S for r in rows}
    leaving = dict(Migration.objects.filter(finished_at__isnull=True, mode=MigrationMode.PLANNED,
                                            assigned_rate_bytes_per_s__isnull=False)
                   .values("source_id").annotate(rate=Sum("assigned_rate_bytes_per_s")).values_list("source_id", "rate"))
    capacity = np.array([capacity_of[int(n)] for n in nodes])
    budget = np.maximum(0.01 * capacity, rn("CHECKPOINT_BUDGET_FRACTION") * capacity
                        - np.array([leaving.get(int(n), 0.0) for n in nodes]))
    guaranteed = budget  # a `bound` job's transfer time is taken at this (design §2 "Loss budget modes")
    budget = budget + _borrowable_reserve(nodes, {r[1]: r[12] for r in rows}, capacity)  # design §4 work-conserving
    hour = timezone.localtime(now or timezone.now()).hour
    hazard_of_node = hazard_upper_by_hour(nodes.tolist(), {r[1]: r[8] for r in rows}, hour=hour,
                                          upper=PLAN_HAZARD_QUANTILE is not None)
    ckpt_bytes = np.array([float(r[6] if r[6] is not None else r[7]) for r in rows])
    short_notice = _short_notice_hazard(
        estimators, node_of, np.array([r[12] for r in rows]), capacity[group], ckpt_bytes,
        np.array([float(r[2]) for r in rows]))
    hazard = hazard_of_node[group] + short_notice
    p1_jobs = P1Jobs.build(
        ids=tuple(str(j) for j in job_ids), hazard_per_s=hazard,
        ckpt_bytes=ckpt_bytes,
        loss_budget_s=np.array([r[3] or np.inf for r in rows]), restart_s=np.array([r[2] for r in rows]),
        # design §2 "Asynchronous snapshots": None when no job snapshots (the synchronous plan, bit for bit)
        stall_s=np.array([np.nan if r[9] is None else r[9] for r in rows]) if any(r[9] is not None for r in rows)
        else None,
        transfer_s=np.array([np.nan if r[10] is None else r[10] for r in rows]),
        # design §2 "Loss budget modes": None when every job is "expected" (Eq. 9, bit for bit)
        loss_budget_mode=np.array([r[11] for r in rows], dtype=object) if any(r[11] == "bound" for r in rows)
        else None,
    )
    plan = plan_checkpoints(p1_jobs, budget, rn("BETA"), group=group,
                            min_interval_s=rn("MIN_CHECKPOINT_INTERVAL_S"), guaranteed_budget_bytes_per_s=guaranteed)
    sent = np.array([r[4] if r[4] else np.nan for r in rows])
    with np.errstate(invalid="ignore"):
        changed = ~(np.abs(plan.interval_s - sent) <= INTERVAL_CHANGE * sent)
    if not changed.any():
        return 0
    which = np.flatnonzero(changed)
    changed_ids = [job_ids[k] for k in which]
    with transaction.atomic():
        update_columns(Job, "pk", changed_ids, {
            "checkpoint_interval_s": plan.interval_s[which].tolist(),
            "checkpoint_bandwidth_bytes_per_s": plan.bandwidth_bytes_per_s[which].tolist(),
            "loss_budget_at_risk": plan.loss_budget_at_risk[which].tolist()})
        members: dict[int, list[int]] = defaultdict(list)
        for k in range(len(rows)):
            members[int(group[k])].append(k)
        logs, orders = [], []
        for k in which:
            g = int(group[k])
            node_jobs = members[g]
            # The request is a p1 request of the contract (design §5): replayed through it, it plans the same.
            logs.append(DecisionLog(kind="p1", job_id=job_ids[k], request={
                "budget_bytes_per_s": float(budget[g]), "guaranteed_budget_bytes_per_s": float(guaranteed[g]),
                "beta": rn("BETA"), "node": int(nodes[g]), "min_interval_s": rn("MIN_CHECKPOINT_INTERVAL_S"),
                "jobs": [{"id": job_ids[i], "hazard_per_s": float(hazard_of_node[group[i]]),
                          "short_notice_hazard_per_s": float(short_notice[i]),
                          "ckpt_bytes": float(p1_jobs.ckpt_bytes[i]), "loss_budget_s": rows[i][3],
                          "restart_s": rows[i][2], "stall_s": rows[i][9], "transfer_s": rows[i][10],
                          "loss_budget_mode": rows[i][11]}
                         for i in node_jobs]},
                response={"jobs": [{"id": job_ids[i], "bandwidth_bytes_per_s": float(plan.bandwidth_bytes_per_s[i]),
                                    "interval_s": float(plan.interval_s[i]), "planned_hazard_per_s": float(hazard[i]),
                                    "loss_budget_at_risk": bool(plan.loss_budget_at_risk[i])} for i in node_jobs]}))
            orders.append((int(nodes[g]), "set_interval", {"job_id": job_ids[k],
                                                          "interval_s": float(plan.interval_s[k])}))
        DecisionLog.objects.bulk_create(logs, batch_size=2000)
        commands.send_many(orders)
    return len(which)


PLACEMENT_GATHER_S = 0.5  # a placement pass waits this long for the submits that arrive with the first one
PASS_PENDING_KEY = "placement-pass-pending"  # in the cache: a pass is queued and has not started yet
PASS_PENDING_TTL_S = 10.0  # a pass lost before it started stops holding submits back after this


def request_placement(job_id: int) -> str:
    """A submit's placement (the task its outbox row queues): one pass over every queued job
    (:func:`place_queued`) shortly after, shared by all the submits that arrive before it starts (design §10).

    A burst of N submits costs a few passes — each one campus read, its jobs placed in queue order — instead
    of N. No submit is left out: this job committed before its task ran, and the pass it joins has not started
    (:func:`placement_pass` clears the flag before it reads the queue), so it reads the queue after the job
    exists; a submit that arrives while a pass runs queues the next one. A job already placed or cancelled
    needs no pass. A pass lost before it started holds submits back for at most ``PASS_PENDING_TTL_S``, and the
    control tick places whatever is left every control period. The flag is the cache's (Redis in production,
    this process's memory in the embedded default, whose relay runs every task here)."""
    if not Job.objects.filter(pk=job_id, state=JobState.QUEUED).exists():
        return "not queued"
    if not cache.add(PASS_PENDING_KEY, job_id, timeout=PASS_PENDING_TTL_S):
        return "joined a pending pass"
    # ``inline`` relays (tests) run only rows that are due now: no gathering there.
    gather_s = 0.0 if outbox.relay_mode() == "inline" else PLACEMENT_GATHER_S
    try:
        with transaction.atomic():
            outbox.enqueue(outbox.Task.PLACE_QUEUED, delay_s=gather_s)
    except BaseException:
        cache.delete(PASS_PENDING_KEY)
        raise
    return "pass queued"


def placement_pass() -> int:
    """The pass submits requested: the flag cleared first (a submit from now on queues the next pass), then
    :func:`place_queued`."""
    cache.delete(PASS_PENDING_KEY)
    return place_queued()


def place_job(job_id: int) -> str:
    """Place one queued job now, on its own campus read (tools and tests; a submit's task requests a shared pass,
    :func:`request_placement`); see :func:`place_on`."""
    with transaction.atomic():
        lock_allocation()  # before the job's row lock: every allocating transaction takes the two in this order
        job = Job.objects.select_for_update().get(pk=job_id)
        return place_on(job, load_campus())


def place_on(job: Job, campus: Campus) -> str:
    """Place one queued job on the snapshot ``campus`` (design §3 feasibility), taking its GPUs there: resume it
    from its freshest checkpoint if it has one (P2 from the holder; the holder itself if feasible), else start
    it on the feasible node with the highest survival over its remaining runtime (ties: smallest id).
    Idempotent: a job with an open placement or a migration on its way is left alone. Only copies an agent
    confirmed are counted (a failed restore forgot its copy, design §9.9); a migration whose restores failed
    MAX_RESTORE_FAILURES times restarts from scratch, so a job is never placed in a loop."""
    if job.state != JobState.QUEUED or Placement.objects.filter(job=job, ended_at__isnull=True).exists():
        return "not placeable"
    work = (MigrationWork.objects.select_related("migration")
            .filter(migration__job=job, migration__finished_at__isnull=True)
            .exclude(phase__in=[MigrationPhase.DONE, MigrationPhase.FAILED]).first())
    if work is not None and work.phase != MigrationPhase.WAITING:
        return "migration in progress"
    found = freshest_replica(job, None, campus.live)
    gave_up = work is not None and work.restore_failures >= MAX_RESTORE_FAILURES
    if gave_up:
        found = None
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
    if work is not None:  # lost with no checkpoint anywhere (or none that restores): restart from scratch
        lost_s = measured_work_lost_s(job, work.migration.source_id, 0, job.progress_step)
        Migration.objects.filter(pk=work.migration_id).update(
            finished_at=timezone.now(), success=False, checkpoint=None,
            **({"work_lost_s": lost_s} if lost_s is not None else {}))
        migration_lifecycle.move(work, MigrationPhase.DONE, detail=(
            f"{work.restore_failures} restores failed: restarted from scratch" if gave_up
            else "nothing copied off: restarted from scratch"))
    surv = survival(campus.hazard_per_s_by_hour, campus.now_hour, max(1.0, job.expected_runtime_s))
    order = sorted(np.flatnonzero(feasible), key=lambda i: (-surv[i], campus.node_pks[i]))
    dest = campus.node_pks[int(order[0])]
    log_decision("p2", {"placement": job.pk, "gpus": job.gpu_count, "vram_gb": job.vram_gb_per_gpu,
                        "remaining_s": max(1.0, job.expected_runtime_s),
                        "feasible": [campus.node_pks[int(i)] for i in np.flatnonzero(feasible)]},
                 {"destination": dest, "survival": float(surv[int(order[0])]),
                  "runners_up": [{"id": campus.node_pks[int(i)], "survival": float(surv[int(i)])} for i in order[1:4]]},
                 job=job)
    start_on(job, dest, campus.take_gpus(dest, job.gpu_count), None, "placed")
    events.emit("job.placed", job=job, node=dest)
    return f"placed on {dest}"


def place_queued() -> int:
    """The fair queue's pass (design §16.6), on one snapshot of the campus: ``scheduler.queue`` orders the
    waiting jobs by priority (class, fair share, age), holds back those over quota, with unmet dependencies or
    beyond their array's throttle, reserves GPUs for the first job that does not fit and backfills behind it;
    the jobs it starts are placed one by one with :func:`place_on` on the node it chose, each in its own
    savepoint, seeing the GPUs the previous ones took. Every waiting job's priority terms, reason and estimated
    start are rewritten; over-quota jobs in the way of a job within quota are checkpointed and requeued.

    One statement is read when no job is queued; three when no job could start now, none is to be preempted
    and every waiting job's standing is recent (``queue_placement.pass_needed``): a quiet queue is re-ranked
    every ``STANDING_MAX_AGE_S``, not every period."""
    with transaction.atomic():
        lock_allocation()
        if not queue_placement.pass_needed():
            return 0
        return queue_placement.run_pass(campus_model.load(), place_on).placed


def expire_starts() -> None:
    """Starts the agent never confirmed within START_TIMEOUT_S: a fresh placement releases its GPUs (the job
    stays queued and is placed again); a migration's resume goes back through placement (``waiting``)."""
    cutoff = timezone.now() - dt.timedelta(seconds=START_TIMEOUT_S)
    late_moves = MigrationWork.objects.filter(phase=MigrationPhase.STARTING, transferred_at__lt=cutoff)
    if late_moves.exists():
        with transaction.atomic():
            for work in late_moves.select_for_update().select_related("migration"):
                to_waiting(work, "destination did not start the job in time")
    # One statement, which changes nothing on most ticks.
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


def pending_steps() -> dict[str, bool]:
    """Which housekeeping steps of the tick have anything to do, answered in one statement (an EXISTS per
    step), so that a quiet tick does not run five queries that find nothing. A step whose rows appear just after
    this read runs on the next tick."""
    now = timezone.now()
    silent = now - dt.timedelta(seconds=rn("HEARTBEAT_TIMEOUT_S"))
    unstarted = now - dt.timedelta(seconds=START_TIMEOUT_S)
    checks = {
        "lost": Node.objects.filter(state__in=[NodeState.ONLINE, NodeState.DRAINING]).filter(
            Q(last_heartbeat_at__lt=silent) | Q(last_heartbeat_at__isnull=True)),
        "deadlines": ReclaimEvent.objects.filter(kind__in=NOTICE_KINDS, finished_at__isnull=True,
                                                 deadline_at__lte=now),
        "transfers": Transfer.objects.filter(state=TransferState.ISSUED, expires_at__lt=now),
        "moves": MigrationWork.objects.filter(phase=MigrationPhase.STARTING, transferred_at__lt=unstarted),
        "starts": Placement.objects.filter(ended_at__isnull=True, job__state=JobState.QUEUED,
                                           started_at__lt=unstarted),
        "releases": ReclaimEvent.objects.filter(kind__in=NOTICE_KINDS, finished_at__isnull=True,
                                                work__phase=ReclaimPhase.PLANNED),
        # A node with lending windows running a job: its window's end may be due (design §9.13).
        "windows": LendingWindow.objects.filter(node__state=NodeState.ONLINE, node__placements__ended_at__isnull=True,
                                                node__placements__job__state=JobState.RUNNING),
        **evict.pending_checks(),  # the loan watchdog's evictions under way (design §15)
    }
    parts, params = [], []
    for queryset in checks.values():
        sql, query_params = queryset.order_by().values("pk")[:1].query.sql_with_params()
        parts.append(f"EXISTS ({sql})")
        params.extend(query_params)
    with connection.cursor() as cur:
        cur.execute("SELECT " + ", ".join(parts), params)
        return dict(zip(checks, (bool(x) for x in cur.fetchone()), strict=True))


def control_tick(now: dt.datetime | None = None, context: TickContext | None = None) -> dict[str, int]:
    """One control period: estimators, heartbeats, deadlines, P1, placement, releases (one tick at a time on
    PostgreSQL). ``context``: what the calling process keeps between ticks (none: a one-off tick, no grace)."""
    locked = True
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", [TICK_LOCK_KEY])
            locked = bool(cur.fetchone()[0])
        if not locked:
            return {"skipped": 1}
    try:
        estimators = context.estimators if context is not None else EstimatorCache()
        update_estimates(now, estimators)
        due = pending_steps()
        started = context.started_monotonic if context is not None else -math.inf
        lost = detect_lost_heartbeats(started, now) if due["lost"] else []
        windows = start_window_ends(now) if due["windows"] else []
        if due["deadlines"]:
            enforce_due_deadlines()
        expired = expire_transfers() if due["transfers"] else 0
        changed = p1_tick(now, estimators.state)
        if due["moves"] or due["starts"]:
            expire_starts()
        # the idle watchdog and the loan timer (design §15): releases free GPUs before placement
        loans_tick(now, drive_evictions=due["evictions"] or due["ended_releases"])
        placed = place_queued()
        if due["releases"]:
            release_finished()
        return {"lost": len(lost), "expired_transfers": expired, "p1_changed": changed, "placed": placed,
                "window_ends": len(windows)}
    finally:
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute("SELECT pg_advisory_unlock(%s)", [TICK_LOCK_KEY])
