"""Plan a reclaim, then apply it (design §9.2): the planner reads the campus and writes nothing.

:func:`plan_reclaim` answers, for every job on a node being reclaimed with a given notice: where it goes, at
what rate its final checkpoint may travel, by when, and what it costs —

- ``loss_free``: P2 found a destination the checkpoint reaches in time and P3 admitted its flow jointly with
  every migration already moving (C/b + T_r ≤ τ, Theorem 3); nothing is lost;
- ``from_replica``: it cannot leave in time (no notice, no destination, or P3 could not fit it), so it resumes
  from its freshest checkpoint copied off the node (pre-sync), losing the work since that checkpoint;
- ``from_scratch``: no checkpoint left the node: it restarts from the beginning.

The provider's preview (web dialog and API) and the control plane's apply step (``portal.control.reclaim.apply``)
call the same planner on the same state, so the dialog's promise is what the plan records; the shortest
loss-free notice is found by searching that same planner (:func:`shortest_loss_free_notice_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from django.utils import timezone

from portal.control.config import rn
from portal.control.models import MigrationPhase, MigrationWork
from portal.control.reserve import reserve_min_by_link
from portal.control.state import build_p2, p2_view
from portal.core import campus as campus_model
from portal.core.campus import Campus, checkpoint_size_bytes, freshest_replica
from portal.core.lifecycle.jobs import JobState
from portal.core.models import Checkpoint, Job, Migration, MigrationMode, Node
from scheduler.p2 import select_destination
from scheduler.p3 import P3Flows, admit_flows_on_paths, migration_budget_bytes_per_s

MAX_NOTICE_S = 7 * 24 * 3600.0  # a week: the longest notice a reclaim may give
NOTICE_RESOLUTION_S = 0.1  # the finest precision of the shortest loss-free notice


def display_ceiling_s(seconds: float) -> float:
    """Round a notice up to the precision the dialog shows it with (0.1 s under 10 s, 1 s under an hour, a
    minute above), so that the number a provider reads and types is never below the one computed."""
    step = NOTICE_RESOLUTION_S if seconds < 10 else (1.0 if seconds < 3600 else 60.0)
    return round(math.ceil(seconds / step - 1e-9) * step, 3)
ACTIVE_PHASES = (MigrationPhase.CHECKPOINTING, MigrationPhase.TRANSFERRING)


class Outcome(StrEnum):
    LOSS_FREE = "loss_free"
    FROM_REPLICA = "from_replica"
    FROM_SCRATCH = "from_scratch"


@dataclass(frozen=True)
class Recovery:
    """Where a job resumes when it cannot leave with a final checkpoint (design §3 degraded recovery)."""

    checkpoint: Checkpoint | None  # the freshest replica off the node; None: restart from the beginning
    holder_pk: int | None
    destination_pk: int | None  # None: it waits in the queue until placement finds room
    gpu_indices: tuple[int, ...]  # when the holder itself is the destination: the GPUs it starts on now
    rate_bytes_per_s: float | None  # the copy holder → destination (the path's migration budget)
    work_lost_s: float
    p2_request: dict[str, Any] | None
    p2_response: dict[str, Any] | None

    @property
    def outcome(self) -> Outcome:
        return Outcome.FROM_SCRATCH if self.checkpoint is None else Outcome.FROM_REPLICA


@dataclass(frozen=True)
class JobPlan:
    """One job's fate in a reclaim plan."""

    job: Job
    ckpt_bytes: float
    outcome: Outcome
    destination_pk: int | None
    rate_bytes_per_s: float | None  # loss-free: P3's rate for the final checkpoint; else the recovery copy's
    leave_s: float  # C/b + T_r: how long leaving with a final checkpoint takes at the rate it would get
    expected_loss_s: float
    reason: str  # why it is not loss-free ("" when it is)
    p2_request: dict[str, Any] | None = None  # the scheduled P2 (with the notice as deadline)
    p2_response: dict[str, Any] | None = None
    recovery: Recovery | None = None


