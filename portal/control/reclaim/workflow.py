"""Migration workflow steps shared by reclaims, lost nodes and placement (design §1, §3, §4).

A migration moves through ``MigrationWork.phase``:
``checkpointing`` (planned: waiting for the final checkpoint) → ``transferring`` (checkpoint copied to the
destination, token-authorised, paced at the P3 rate) → ``starting`` (start_job sent, waiting for the agent)
→ ``done``; ``waiting`` when no destination exists yet (the job is requeued and placement resumes it).

Every function here runs inside the caller's transaction and sends agent commands only after commit.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import statistics
import uuid
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from portal.control.link import commands
from portal.control.link.publish import publish
from portal.control.models import (
    AgentSession,
    JobRuntime,
    MigrationPhase,
    MigrationWork,
    Transfer,
    TransferPurpose,
    TransferState,
    hash_transfer_token,
    new_transfer_token,
)
from portal.control.reclaim import lifecycle as migration_lifecycle
from portal.control.reclaim.plan import Recovery, plan_recovery
from portal.control.state import load_campus
from portal.core import events
from portal.core.campus import Campus
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.lifecycle.jobs import TERMINAL, JobState
from portal.core.models import (
    Checkpoint,
    DecisionLog,
    Job,
    Migration,
    MigrationMode,
    Node,
    Placement,
    ReclaimEvent,
)
from portal.queue import env as queue_env
from scheduler.p3 import DSCP

log = logging.getLogger(__name__)

TRANSFER_TOKEN_TTL_S = 600.0
DEFAULT_INTERVAL_S = 60.0
MAX_RESTORE_FAILURES = 3  # failed restores of one migration before it restarts from scratch (never a loop)


def log_decision(kind: str, request: dict[str, Any], response: dict[str, Any], *, job: Job | None = None,
                 reclaim: ReclaimEvent | None = None) -> uuid.UUID:
    """Every scheduler decision goes to the decision log with its JSON input and output (design §5)."""
    row = DecisionLog.objects.create(kind=kind, request=request, response=response, job=job, reclaim=reclaim)
    return row.decision_id


def job_groups(job: Job, node_ids: tuple[int | None, ...] = ()) -> list[str]:
    """Live-update groups interested in ``job``: the job, its research group, nodes and their providers."""
    groups = [f"job-{job.pk}", f"group-{job.group_id}", "dashboard"]
    for node_id in node_ids:
        if node_id is not None:
            groups.append(f"node-{node_id}")
            provider_id = Node.objects.filter(pk=node_id).values_list("provider_id", flat=True).first()
            if provider_id is not None:
                groups.append(f"provider-{provider_id}")
    return groups


def publish_after_commit(groups: list[str], event: str, **fields: Any) -> None:
    transaction.on_commit(lambda: publish(groups, event, **fields))


def runtime(job: Job) -> JobRuntime:
    rt, _ = JobRuntime.objects.get_or_create(job=job)
    return rt


def next_sequence(job: Job) -> int:
    return int(Checkpoint.objects.filter(job=job).aggregate(m=Max("sequence"))["m"] or 0) + 1


def open_placement(job: Job) -> Placement | None:
    return Placement.objects.filter(job=job, ended_at__isnull=True).first()


def close_placement(job: Job, reason: str) -> Placement | None:
    placement = open_placement(job)
    if placement is not None:
        Placement.objects.filter(pk=placement.pk, ended_at__isnull=True).update(ended_at=timezone.now(),
                                                                              end_reason=reason[:32])
    return placement


def data_address(node_pk: int) -> tuple[str, int] | None:
    row = (AgentSession.objects.filter(node_id=node_pk, closed_at__isnull=True, data_port__isnull=False)
           .order_by("-connected_at").values_list("data_host", "data_port").first())
    return (row[0], int(row[1])) if row else None


def limit_fields(job: Job) -> dict[str, Any]:
    """The job's own cgroup limits for its start command, only those it set (design §19.2: an absent one is the
    node's per-GPU default): ``memory_bytes`` an int, ``cpu_cores`` a float."""
    fields: dict[str, Any] = {}
    if job.memory_bytes is not None:
        fields["memory_bytes"] = int(job.memory_bytes)
    if job.cpu_cores is not None:
        fields["cpu_cores"] = float(job.cpu_cores)
    return fields


