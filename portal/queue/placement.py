"""One pass of the fair queue (design §16.6): read the queue once, let ``scheduler.queue`` decide, apply.

The pass reads, in a fixed number of statements whatever the number of jobs: the waiting jobs (locked), their
dependencies, the jobs holding GPUs, the groups' usage and quotas, each node's lendable GPUs; the campus
snapshot is the caller's. ``scheduler.queue.schedule`` answers which jobs start where, which wait and why, the
reservation, the estimated starts and the over-quota jobs to evict. The starters are placed one by one with the
per-job placement (``place_on``) on the node the queue chose; every waiting job's standing is rewritten
(``QueueEntry``); over-quota jobs are checkpointed and requeued through the eviction path.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.db import transaction
from django.db.models import Count, Exists, Min, OuterRef, Subquery
from django.utils import timezone

from portal.control.models import MigrationPhase, MigrationWork
from portal.control.reclaim.evict import evict_job
from portal.core import campus as campus_model
from portal.core import events
from portal.core.campus import Campus
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.lifecycle.jobs import JobState
from portal.core.models import Checkpoint, Job, Node, Placement
from portal.queue import dependencies
from portal.queue.models import (
    ArrayTask,
    FairShareConfig,
    JobArray,
    JobDependency,
    OverQuotaRun,
    QueueEntry,
    QueueReason,
)
from portal.queue.standing import GroupStanding, group_standing, weights
from scheduler import explain as words
from scheduler import queue as core
from scheduler.p2 import feasible_mask
from scheduler.windows import local_clock

log = logging.getLogger(__name__)

PREEMPT_NOTICE_S = 120.0  # an over-quota job gets this long to write its final checkpoint
STANDING_MAX_AGE_S = 60.0  # a queue where nothing can start is re-ranked (estimates, ages) at least this often
REASONS = {  # scheduler.queue's reason → the stored code
    "dependency": QueueReason.DEPENDENCY,
    "array throttle": QueueReason.ARRAY_THROTTLE,
    "over quota": QueueReason.OVER_QUOTA,
    "reserved": QueueReason.RESERVED,
    "behind reservation": QueueReason.RESERVED,
    "preempting": QueueReason.BEHIND_OTHERS,
    "no free GPUs": QueueReason.BEHIND_OTHERS,
}


@dataclass
class PassResult:
    placed: int = 0
    preempted: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)


def pass_needed(now: dt.datetime | None = None) -> bool:
    """Whether a full pass has anything to do: some job is queued, and either one could start now (the smallest
    fits a lent node's free GPUs), a waiting job has no standing or one older than ``STANDING_MAX_AGE_S``, or a
    job started over quota is running (a waiting job may need its GPUs). One statement when nothing is queued,
    three at most."""
    now = now or timezone.now()
    queue = Job.objects.filter(state=JobState.QUEUED).aggregate(
        waiting=Count("pk"), ranked=Count("queue_entry"), smallest=Min("gpu_count"),
        oldest=Min("queue_entry__computed_at"))
    if not queue["waiting"]:
        return False  # a left-over standing row belongs to a job no longer queued: nothing shows it
    if queue["ranked"] < queue["waiting"] or queue["oldest"] is None or \
            (now - queue["oldest"]).total_seconds() > STANDING_MAX_AGE_S:
        return True
    if queue["smallest"] <= campus_model.most_gpus_free_on_a_lent_node():
        return True
    return OverQuotaRun.objects.filter(job__state=JobState.RUNNING).exists()


def _hardware(campus: Campus) -> np.ndarray:
    """Each node's lendable GPUs (all of them but its provider's floor), indexed like the campus (one statement)."""
    counts = {pk: Node.lendable_of(n, floor) for pk, n, floor in
              Node.objects.annotate(n=Count("gpus")).values_list("pk", "n", "gpu_floor")}
    return np.array([counts.get(pk, 0) for pk in campus.node_pks], dtype=float)


def _waiting_rows() -> list[Job]:
    """The queued jobs, locked (others' locked rows skipped), with their array and newest restorable capability;
    not those already starting somewhere (an open placement) or being copied to a destination (they hold GPUs:
    :func:`_running_rows` counts them)."""
    newest = Checkpoint.objects.filter(job=OuterRef("pk"), completed_at__isnull=False).order_by("-sequence")
    task = ArrayTask.objects.filter(job=OuterRef("pk"))
    starting = Placement.objects.filter(job=OuterRef("pk"), ended_at__isnull=True)
    moving = MigrationWork.objects.filter(migration__job=OuterRef("pk"), migration__finished_at__isnull=True,
                                          ).exclude(phase__in=[MigrationPhase.WAITING, MigrationPhase.DONE,
                                                               MigrationPhase.FAILED])
    return list(Job.objects.select_for_update(skip_locked=True, of=("self",)).filter(state=JobState.QUEUED)
                .filter(~Exists(starting), ~Exists(moving))
                .annotate(restore_cc=Subquery(newest.values("compute_capability")[:1]), has_checkpoint=Exists(newest),
                          array_id=Subquery(task.values("array_id")[:1]),
                          array_throttle=Subquery(task.values("array__throttle")[:1]))
                .order_by("pk"))


def _running_rows() -> list[dict[str, Any]]:
    """Every job holding GPUs now (an open placement: running, migrating off, or starting)."""
    task = ArrayTask.objects.filter(job=OuterRef("job_id"))
    return list(Placement.objects.filter(ended_at__isnull=True).exclude(job__state__in=job_lifecycle.TERMINAL)
                .annotate(array_id=Subquery(task.values("array_id")[:1]),
                          over_quota=Subquery(OverQuotaRun.objects.filter(job=OuterRef("job_id")).values("job")[:1]))
                .values("job_id", "node_id", "started_at", "array_id", "over_quota", "job__state", "job__gpu_count",
                        "job__group_id", "job__owner_id", "job__expected_runtime_s", "job__work_done_s",
                        "job__started_at"))


def _remaining_s(expected_s: float, work_done_s: float, placed_at: dt.datetime, now: dt.datetime) -> float:
    """Seconds a running job still needs, by its own estimate: its expected runtime less its measured progress
    (or, with none measured, the time since it was placed)."""
    done = work_done_s if work_done_s > 0 else max(0.0, (now - placed_at).total_seconds())
    return max(0.0, float(expected_s) - float(done))


def run_pass(campus: Campus, place_on: Callable[[Job, Campus], str], now: dt.datetime | None = None) -> PassResult:
    """The fair queue's pass; inside the caller's transaction, the allocation lock held (design §16.6)."""
    now = now or timezone.now()
    result = PassResult()
    jobs = _waiting_rows()
    if not jobs:
        return result
    config = FairShareConfig.current()
    running = [r for r in _running_rows() if r["node_id"] in campus.index_of]
    deps: dict[int, tuple[list[str], list[str]]] = {}
    waiting_for: dict[int, list[int]] = {}  # job → the parents it still waits for
    for job_id, kind, parent_id, state in JobDependency.objects.filter(job__in=[j.pk for j in jobs]).values_list(
            "job_id", "kind", "parent_id", "parent__state"):
        ok, any_ = deps.setdefault(job_id, ([], []))
        (ok if kind == "after_ok" else any_).append(state)
        if state not in job_lifecycle.TERMINAL:
            waiting_for.setdefault(job_id, []).append(parent_id)
    keep: list[Job] = []
    doomed: list[Job] = []
    for j in jobs:
        status, _ = core.dependency_status(*deps.get(j.pk, ([], [])))
        # a parent ended badly before the hook could see this job (or before it existed): cancelled, with its
        # own dependants, in one cascade (bounded notices, design §16.6)
        (doomed if status == "cancel" else keep).append(j)
    if doomed:
        with transaction.atomic():
            result.cancelled = [child.pk for child, _ in dependencies.cascade(dependencies.parents_failed(doomed))]
    jobs = keep
    if not jobs:
        QueueEntry.objects.all().delete()
        return result
    eligible = np.array([core.dependency_status(*deps.get(j.pk, ([], [])))[0] == "ready" for j in jobs])
    members = {(j.group_id, j.owner_id) for j in jobs} | {(r["job__group_id"], r["job__owner_id"]) for r in running}
    standing = group_standing(now, config, members)
    decision, prio = _decide(campus, jobs, running, eligible, standing, config, now)
    started: set[int] = set()
    over_quota: list[int] = []
    for w in decision.order:
        w = int(w)
        node_i = int(decision.start_node[w])
        if node_i < 0:
            continue
        job = jobs[w]
        with transaction.atomic():
            if job.has_checkpoint:
                # A job with a checkpoint resumes where placement says (design §3: the copy's holder first,
                # else P2's destination), not on the node the queue counted it on; the reserved node stays
                # out of its reach.
                outcome = _place_avoiding(job, campus, int(decision.reserved_node), place_on)
            else:
                outcome = _place_on_node(job, campus, campus.node_pks[node_i], place_on)
            if outcome.startswith(("placed", "resuming")):
                result.placed += 1
                started.add(job.pk)
                if bool(decision.over_quota[w]):
                    over_quota.append(job.pk)
    if started:  # who started beyond quota is the first to leave for a job within quota (two statements)
        OverQuotaRun.objects.filter(job_id__in=started).exclude(job_id__in=over_quota).delete()
        OverQuotaRun.objects.bulk_create([OverQuotaRun(job_id=pk) for pk in over_quota], ignore_conflicts=True)
    _write_entries(jobs, started, decision, prio, standing, campus, now, waiting_for)
    if config.preempt_over_quota and len(decision.preempt):
        result.preempted = _preempt([running[int(r)]["job_id"] for r in decision.preempt])
    return result


def _decide(campus: Campus, jobs: list[Job], running: list[dict[str, Any]], eligible: np.ndarray,
            standing: GroupStanding, config: FairShareConfig, now: dt.datetime) -> tuple[Any, Any]:
    """``scheduler.queue.schedule`` on this state, and the jobs' priorities (with their parts)."""
    n = len(campus.node_pks)
    lendable = _hardware(campus)
    held = np.zeros(n)
    for r in running:
        i = campus.index_of.get(r["node_id"])
        if i is not None:
            held[i] += r["job__gpu_count"]
    weekday_minute = core_clock(now)
    from_s, until_s = core.node_availability([campus.windows.get(pk, []) for pk in campus.node_pks],
                                             *weekday_minute, campus_model.window_notice_s())
    takes_work = campus.free_gpus > 0
    closed = np.array([campus.window_state.get(pk) is not None for pk in campus.node_pks], dtype=bool)
    # A node taking no work now offers only the GPUs its jobs hold (they free up), unless its lending window is
    # what keeps it: then all its GPUs once the window opens.
    gpus = np.where(takes_work | closed, np.maximum(lendable, held + campus.free_gpus), held)
    nodes = core.QueueNodes(gpus=gpus, free_gpus=campus.free_gpus.copy(), available_from_s=np.asarray(from_s),
                            available_until_s=np.asarray(until_s))
    arrays = sorted({j.array_id for j in jobs if j.array_id is not None} |
                    {r["array_id"] for r in running if r["array_id"] is not None})
    array_index = {a: i for i, a in enumerate(arrays)}
    throttle = np.zeros(len(arrays), dtype=int)
    for j in jobs:
        if j.array_id is not None:
            throttle[array_index[j.array_id]] = j.array_throttle or 0
    g, u = standing.index, standing.user_index
    running_in = core.QueueRunning(
        node=np.array([campus.index_of.get(r["node_id"], -1) for r in running], dtype=int),
        gpus=np.array([r["job__gpu_count"] for r in running], dtype=float),
        ends_in_s=np.array([_remaining_s(r["job__expected_runtime_s"], r["job__work_done_s"], r["started_at"], now)
                            for r in running], dtype=float),
        started_ago_s=np.array([max(0.0, (now - r["started_at"]).total_seconds()) for r in running], dtype=float),
        group=np.array([g.get(r["job__group_id"], -1) for r in running], dtype=int),
        preemptible=np.array([r["over_quota"] is not None and r["job__state"] == JobState.RUNNING
                              for r in running], dtype=bool),
        user=np.array([u.get((r["job__group_id"], r["job__owner_id"]), -1) for r in running], dtype=int),
        array=np.array([array_index.get(r["array_id"], -1) for r in running], dtype=int),
    )
    age_s = np.array([max(0.0, (now - j.submitted_at).total_seconds()) for j in jobs])
    class_term = np.array([core.CLASS_TERMS.get(j.priority_class, 0.5) for j in jobs])
    fair = np.array([standing.factor[g[j.group_id]] for j in jobs])
    prio = core.priorities(class_term, fair, age_s, weights(config))
    big = np.full(n, 1e9)
    feasible = np.zeros((len(jobs), n), dtype=bool)
    for k, j in enumerate(jobs):
        compatible = None if j.restore_cc is None else campus.capability >= float(j.restore_cc)
        feasible[k] = feasible_mask(big, campus.vram_gb, campus.capability, compatible, gpus=int(j.gpu_count),
                                    vram_gb_needed=float(j.vram_gb_per_gpu), min_capability=float(j.min_capability))
    waiting = core.QueueWaiting(
        priority=np.asarray(prio.value, dtype=float), gpus=np.array([j.gpu_count for j in jobs], dtype=float),
        runtime_s=np.array([max(1.0, j.expected_runtime_s) for j in jobs], dtype=float), feasible=feasible,
        group=np.array([g[j.group_id] for j in jobs], dtype=int),
        user=np.array([u.get((j.group_id, j.owner_id), -1) for j in jobs], dtype=int),
        array=np.array([array_index.get(j.array_id, -1) for j in jobs], dtype=int), eligible=eligible,
    )
    quotas = core.Quotas(group_max_gpus=standing.max_gpus, group_max_gpu_s_30d=standing.max_gpu_s_30d,
                         group_used_gpu_s_30d=standing.used_30d_gpu_s, user_max_gpus=standing.user_max_gpus,
                         user_max_gpu_s_30d=standing.user_max_gpu_s_30d,
                         user_used_gpu_s_30d=standing.user_used_30d_gpu_s)
    return core.schedule(nodes, running_in, waiting, quotas=quotas, array_throttle=throttle), prio


def core_clock(now: dt.datetime) -> tuple[int, float]:
    return local_clock(timezone.localtime(now))


def _place_avoiding(job: Job, campus: Campus, reserved_i: int, place_on: Callable[[Job, Campus], str]) -> str:
    """``place_on`` seeing every node's free GPUs but the reserved node's (index ``reserved_i``; −1: none)."""
    if reserved_i < 0:
        return place_on(job, campus)
    kept = int(campus.free_gpus[reserved_i])
    campus.free_gpus[reserved_i] = 0
    try:
        return place_on(job, campus)
    finally:
        campus.free_gpus[reserved_i] += kept


def _place_on_node(job: Job, campus: Campus, node_pk: int, place_on: Callable[[Job, Campus], str]) -> str:
    """``place_on`` seeing only ``node_pk``'s free GPUs (the node the queue chose; its own checks still apply)."""
    i = campus.index_of[node_pk]
    saved = campus.free_gpus.copy()
    campus.free_gpus[:] = 0
    campus.free_gpus[i] = saved[i]
    try:
        return place_on(job, campus)
    finally:
        taken_here = campus.free_gpus[i]
        campus.free_gpus[:] = saved
        campus.free_gpus[i] = taken_here


def _entry_reason(core_reason: str, job: Job, standing: GroupStanding, node: str | None,
                  parents: list[int]) -> tuple[str, str]:
    """The stored reason code and its sentence (``scheduler.explain.queue_reason_words``)."""
    code = REASONS.get(core_reason, "")
    if not code:
        return "", ""
    i = standing.index[job.group_id]
    text = words.queue_reason_words(
        code, core_reason=core_reason, group=standing.names[i], max_gpus=float(standing.max_gpus[i]),
        max_gpu_hours_30d=float(standing.max_gpu_s_30d[i]) / 3600.0,
        used_gpu_hours_30d=float(standing.used_30d_gpu_s[i]) / 3600.0, node=node, parents=parents)
    return code, text[:300]


def _write_entries(jobs: list[Job], started: set[int], decision: Any, prio: Any, standing: GroupStanding,
                   campus: Campus, now: dt.datetime, waiting_for: dict[int, list[int]]) -> None:
    """Rewrite every waiting job's standing (two statements, three with a reservation to name)."""
    reserved_job = int(decision.reserved_job)
    reserved_node_pk = campus.node_pks[int(decision.reserved_node)] if int(decision.reserved_node) >= 0 else None
    name = Node.objects.filter(pk=reserved_node_pk).values_list("name", flat=True).first() if reserved_node_pk \
        else None
    entries = []
    rank = 0
    for w in decision.order:
        w = int(w)
        job = jobs[w]
        if job.pk in started:
            continue
        rank += 1
        value, class_part, fair_part, age_part = core.priority_terms_rounded(
            float(prio.value[w]), float(prio.class_part[w]), float(prio.fair_share_part[w]),
            float(prio.age_part[w]))
        est = float(decision.estimated_start_s[w])
        preempt_node = int(decision.preempt_node[w])
        mine = reserved_node_pk if w == reserved_job else (
            campus.node_pks[preempt_node] if preempt_node >= 0 else None)
        code, text = _entry_reason(str(decision.reason[w]), job, standing, name, waiting_for.get(job.pk, []))
        entries.append(QueueEntry(
            job=job, priority=value, class_term=class_part, fair_share_term=fair_part, age_term=age_part,
            rank=rank, reason=code, reason_text=text, reserved_node_id=mine,
            estimated_start_at=now + dt.timedelta(seconds=est) if np.isfinite(est) else None, computed_at=now))
    QueueEntry.objects.all().delete()
    QueueEntry.objects.bulk_create(entries)


def _preempt(job_ids: list[int]) -> list[int]:
    """Checkpoint and requeue each over-quota job through the eviction path (design §16.6); the ones started."""
    done = []
    for job_id in job_ids:
        with transaction.atomic():
            eviction = evict_job(job_id, "preempted", PREEMPT_NOTICE_S, then="requeue", announce=False)
            if eviction is not None:
                done.append(job_id)
                OverQuotaRun.objects.filter(job_id=job_id).delete()
                events.emit("job.preempted", job=job_id)
    return done


def array_counts(array: JobArray) -> dict[str, int]:
    rows = Job.objects.filter(array_task__array=array).values("state").annotate(n=Count("pk"))
    return {r["state"]: r["n"] for r in rows}