@dataclass(frozen=True)
class ReclaimPlan:
    node_pk: int
    notice_s: float
    jobs: tuple[JobPlan, ...]
    replanned: tuple[tuple[int, float | None, float], ...] = ()  # in-flight migrations P3 re-rated
    p3_request: dict[str, Any] | None = None
    p3_response: dict[str, Any] | None = None

    @property
    def loss_free(self) -> bool:
        return all(j.outcome == Outcome.LOSS_FREE for j in self.jobs)


def migration_budget(bottleneck_bytes_per_s: float, reserve_min_bytes_per_s: float | None = None) -> float:
    """What P3 may give migrations on a path whose bottleneck has B⁻ = ``bottleneck`` (design §4 reserve):
    B⁻ − max(β·B⁻, B_min), B_min the bottleneck link's calibrated reserve (design §4.1,
    :func:`portal.control.reserve.reserve_min_by_link`) when given, else the global setting."""
    floor = rn("RESERVE_MIN_BYTES_PER_S") if reserve_min_bytes_per_s is None else reserve_min_bytes_per_s
    return float(migration_budget_bytes_per_s(bottleneck_bytes_per_s, rn("RESERVE_FRACTION"), floor))


def recovery_rate(campus: Campus, src_pk: int, dst_pk: int) -> float:
    """Recovery copies have no deadline: the migration budget of the path's nominal bottleneck (design §4)."""
    return max(1.0, migration_budget(campus.bottleneck_bytes_per_s(src_pk, dst_pk, capacity=True)))


def jobs_leaving(node_pk: int, *, scheduled: bool) -> list[Job]:
    """The jobs a reclaim of ``node_pk`` must move: those running there; with no notice also those already
    migrating off it (their final checkpoint can no longer be written)."""
    states = [JobState.RUNNING] if scheduled else [JobState.RUNNING, JobState.MIGRATING]
    return list(Job.objects.filter(placements__node_id=node_pk, placements__ended_at__isnull=True,
                                   state__in=states).order_by("pk"))


def plan_recovery(campus: Campus, job: Job, source_pk: int, lost_at: Any) -> Recovery:
    """Degraded recovery (design §3 emergency): P2 from the holder of the freshest replica off ``source_pk``
    with no notice. Takes the destination's GPUs in ``campus`` so that later decisions of the same plan see them."""
    found = freshest_replica(job, source_pk, campus.live - {source_pk})
    if found is None:
        since = job.started_at or lost_at
        return Recovery(None, None, None, (), None, max(0.0, (lost_at - since).total_seconds()), None, None)
    ckpt, holder = found
    req, view = build_p2(campus, job, source_pk, holder, ckpt.size_bytes, None, ckpt, rn("ALPHA"), rn("K_MIN"))
    response = p2_view(campus, select_destination(req))
    dest = response["destination"]
    indices: tuple[int, ...] = ()
    rate = None
    if dest is not None:
        taken = campus.take_gpus(dest, job.gpu_count)
        if dest == holder:
            indices = tuple(taken)
        else:
            rate = recovery_rate(campus, holder, dest)
    lost_s = max(0.0, (lost_at - ckpt.taken_at).total_seconds())
    return Recovery(ckpt, holder, dest, indices, rate, lost_s, view, response)


def _recovered(campus: Campus, job: Job, ckpt_bytes: float, node_pk: int, lost_at: Any, leave_s: float,
               reason: str, **p2: Any) -> JobPlan:
    rec = plan_recovery(campus, job, node_pk, lost_at)
    return JobPlan(job=job, ckpt_bytes=ckpt_bytes, outcome=rec.outcome, destination_pk=rec.destination_pk,
                   rate_bytes_per_s=rec.rate_bytes_per_s, leave_s=leave_s, expected_loss_s=rec.work_lost_s,
                   reason=reason, recovery=rec, **p2)