def start_on(job: Job, node_pk: int, gpu_indices: list[int], restore: Checkpoint | None, reason: str) -> None:
    """Hold the GPUs with an open placement and tell the node's agent to start (or resume) the job."""
    close_placement(job, "moved")
    Placement.objects.create(job=job, node_id=node_pk, gpu_indices=list(gpu_indices))
    interval = job.checkpoint_interval_s or (min(DEFAULT_INTERVAL_S, 2 * job.loss_budget_s)
                                             if job.loss_budget_s else DEFAULT_INTERVAL_S)
    commands.send(node_pk, "start_job", job_id=job.pk, command=job.command, gpus=list(gpu_indices),
                  interval_s=interval, next_sequence=next_sequence(job),
                  restore_sequence=restore.sequence if restore else None,
                  restore_sha256=restore.sha256 if restore else None, reason=reason,
                  # design §14: what the agent uploads to the portal (when the job ends; at each checkpoint)
                  output_dir=job.output_dir, upload_with_checkpoints=job.upload_with_checkpoints,
                  **queue_env.start_fields(job),  # design §16.6: an array task's index in its environment
                  **limit_fields(job))  # design §19.2: the job's own cgroup limits, when it has them
    publish_after_commit(job_groups(job, (node_pk,)), "job.state", job_id=job.pk, state="starting", node_id=node_pk)


def issue_transfer(ckpt: Checkpoint, source_pk: int, dest_pk: int, purpose: str, rate_bytes_per_s: float | None,
                   migration: Migration | None = None) -> Transfer | None:
    """Authorise one checkpoint copy with a fresh per-transfer token (stored hashed) and tell both agents.

    1. Create the Transfer row (token hash, rate, DSCP by class, expiry).
    2. After commit: announce it to the receiver (token, sha256, size), then order the sender to send.
    Returns None when the receiver has no live data address.
    """
    addr = data_address(dest_pk)
    if addr is None:
        return None
    token = new_transfer_token()
    transfer = Transfer.objects.create(
        job=ckpt.job, checkpoint=ckpt, migration=migration, source_id=source_pk, destination_id=dest_pk,
        purpose=purpose, token_hash=hash_transfer_token(token), rate_bytes_per_s=rate_bytes_per_s,
        dscp=DSCP.get(purpose, 0), expires_at=timezone.now() + dt.timedelta(seconds=TRANSFER_TOKEN_TTL_S),
    )
    tid = str(transfer.transfer_id)
    commands.send(dest_pk, "expect_checkpoint", transfer_id=tid, token=token, job_id=ckpt.job_id,
                  sequence=ckpt.sequence, sha256=ckpt.sha256, size_bytes=ckpt.size_bytes,
                  expires_in_s=TRANSFER_TOKEN_TTL_S)
    commands.send(source_pk, "send_checkpoint", transfer_id=tid, token=token, job_id=ckpt.job_id,
                  sequence=ckpt.sequence, dest_host=addr[0], dest_port=addr[1], rate_bytes_per_s=rate_bytes_per_s,
                  flow_class=purpose)
    return transfer


def resume_from(work: MigrationWork, ckpt: Checkpoint, holder_pk: int, dest_pk: int, *,
                gpu_indices: list[int] | tuple[int, ...], rate_bytes_per_s: float | None) -> None:
    """Move a migration whose destination is known to its next phase: start at once on ``gpu_indices`` if the
    destination holds the checkpoint, else copy it there first at ``rate_bytes_per_s`` (or the migration's
    assigned rate; EF for recovery, AF41 for planned)."""
    mig = work.migration
    job = mig.job
    Migration.objects.filter(pk=mig.pk).update(destination_id=dest_pk, checkpoint=ckpt)
    mig.destination_id = dest_pk
    work.restore_sequence = ckpt.sequence
    work.ckpt_holder_id = holder_pk
    if dest_pk == holder_pk:
        migration_lifecycle.move(work, MigrationPhase.STARTING, transferred_at=timezone.now())
        start_on(job, dest_pk, list(gpu_indices), ckpt, "resume")
        return
    purpose = TransferPurpose.MIGRATION if mig.mode == MigrationMode.PLANNED else TransferPurpose.EMERGENCY
    rate = mig.assigned_rate_bytes_per_s or rate_bytes_per_s
    migration_lifecycle.move(work, MigrationPhase.TRANSFERRING)
    if issue_transfer(ckpt, holder_pk, dest_pk, purpose, rate, migration=mig) is None:
        to_waiting(work, "destination agent has no data address")


def to_waiting(work: MigrationWork, detail: str) -> None:
    """No destination now: the job waits in the queue (degraded); placement resumes it later. The job row is
    locked before its placement is closed (the lock order of :func:`recover_from_replica`)."""
    job = Job.objects.select_for_update().get(pk=work.migration.job_id)
    close_placement(job, "requeued")
    if job.state in (JobState.RUNNING, JobState.MIGRATING):
        job_lifecycle.requeue(job)
    Migration.objects.filter(pk=work.migration_id).update(destination=None)
    migration_lifecycle.move(work, MigrationPhase.WAITING, detail=detail[:300])
    publish_after_commit(job_groups(job), "job.state", job_id=job.pk, state=job.state, detail=detail)


def recover_from_replica(job: Job, source_pk: int, reclaim: ReclaimEvent | None, reason: str,
                         work: MigrationWork | None = None, campus: Campus | None = None,
                         recovery: Recovery | None = None) -> MigrationWork | None:
    """Apply a degraded recovery (design §3 emergency), planned by ``portal.control.reclaim.plan.plan_recovery``.

    0. Lock the job row before anything of its own (the lock order :func:`portal.core.services.jobs.cancel_job`
       keeps: job, then placement; the other order deadlocks a cancel racing a kill-switch). A job that ended
       meanwhile (cancelled while its node left) is not recovered: its active migration, if any, fails; None.
    1. Stop the job on the source (if still reachable), close its placement, move it to ``migrating``.
    2. Use ``recovery`` (a reclaim plan's) or plan one now: the freshest replica off the source, P2 from its
       holder with no notice.
    3. Record the migration (degraded, work lost since that replica) and the P2 decision.
    4. Destination = holder: start at once; other destination: copy first (EF); none: wait in the queue.
    """
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state in TERMINAL:
        if work is not None and work.phase not in (MigrationPhase.DONE, MigrationPhase.FAILED):
            migration_lifecycle.move(work, MigrationPhase.FAILED, detail=f"job {job.state} during recovery")
            Migration.objects.filter(pk=work.migration_id).update(finished_at=timezone.now(), success=False)
        return None
    now = timezone.now()
    commands.send(source_pk, "stop_job", job_id=job.pk, reason=reason)
    close_placement(job, reason[:32])
    if job.state == JobState.RUNNING:
        job_lifecycle.begin_migration(job)
    requested_at = reclaim.requested_at if reclaim is not None else now
    if recovery is None:
        recovery = plan_recovery(campus or load_campus(), job, source_pk, requested_at)
    ckpt = recovery.checkpoint
    if work is None:
        mig = Migration.objects.create(job=job, reclaim=reclaim, source_id=source_pk, mode=MigrationMode.DEGRADED,
                                       degraded_reason=reason[:32], checkpoint=ckpt,
                                       work_lost_s=recovery.work_lost_s, dscp=DSCP["emergency"])
        work = MigrationWork.objects.create(migration=mig, phase=MigrationPhase.WAITING, requested_at=requested_at)
    else:
        mig = work.migration
        Migration.objects.filter(pk=mig.pk).update(mode=MigrationMode.DEGRADED, degraded_reason=reason[:32],
                                                   work_lost_s=recovery.work_lost_s, dscp=DSCP["emergency"])
        mig.mode = MigrationMode.DEGRADED
        mig.assigned_rate_bytes_per_s = None
    publish_after_commit(job_groups(job, (source_pk,)), "migration", job_id=job.pk, migration_id=mig.pk,
                         mode="degraded", reason=reason)
    events.emit("job.lost_work", job=job, migration=mig, reason=reason, from_scratch=ckpt is None)
    if ckpt is None or recovery.holder_pk is None:
        to_waiting(work, "no checkpoint copied off the node: restarting from the beginning")
        return work
    work.p2_decision_id = log_decision("p2", recovery.p2_request or {}, recovery.p2_response or {}, job=job,
                                       reclaim=reclaim)
    work.decided_at = timezone.now()
    if recovery.destination_pk is None:
        to_waiting(work, "no feasible destination")
        return work
    resume_from(work, ckpt, recovery.holder_pk, recovery.destination_pk, gpu_indices=recovery.gpu_indices,
                rate_bytes_per_s=recovery.rate_bytes_per_s)
    return work