def inflight_flows(now: Any) -> list[tuple[Migration, float, float, float]]:
    """Planned migrations still moving, each with its bytes, the time left to its own deadline and T_r.

    Remaining bytes: the sender does not report progress, so a transfer under way counts in full — an upper
    bound, hence its r_min is never under-estimated."""
    flows = []
    for work in MigrationWork.objects.select_related("migration", "migration__reclaim", "migration__job").filter(
        phase__in=ACTIVE_PHASES, migration__mode=MigrationMode.PLANNED
    ).order_by("migration_id"):
        mig = work.migration
        if mig.destination_id is None or mig.reclaim is None:
            continue
        flows.append((mig, float(mig.bytes or mig.job.ckpt_bytes_estimate),
                      max(0.0, (mig.reclaim.deadline_at - now).total_seconds()), float(mig.job.restart_s)))
    return flows


def plan_reclaim(campus: Campus, node_pk: int, notice_s: float, *, now: Any = None, lost_at: Any = None,
                 jobs: list[Job] | None = None, sizes: dict[int, float] | None = None,
                 inflight: list[tuple[Migration, float, float, float]] | None = None) -> ReclaimPlan:
    """The plan for reclaiming ``node_pk`` with ``notice_s`` of notice (0: emergency, kill-switch, lost node).

    1. No notice: every job recovers (:func:`plan_recovery`).
    2. Otherwise P2 per job with τ = ``notice_s`` (each destination's GPUs taken for the next job's decision).
    3. P3 over the new flows and every planned migration still moving, re-planned jointly (design §4).
    4. Admitted with a destination → loss-free at P3's rate; the others give their destination back and recover.

    Reads only; the GPU bookkeeping of ``campus`` is updated (pass ``campus.scratch()`` to keep it).
    ``lost_at`` (the reclaim's request time) dates the work lost; both default to now. ``jobs``, ``sizes`` and
    ``inflight`` (what :func:`jobs_leaving`, ``checkpoint_size_bytes`` and :func:`inflight_flows` read) may be
    given by a caller that plans the same node many times.
    """
    now = now or timezone.now()
    lost_at = lost_at or now
    notice_s = max(0.0, float(notice_s))
    jobs = jobs if jobs is not None else jobs_leaving(node_pk, scheduled=notice_s > 0)
    sizes = sizes if sizes is not None else checkpoint_size_bytes(j.pk for j in jobs)
    if not jobs:
        return ReclaimPlan(node_pk, notice_s, ())
    # design §4.1: each link's stored B_min (calibrated or an admin's), else the setting; read once per plan
    link_reserve_min = reserve_min_by_link(campus.link_pks)
    node_budget = _access_budget(campus, node_pk, link_reserve_min)
    alone_s = {j.pk: (sizes[j.pk] / node_budget if node_budget > 0 else math.inf) + j.restart_s for j in jobs}
    if notice_s <= 0:
        return ReclaimPlan(node_pk, notice_s, tuple(
            _recovered(campus, j, sizes[j.pk], node_pk, lost_at, alone_s[j.pk], "no notice") for j in jobs))
    chosen: list[tuple[Job, int | None, list[int], dict[str, Any], dict[str, Any]]] = []
    for job in jobs:
        req, view = build_p2(campus, job, node_pk, node_pk, sizes[job.pk], notice_s, None, rn("ALPHA"),
                             rn("K_MIN"))
        response = p2_view(campus, select_destination(req))
        dest = response["destination"]
        taken = campus.take_gpus(dest, job.gpu_count) if dest is not None else []
        chosen.append((job, dest, taken, view, response))
    ids, sizes_b, notices, restarts, paths = [], [], [], [], []
    for job, dest, _, _, _ in chosen:
        ids.append(f"job-{job.pk}")
        sizes_b.append(sizes[job.pk])
        notices.append(notice_s if dest is not None else 0.0)
        restarts.append(float(job.restart_s))
        paths.append(campus.path_links(node_pk, dest) if dest is not None else np.zeros(0, np.int64))
    inflight = [f for f in (inflight if inflight is not None else inflight_flows(now))
                if f[0].source_id in campus.index_of
                and f[0].destination_id in campus.index_of]
    for mig, size, left_s, restart_s in inflight:
        ids.append(f"inflight-{mig.pk}")
        sizes_b.append(size)
        notices.append(left_s)
        restarts.append(restart_s)
        paths.append(campus.path_links(mig.source_id, mig.destination_id))
    flows = P3Flows(ids=tuple(ids), bytes=np.array(sizes_b), notice_s=np.array(notices),
                    restart_s=np.array(restarts), cap_bytes_per_s=np.full(len(ids), np.inf))
    decision = admit_flows_on_paths(flows, campus.link_available_bytes_per_s, paths,
                                    reserve_fraction=rn("RESERVE_FRACTION"),
                                    reserve_min_bytes_per_s=link_reserve_min)
    n = len(chosen)
    replanned: list[tuple[int, float | None, float]] = []
    kept: list[dict[str, Any]] = []
    for k, (mig, _, _, _) in enumerate(inflight, start=n):
        old = mig.assigned_rate_bytes_per_s
        if not decision.admitted[k]:  # already moving: it keeps its rate, the kill-switch at its deadline bounds it
            kept.append({"id": ids[k], "rate": old, "reason": decision.degraded_reason[k]})
            continue
        rate = max(float(decision.rate_bytes_per_s[k]), float(decision.min_rate_bytes_per_s[k]))  # Theorem 3
        if old is None or abs(rate - old) > 1e-6 * max(rate, old):
            replanned.append((mig.pk, old, rate))
    p3_request = {"links": [{"id": pk, "bytes_per_s": float(b), "reserve_min_bytes_per_s": float(r)} for pk, b, r in
                            zip(campus.link_pks, campus.link_available_bytes_per_s, link_reserve_min, strict=True)],
                  "reserve_fraction": rn("RESERVE_FRACTION"), "reserve_min_bytes_per_s": rn("RESERVE_MIN_BYTES_PER_S"),
                  "flows": [{"id": i, "bytes": s, "notice_s": t, "restart_s": r, "links": [int(x) for x in p]}
                            for i, s, t, r, p in zip(ids, sizes_b, notices, restarts, paths, strict=True)]}
    p3_response = {"admitted": [{"id": i, "min_rate": float(m), "rate": float(r)} for i, a, m, r in
                                zip(ids, decision.admitted, decision.min_rate_bytes_per_s, decision.rate_bytes_per_s,
                                    strict=True) if a],
                   "degraded": [{"id": i, "reason": why} for i, why in zip(ids, decision.degraded_reason, strict=True)
                                if why],
                   "replanned": [{"id": f"inflight-{m}", "migration": m, "old_rate": old, "rate": r}
                                 for m, old, r in replanned],
                   "inflight_kept": kept}
    planned: list[JobPlan | None] = [None] * n
    for k, (job, dest, taken, view, response) in enumerate(chosen):
        if dest is not None and decision.admitted[k]:
            rate = float(decision.rate_bytes_per_s[k])
            planned[k] = JobPlan(job=job, ckpt_bytes=sizes[job.pk], outcome=Outcome.LOSS_FREE, destination_pk=dest,
                                 rate_bytes_per_s=rate, leave_s=sizes[job.pk] / rate + job.restart_s,
                                 expected_loss_s=0.0, reason="", p2_request=view, p2_response=response)
        elif dest is not None:
            campus.give_back(dest, taken, job.gpu_count)
    for k, (job, dest, _, view, response) in enumerate(chosen):  # recoveries see the loss-free moves' GPUs
        if planned[k] is None:
            reason = "deadline" if dest is None else (decision.degraded_reason[k] or "notice")
            planned[k] = _recovered(campus, job, sizes[job.pk], node_pk, lost_at, alone_s[job.pk], reason,
                                    p2_request=view, p2_response=response)
    return ReclaimPlan(node_pk, notice_s, tuple(p for p in planned if p is not None), tuple(replanned),
                       p3_request, p3_response)