def old_run(job: Job, node_pk: int) -> Placement | None:
    """The job's latest run on ``node_pk`` that has ended: the run a migration off that node replaced."""
    return (Placement.objects.filter(job=job, node_id=node_pk, ended_at__isnull=False)
            .order_by("-started_at", "-pk").first())


PAUSED_FACTOR = 2.0  # a stretch of a run this many times slower than its typical step held a pause (§9.10)


Pauses = Sequence[tuple[float, float]]  # when the agent had a run stopped: [start, end] unix times (§9.9)


def paused_s(paused: Pauses, start: dt.datetime, end: dt.datetime) -> float:
    """Seconds of ``paused`` within [start, end]."""
    a, b = start.timestamp(), end.timestamp()
    return sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in paused)


def seconds_per_step(job: Job, run: Placement | None, last_step: int,
                     progress: tuple[int, dt.datetime] | None = None, resumed_step: int | None = None,
                     paused: Pauses | None = None) -> float | None:
    """How long one step of ``job`` took in ``run`` (design §9.9 work lost), from the best evidence, on the run's
    own clock:

    0. when ``progress`` is known and the run's agent said when it had the run paused (``paused``, its
       job_exited), the run's own time from the mark at or below ``resumed_step`` nearest to it (the checkpoint
       it resumed from when the run wrote it, else the run's start at the step it restored,
       :func:`run_start_step`) up to ``progress``, less the time it was paused, over the steps between: the
       time the redone steps really took, however slowly (a load, a checkpoint that took seconds to write);
       with no such mark (the job resumed from older than the run's start), the rules below;
    1. when ``progress`` (a step the run reached and when: its final report, or what its restarted agent found)
       follows one of the run's checkpoints, the pace from that checkpoint to it — from the one at
       ``resumed_step`` when the run wrote it, which makes it the time the redone steps really took (the run
       may have slowed while no report reached the portal) — unless that is more than PAUSED_FACTOR times the
       typical step below: then the stretch held a pause (an agent that cannot hear the portal stops its jobs,
       §9.10), and time the job did not run is not work;
    2. else the median over consecutive pairs of the run's checkpoints (taken_at against step), when it wrote
       two: a pause inflates only the pair it falls in, and the median ignores it;
    3. else the median over consecutive checkpoints written by one run of the job (never a pair spanning a
       move: its time includes the downtime);
    4. else the run's duration over the steps it made, from the checkpoint it resumed (step 0 if none), up to
       ``progress`` when known — never to the end of its placement, which outlives a run that died with its
       agent by the time the portal took to notice.
    Without ``paused`` (an older agent; a run that died with its agent) a stretch that slow cannot be told from
    a pause, hence the factor in 1. None when nothing tells. ``progress`` outside the run is ignored."""
    points = list(Checkpoint.objects.filter(job=job).order_by("sequence").values_list("step", "taken_at"))
    if run is not None:
        ended = run.ended_at or timezone.now()
        mine = sorted((t, s) for s, t in points if run.started_at <= t <= ended)
        own = [(b[0] - a[0]).total_seconds() / (b[1] - a[1]) for a, b in itertools.pairwise(mine) if b[1] > a[1]]
        typical = statistics.median(own) if own else None
        if progress is not None and not run.started_at <= progress[1] <= ended:
            progress = None
        if progress is not None and paused is not None:
            start_step = run_start_step(job, run)
            start = [] if start_step is None else [(run.started_at, start_step)]
            marks = [(t, s) for t, s in [*start, *mine] if s < progress[0] and t <= progress[1]]
            # Only a mark at or below the step resumed from measures the redone steps alone; a run that resumed
            # from an older checkpoint than its own start redid an earlier run's steps too: the rules below.
            covering = [m for m in marks if resumed_step is None or m[1] <= resumed_step]
            if covering:
                since, step = max(covering, key=lambda m: (m[1], m[0]))
                ran_s = (progress[1] - since).total_seconds() - paused_s(paused, since, progress[1])
                if ran_s > 0:
                    return ran_s / (progress[0] - step)
        anchors = [(t, s) for t, s in mine if progress is not None and s < progress[0] and t < progress[1]]
        anchor = ([a for a in anchors if a[1] == resumed_step] or anchors or [None])[-1]
        if progress is not None and anchor is not None:
            pace = (progress[1] - anchor[0]).total_seconds() / (progress[0] - anchor[1])
            if typical is None or pace <= PAUSED_FACTOR * typical:
                return pace
        if typical is not None:
            return typical
    now = timezone.now()
    ratios = []
    for started, ended in Placement.objects.filter(job=job).values_list("started_at", "ended_at"):
        inside = sorted((t, s) for s, t in points if started <= t <= (ended or now))
        ratios += [(b[0] - a[0]).total_seconds() / (b[1] - a[1]) for a, b in itertools.pairwise(inside)
                   if b[1] > a[1] and b[0] > a[0]]
    if ratios:
        return statistics.median(ratios)
    if run is None:
        return None
    before = [s for s, t in points if t <= run.started_at]
    first_step = max(before) if before else 0
    end_step, end_at = progress if progress is not None else (last_step, run.ended_at or timezone.now())
    if end_step <= first_step:
        return None
    return (end_at - run.started_at).total_seconds() / (end_step - first_step)


def run_start_step(job: Job, run: Placement) -> int | None:
    """The step ``run`` started from: the checkpoint restored by the migration onto its node (0: a fresh
    start), 0 for the job's first run; None when the portal cannot tell (a restart with no migration row)."""
    mig = (Migration.objects.select_related("checkpoint")
           .filter(job=job, destination_id=run.node_id, started_at__lte=run.started_at)
           .order_by("-started_at", "-pk").first())
    if mig is not None:
        return mig.checkpoint.step if mig.checkpoint is not None else 0
    return None if Placement.objects.filter(job=job, started_at__lt=run.started_at).exists() else 0


def run_progress(job: Job, run: Placement | None) -> tuple[int, dt.datetime] | None:
    """The newest step ``run`` is known to have reached with its time (``JobRuntime.last_step`` at
    ``last_report_at``: a final report, or what its restarted agent found), when that report is of this run."""
    if run is None:
        return None
    row = JobRuntime.objects.filter(job=job).values_list("last_step", "last_report_at").first()
    if row is None or row[1] is None or not run.started_at <= row[1] <= (run.ended_at or timezone.now()):
        return None
    return int(row[0]), row[1]


def measured_work_lost_s(job: Job, source_pk: int, resumed_step: int, last_step: int,
                         progress: tuple[int, dt.datetime] | None = None,
                         paused: Pauses | None = None) -> float | None:
    """Work lost as progress thrown away (design §9.9): (the last step the run on ``source_pk`` executed − the
    step the job resumed from) × that run's seconds per step. ``last_step`` is the portal's best evidence (the
    run's final report, else its last progress report), raised to the newest checkpoint the run wrote.
    ``progress``: a step the run reached and when (default: the job's runtime record, if of this run);
    ``paused``: when the run's agent had it paused, with ``progress`` (its job_exited). None when the step time
    is unknown."""
    run = old_run(job, source_pk)
    if run is not None:
        ended = run.ended_at or timezone.now()
        written = Checkpoint.objects.filter(job=job, taken_at__gte=run.started_at, taken_at__lte=ended).aggregate(
            m=Max("step"))["m"]
        last_step = max(last_step, int(written or 0))
        progress = progress or run_progress(job, run)
    steps = max(0, last_step - resumed_step)
    if steps == 0:
        return 0.0
    per_step_s = seconds_per_step(job, run, last_step, progress, resumed_step, paused)
    return None if per_step_s is None else steps * per_step_s