def _access_lower(campus: Campus, node_pk: int) -> float:
    """B⁻ of the node's access link (0 when the node is not in the snapshot)."""
    link = campus.access_link_of.get(node_pk)
    return 0.0 if link is None else float(campus.link_available_bytes_per_s[link])


def _access_budget(campus: Campus, node_pk: int, link_reserve_min: np.ndarray) -> float:
    """P3's migration budget on the node's access link: its B⁻ less its reserve (``link_reserve_min``: B_min per
    link of ``campus``, :func:`portal.control.reserve.reserve_min_by_link`), as P3 admits on it."""
    link = campus.access_link_of.get(node_pk)
    if link is None:
        return 0.0
    return migration_budget(float(campus.link_available_bytes_per_s[link]), float(link_reserve_min[link]))


def shortest_loss_free_notice_s(campus: Campus, node_pk: int, *, now: Any = None) -> float | None:
    """The smallest notice (rounded up by :func:`display_ceiling_s`) with which :func:`plan_reclaim` lets every job
    leave with no loss; 0 when nothing runs there; None when no notice up to a week would.

    Searched, not re-derived: double from the slowest job's C/B + T_r until the plan is loss-free, then
    bisect. More notice never hurts a job (P2 keeps every destination it had, P3's r_min only falls), so the
    threshold is one number; the value returned is always one the planner was asked about and said yes to.
    """
    now = now or timezone.now()
    jobs = jobs_leaving(node_pk, scheduled=True)
    if not jobs:
        return 0.0
    campus.hazard_per_s_by_hour  # noqa: B018 (read once, shared by every scratch copy)
    sizes = checkpoint_size_bytes(j.pk for j in jobs)
    moving = inflight_flows(now)  # read once: the search plans the same node a few dozen times

    def loss_free(notice: float) -> bool:
        return plan_reclaim(campus.scratch(), node_pk, notice, now=now, jobs=jobs, sizes=sizes,
                            inflight=moving).loss_free

    budget = _access_budget(campus, node_pk, reserve_min_by_link(campus.link_pks))
    if budget <= 0:
        return None
    high = max(NOTICE_RESOLUTION_S, max(sizes[j.pk] / budget + j.restart_s for j in jobs))
    while not loss_free(high):
        if high >= MAX_NOTICE_S:
            return None
        high = min(MAX_NOTICE_S, 2 * high)
    low = 0.0
    while high - low > NOTICE_RESOLUTION_S / 2:
        mid = (low + high) / 2
        low, high = (low, mid) if loss_free(mid) else (mid, high)
    rounded = display_ceiling_s(high)
    return rounded if loss_free(rounded) else high