def run_died(job: Job, node_pk: int, last_step: int, last_at: dt.datetime) -> bool:
    """The run of ``job`` on ``node_pk`` died with its agent: its restarted agent found that it had got to
    ``last_step`` at ``last_at`` (the job's own progress record, design §9.9). A SIGKILLed agent never reports
    the steps its jobs made after the last heartbeat the portal recorded (a heartbeat interval; a whole outage
    when the portal could not be reached); this is the evidence of them. For a run still placed there the step
    raises the job's progress and is kept with its time (the restart elsewhere measures from both); for a run
    the job has left it corrects the migration off that node like a late ``job_exited``. A record older than
    the run (a file an earlier run on the node left), or a run the portal does not know started (as for a
    heartbeat's progress), is not evidence of it: False, nothing changed."""
    placement = open_placement(job)
    if placement is not None and placement.node_id == node_pk:
        started = job.state == JobState.RUNNING or (job.state == JobState.MIGRATING and MigrationWork.objects.filter(
            migration__job=job, phase=MigrationPhase.CHECKPOINTING).exists())
        if not started or last_at < placement.started_at:
            return False
        Job.objects.filter(pk=job.pk, progress_step__lt=last_step).update(progress_step=last_step)
        JobRuntime.objects.update_or_create(job=job, defaults={"last_step": last_step, "last_report_at": last_at})
        return True
    run = old_run(job, node_pk)
    if run is None or last_at < run.started_at:
        return False
    old_run_ended(job, node_pk, last_step, last_at)
    return True


def old_run_ended(job: Job, node_pk: int, last_step: int, last_at: dt.datetime | None = None,
                  paused: Pauses | None = None) -> None:
    """The run of ``job`` on ``node_pk`` reported its final step after the job left that node (a ``job_exited``
    that arrives late, e.g. once a cut healed): the best evidence of how far it got (design §9.9). The
    migration off that node is corrected: once finished, its work lost is raised to what this step shows; before
    that, the step is kept as the job's progress, which the start on the destination measures from.
    ``last_at``: when the run was at that step, if known (kept with it, for the run's seconds per step);
    ``paused``: when its agent had the run paused, if it said (measured against, for a finished migration)."""
    mig = (Migration.objects.select_related("checkpoint").filter(job=job, source_id=node_pk)
           .order_by("-started_at", "-pk").first())
    if mig is None:
        return
    progress = (last_step, last_at) if last_at is not None else None
    if mig.finished_at is None:
        Job.objects.filter(pk=job.pk, progress_step__lt=last_step).exclude(state=JobState.RUNNING).update(
            progress_step=last_step)
        if last_at is not None:
            JobRuntime.objects.update_or_create(job=job, defaults={"last_step": last_step, "last_report_at": last_at})
        return
    resumed = mig.checkpoint.step if mig.checkpoint is not None else 0
    lost_s = measured_work_lost_s(job, node_pk, resumed, last_step, progress, paused if progress else None)
    if lost_s is not None and lost_s > mig.work_lost_s:
        Migration.objects.filter(pk=mig.pk).update(work_lost_s=lost_s)


def advance(migration_id: int) -> str:
    """Drive one migration to its next phase from the facts recorded by the handlers (idempotent).

    1. Lock the MigrationWork row.
    2. checkpointing + final checkpoint known → issue the transfer source → destination.
    3. transferring + transfer received → start on the destination; transfer failed → degraded recovery.
    """
    with transaction.atomic():
        work = MigrationWork.objects.select_for_update().select_related("migration").get(migration_id=migration_id)
        mig = work.migration
        job = Job.objects.get(pk=mig.job_id)
        if job.state in TERMINAL and work.phase not in (MigrationPhase.DONE, MigrationPhase.FAILED):
            # Cancelled (or failed) while moving: stop here, free whatever the destination holds.
            close_placement(job, "cancelled")
            migration_lifecycle.move(work, MigrationPhase.FAILED, detail=f"job {job.state} during migration")
            Migration.objects.filter(pk=mig.pk).update(finished_at=timezone.now(), success=False)
            return work.phase
        if work.phase == MigrationPhase.CHECKPOINTING and work.restore_sequence is not None:
            ckpt = Checkpoint.objects.get(job=job, sequence=work.restore_sequence)
            if mig.destination_id is None:
                return work.phase
            close_placement(job, "migrated")
            resume_from(work, ckpt, mig.source_id, mig.destination_id, gpu_indices=(),
                        rate_bytes_per_s=mig.assigned_rate_bytes_per_s)
        elif work.phase == MigrationPhase.TRANSFERRING:
            transfer = Transfer.objects.filter(migration=mig).order_by("-created_at").first()
            if transfer is None:
                return work.phase
            if transfer.state == TransferState.RECEIVED:
                migration_lifecycle.move(work, MigrationPhase.STARTING,
                                         transferred_at=transfer.finished_at or timezone.now())
                campus = load_campus()
                # The migration's reservation is out of free_gpus already; its GPUs are the first idle ones.
                free = campus.idle_indices(mig.destination_id)
                start_on(job, mig.destination_id, free[: job.gpu_count], transfer.checkpoint, "migrated")
            elif transfer.state == TransferState.FAILED:
                recover_from_replica(job, mig.source_id, mig.reclaim, "transfer failed", work=work)
        return work.phase


def forget_copies(job_id: int, node_pk: int, sequences: list[int]) -> int:
    """``node_pk`` no longer holds these checkpoints of the job (it pruned them, dropped them or found them
    corrupt): placement and recovery stop counting on them (design §9.9: only confirmed copies are used). The
    writer's own copy is the checkpoint's ``node``, cleared here; replicas are ``replica_nodes``."""
    rows = list(Checkpoint.objects.filter(job_id=job_id, sequence__in=sequences))
    for ckpt in rows:
        ckpt.replica_nodes.remove(node_pk)
    Checkpoint.objects.filter(pk__in=[c.pk for c in rows], node_id=node_pk).update(node=None)
    return len(rows)


def restore_failed(job: Job, node_pk: int, sequence: int | None) -> MigrationWork | None:
    """The destination could not restore the checkpoint it was told to (missing or corrupt there).

    1. That copy is gone: forget it.
    2. The migration starting there goes back to placement (``waiting``), one more restore failure counted;
       placement then resumes from the next confirmed copy, or from scratch once none is left or after
       MAX_RESTORE_FAILURES — never the same copy again, never a loop.
    """
    work = (MigrationWork.objects.select_for_update().select_related("migration")
            .filter(migration__job=job, phase=MigrationPhase.STARTING).first())
    sequence = sequence if sequence is not None else (work.restore_sequence if work is not None else None)
    if sequence is not None:
        forget_copies(job.pk, node_pk, [sequence])
    if work is None:
        return None
    MigrationWork.objects.filter(pk=work.pk).update(restore_failures=F("restore_failures") + 1)
    work.restore_failures += 1
    close_placement(job, "restore failed")
    to_waiting(work, f"checkpoint {sequence} missing or corrupt on node {node_pk}: trying the next copy")
    return work


def finish_started(job: Job, node_pk: int, restored_sequence: int | None = None, *,
                   reported: bool = False, restored_step: int | None = None) -> MigrationWork | None:
    """The destination agent started the job: close the migration (downtime, success).

    ``reported``: the agent said which checkpoint it restored (``restored_sequence`` at ``restored_step``; None
    for none). Work lost is then recorded as measured, whatever was planned (design §9.9): the steps between
    the one resumed and the last one the old run executed (``job.progress_step`` as it stood before this start),
    at the old run's seconds per step."""
    work = (MigrationWork.objects.select_for_update().select_related("migration")
            .filter(migration__job=job, phase=MigrationPhase.STARTING).first())
    if work is None:
        return None
    now = timezone.now()
    lost: dict[str, float] = {}
    if reported:
        if restored_step is None and restored_sequence is not None:
            restored_step = Checkpoint.objects.filter(job=job, sequence=restored_sequence).values_list(
                "step", flat=True).first()
        lost_s = measured_work_lost_s(job, work.migration.source_id, int(restored_step or 0),
                                      int(job.progress_step))
        if lost_s is not None:
            lost["work_lost_s"] = lost_s
    migration_lifecycle.move(work, MigrationPhase.DONE, resumed_at=now)
    downtime = (now - work.requested_at).total_seconds()
    Migration.objects.filter(pk=work.migration_id).update(finished_at=now, success=True, downtime_s=downtime,
                                                          destination_id=node_pk, **lost)
    publish_after_commit(job_groups(job, (work.migration.source_id, node_pk)), "migration", job_id=job.pk,
                         migration_id=work.migration_id, state="done", destination=node_pk, downtime_s=downtime)
    events.emit("job.moved", job=job, migration=work.migration_id)
    return work