def preview(node: Node, notice_s: float, *, now: Any = None) -> dict[str, Any]:
    """What reclaiming ``node`` with ``notice_s`` would do to each hosted job (the dialog's and the API's view
    of :func:`plan_reclaim`, on a fresh snapshot; writes nothing)."""
    now = now or timezone.now()
    campus = campus_model.load(now)
    plan = plan_reclaim(campus.scratch(), node.pk, notice_s, now=now)
    names = dict(Node.objects.filter(pk__in=[j.destination_pk for j in plan.jobs if j.destination_pk])
                 .values_list("pk", "name"))
    rows = []
    for jp in plan.jobs:
        rows.append({
            "job_id": jp.job.pk, "name": jp.job.name, "ckpt_bytes": int(jp.ckpt_bytes),
            "bandwidth_bytes_per_s": float(jp.ckpt_bytes / max(jp.leave_s - jp.job.restart_s, 1e-9))
            if math.isfinite(jp.leave_s) else 0.0,
            "restart_s": float(jp.job.restart_s), "leave_s": float(jp.leave_s),
            "loss_free": jp.outcome == Outcome.LOSS_FREE, "outcome": str(jp.outcome),
            "destination_id": jp.destination_pk, "destination": names.get(jp.destination_pk),
            "work_lost_s": float(jp.expected_loss_s), "reason": jp.reason,
        })
    return {"notice_s": float(notice_s), "shortest_loss_free_notice_s": shortest_loss_free_notice_s(campus, node.pk,
                                                                                                     now=now),
            "jobs": rows}
