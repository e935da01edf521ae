"""Reclaim workflows (design §1 warn → drain → force; §3 P2; §4 P3): scheduled, emergency, kill-switch, lost node.

Each entry point claims its step once by moving the reclaim's lifecycle (``portal.control.reclaim.lifecycle``:
requested → planned | recovered | forced, planned → released | forced), so a redelivered Celery task or a
concurrent tick does nothing twice, and moves nodes and jobs only through their lifecycles.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import ngettext

from portal.control.link import commands, protocol
from portal.control.models import (
    MigrationPhase,
    MigrationWork,
    ReclaimPhase,
    ReclaimWork,
    Transfer,
    TransferState,
)
from portal.control.reclaim import lifecycle
from portal.control.reclaim.plan import ACTIVE_PHASES, Outcome, ReclaimPlan, jobs_leaving, plan_reclaim
from portal.control.reclaim.workflow import (
    job_groups,
    log_decision,
    publish_after_commit,
    recover_from_replica,
)
from portal.control.state import load_campus
from portal.core import events, outbox
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.lifecycle import nodes as node_lifecycle
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import (
    Job,
    Migration,
    MigrationMode,
    Node,
    ReclaimEvent,
    ReclaimKind,
    ReclaimOutcome,
)
from portal.core.outbox import Task
from scheduler.p3 import DSCP

log = logging.getLogger(__name__)

# Reclaims with notice: planned, drained, forced at the deadline. A window-end drain (design §9.13) is one, but its
# node stays the lab's lent node: it is neither reclaimed nor kill-switched, and lends again when its next window
# opens (the campus read model keeps it out of placement meanwhile).
NOTICE_KINDS = (ReclaimKind.SCHEDULED, ReclaimKind.WINDOW)


def _jobs_on(node_id: int) -> list[Job]:
    return list(Job.objects.filter(placements__node_id=node_id, placements__ended_at__isnull=True,
                                   state__in=[JobState.RUNNING, JobState.MIGRATING]).order_by("pk"))


def _set_outcome(reclaim: ReclaimEvent, outcome: str, detail: str = "", finished: bool = False) -> None:
    fields: dict[str, object] = {"outcome": outcome, "outcome_detail": detail[:500]}
    if finished:
        fields["finished_at"] = timezone.now()
    ReclaimEvent.objects.filter(pk=reclaim.pk, finished_at__isnull=True).update(**fields)


def run_reclaim(reclaim_id: int, now: dt.datetime | None = None, kill_switch_sent: bool = False) -> str:
    """Start the workflow of a reclaim the provider requested (or a lost node), exactly once.

    ``now`` (default: the clock) is when the plan is made; the notice left is the deadline minus ``now``.
    ``kill_switch_sent``: :func:`send_kill_switch_first` has already engaged an emergency's kill-switch."""
    with transaction.atomic():
        reclaim = ReclaimEvent.objects.select_related("node").get(pk=reclaim_id)
        scheduled = reclaim.kind in NOTICE_KINDS
        target = ReclaimPhase.PLANNED if scheduled else ReclaimPhase.RECOVERED
        if not lifecycle.claim_reclaim(reclaim_id, ReclaimPhase.REQUESTED, target,
                                       deadline_at=reclaim.deadline_at if scheduled else None):
            return "already planned"
        node = reclaim.node
        result = (_plan_scheduled(reclaim, now or timezone.now()) if scheduled
                  else _emergency(reclaim, kill_switch_sent))
        # After the plan: its commands to the agent are pushed first (after-commit callbacks run in order).
        publish_after_commit(["dashboard", f"node-{node.pk}", f"provider-{node.provider_id}"], "reclaim",
                             reclaim_id=reclaim.pk, node_id=node.pk, kind=reclaim.kind, notice_s=reclaim.notice_s)
        return result


def _kills_at_once(kind: str) -> bool:
    """Reclaims whose node is the provider's at once (τ = 0). A silent node (heartbeat lost) is not the
    provider's yet: its jobs are recovered elsewhere, its agent is not told anything."""
    return kind not in NOTICE_KINDS and kind != ReclaimKind.HEARTBEAT_LOST


def send_kill_switch_first(reclaim_id: int) -> bool:
    """Engage the node's kill-switch for a still-unplanned emergency reclaim, committed on its own before the
    recovery is planned (call it outside any transaction): the provider's machine is freed in the time of one
    short transaction, not after the allocation lock and the bookkeeping (design §9.10). True if it was sent.

    A redelivered task finds the step claimed and sends nothing. One that runs again after its recovery rolled
    back sends it again while the node is still the provider's (reclaimed): the newer command supersedes the older
    if unacked, and engaging twice is harmless. A node lent again meanwhile is never switched off by a retry."""
    reclaim = ReclaimEvent.objects.filter(pk=reclaim_id).values("kind", "node_id", "finished_at").first()
    if reclaim is None or reclaim["finished_at"] is not None or not _kills_at_once(reclaim["kind"]):
        return False
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(pk=reclaim["node_id"]).values("state").first()
        if node is None or node["state"] != NodeState.RECLAIMED:
            return False  # lent again (or gone): the reclaim is history for this node
        if ReclaimWork.objects.filter(reclaim_id=reclaim_id).exclude(phase=ReclaimPhase.REQUESTED).exists():
            return False  # planned already: this is a redelivery
        commands.send(reclaim["node_id"], "killswitch", engaged=True, stop_jobs=True, reclaim_id=reclaim_id)
    return True


def _emergency(reclaim: ReclaimEvent, kill_switch_sent: bool = False) -> str:
    """τ = 0 (emergency, kill-switch, lost heartbeat): stop everything on the node now, resume every job from
    its freshest pre-synced replica as the plan says (design §1, §3)."""
    node = reclaim.node
    if _kills_at_once(reclaim.kind) and not kill_switch_sent and node.state == NodeState.RECLAIMED:
        commands.send(node.pk, "killswitch", engaged=True, stop_jobs=True, reclaim_id=reclaim.pk)
    jobs = _jobs_on(node.pk)
    moving = MigrationWork.objects.filter(migration__source=node, phase=MigrationPhase.CHECKPOINTING).exists()
    campus = load_campus() if jobs or moving else None
    if campus is not None:
        plan = plan_reclaim(campus, node.pk, 0.0, lost_at=reclaim.requested_at, jobs=jobs)
        for jp in plan.jobs:
            work = (MigrationWork.objects.select_related("migration")
                    .filter(migration__job=jp.job, phase__in=ACTIVE_PHASES).first())
            recover_from_replica(jp.job, node.pk, reclaim, reclaim.kind, work=work, recovery=jp.recovery)
    # Jobs mid-migration off this node whose checkpoint was still to be written here fall back too.
    for work in MigrationWork.objects.select_related("migration").filter(
        migration__source=node, phase=MigrationPhase.CHECKPOINTING
    ):
        job = Job.objects.get(pk=work.migration.job_id)
        recover_from_replica(job, node.pk, reclaim, reclaim.kind, work=work, campus=campus)
    _fail_transfers_of(node.pk)
    outcome = ReclaimOutcome.DEGRADED if jobs else ReclaimOutcome.COMPLETED
    _set_outcome(reclaim, outcome, ngettext("%(n)d job resumed from its pre-synced checkpoint",
                                            "%(n)d jobs resumed from their pre-synced checkpoints",
                                            len(jobs)) % {"n": len(jobs)} if jobs else "no job was running",
                 finished=True)
    events.emit("reclaim.done", reclaim=reclaim)
    events.emit("reclaim.forced", reclaim=reclaim)
    return outcome


def _fail_transfers_of(node_pk: int) -> None:
    """Copies to or from a node that is gone will never report: fail them now (once, conditional UPDATE) so
    their migrations fall back to a replica instead of waiting in ``transferring`` forever."""
    _fail_transfers(Q(source_id=node_pk) | Q(destination_id=node_pk))


def _fail_transfers(which: Q) -> int:
    """Fail the issued transfers matching ``which`` (each once, conditional UPDATE) and let their migrations
    advance after commit: a failed transfer sends the migration to degraded recovery from the replica."""
    failed_count = 0
    for transfer_pk, mig_id in Transfer.objects.filter(which, state=TransferState.ISSUED).values_list(
        "pk", "migration_id"
    ):
        failed = int(lifecycle.finish_transfer(transfer_pk, TransferState.FAILED))
        failed_count += failed
        if failed and mig_id is not None:
            outbox.enqueue(Task.ADVANCE_MIGRATION, mig_id)
    return failed_count


def expire_transfers() -> int:
    """Transfers whose sender never reported by the token's expiry (both agents may still be live: a hung or
    crashed sender process) are failed, and their migrations fall back to the replica path exactly as for a
    lost node (design §1). No new attempt can start (the receiver refuses an expired token), and a report that
    still arrives finds the transfer failed and changes nothing (the handlers update only ``issued`` rows)."""
    now = timezone.now()
    overdue = []
    for pk, expires_at, size, rate in Transfer.objects.filter(state=TransferState.ISSUED, expires_at__lt=now) \
            .values_list("pk", "expires_at", "checkpoint__size_bytes", "rate_bytes_per_s"):
        # A copy paced so slowly that it legitimately outlives the token gets twice its paced duration.
        paced_s = 2.0 * size / rate if rate else 0.0
        if expires_at + dt.timedelta(seconds=paced_s) < now:
            overdue.append(pk)
    if not overdue:
        return 0
    with transaction.atomic():
        n = _fail_transfers(Q(pk__in=overdue))
    if n:
        log.warning("%d transfer(s) expired without a report: failed, migrations fall back to replicas", n)
    return n


def _plan_scheduled(reclaim: ReclaimEvent, now: dt.datetime) -> str:
    """Scheduled reclaim: plan (``portal.control.reclaim.plan.plan_reclaim``, the preview's planner), then apply.

    1. Warn the agent (it forces locally at the deadline whatever else happens); queue the deadline.
    2. Plan with τ = the time left to the deadline; log each job's P2 and the joint P3 decision.
    3. Apply: re-rated in-flight migrations get their new rates; loss-free jobs start their final checkpoint
       (a planned migration at P3's rate); the others recover as planned.
    4. Nothing to move → release the node at once.
    """
    node = reclaim.node
    tau = max(0.0, (reclaim.deadline_at - now).total_seconds())
    if reclaim.kind != ReclaimKind.WINDOW:  # the agent would engage its kill-switch at the deadline
        # Re-sent until acked or the deadline passed; ``deadline_at`` keeps a late copy from pushing it out.
        commands.send(node.pk, "reclaim_notice", ttl_s=tau + 1.0, reclaim_id=reclaim.pk, deadline_in_s=tau,
                      deadline_at=reclaim.deadline_at.timestamp())
    outbox.enqueue(Task.ENFORCE_DEADLINE, reclaim.pk, delay_s=tau + 0.05)
    _set_outcome(reclaim, ReclaimOutcome.DRAINING)
    jobs = jobs_leaving(node.pk, scheduled=True)
    if not jobs:
        release(reclaim.pk)
        return "released"
    plan = plan_reclaim(load_campus(), node.pk, tau, now=now, lost_at=reclaim.requested_at, jobs=jobs)
    _apply_plan(reclaim, plan)
    if not MigrationWork.objects.filter(migration__reclaim=reclaim, phase__in=ACTIVE_PHASES).exists():
        release(reclaim.pk)
    return "planned"


def _apply_plan(reclaim: ReclaimEvent, plan: ReclaimPlan) -> None:
    """Write what ``plan`` decided, in the caller's transaction: decisions, rates, migrations, recoveries."""
    node = reclaim.node
    p2_ids = {jp.job.pk: log_decision("p2", jp.p2_request, jp.p2_response or {}, job=jp.job, reclaim=reclaim)
              for jp in plan.jobs if jp.p2_request is not None}
    p3_id = log_decision("p3", plan.p3_request, plan.p3_response or {}, reclaim=reclaim) if plan.p3_request else None
    _apply_replanned_rates(plan.replanned, p3_id)
    for jp in plan.jobs:
        job = jp.job
        if jp.outcome != Outcome.LOSS_FREE:
            recover_from_replica(job, node.pk, reclaim, jp.reason, recovery=jp.recovery)
            continue
        job_lifecycle.begin_migration(job)
        mig = Migration.objects.create(job=job, reclaim=reclaim, source=node, destination_id=jp.destination_pk,
                                       mode=MigrationMode.PLANNED, assigned_rate_bytes_per_s=jp.rate_bytes_per_s,
                                       dscp=DSCP["migration"], bytes=int(jp.ckpt_bytes))
        MigrationWork.objects.create(migration=mig, phase=MigrationPhase.CHECKPOINTING,
                                     requested_at=reclaim.requested_at, decided_at=timezone.now(),
                                     p2_decision_id=p2_ids.get(job.pk), p3_decision_id=p3_id)
        commands.send(node.pk, "checkpoint", ttl_s=plan.notice_s + 1.0, job_id=job.pk, final=True)
        publish_after_commit(job_groups(job, (node.pk, jp.destination_pk)), "migration", job_id=job.pk,
                             mode="planned", migration_id=mig.pk, destination=jp.destination_pk,
                             rate_bytes_per_s=jp.rate_bytes_per_s)
        events.emit("job.warned", job=job, reclaim=reclaim, destination=jp.destination_pk,
                    expected_loss_s=float(jp.expected_loss_s), leave_s=float(jp.leave_s))


def _apply_replanned_rates(changes: tuple[tuple[int, float | None, float], ...], decision_id: object) -> None:
    """Persist the re-planned rates of in-flight migrations and push them to the agents sending them.

    A migration still checkpointing has no transfer yet: its new assigned rate is what the transfer will be
    issued with. One already transferring gets its Transfer row updated and a ``set_rate`` after commit.
    """
    for mig_pk, _, rate in changes:
        mig = Migration.objects.get(pk=mig_pk)
        Migration.objects.filter(pk=mig.pk, finished_at__isnull=True).update(assigned_rate_bytes_per_s=rate)
        for transfer in Transfer.objects.filter(migration_id=mig.pk, state=TransferState.ISSUED):
            Transfer.objects.filter(pk=transfer.pk, state=TransferState.ISSUED).update(rate_bytes_per_s=rate)
            fields = protocol.set_rate_fields(str(transfer.transfer_id), rate, str(decision_id))
            commands.send(transfer.source_id, "set_rate", **fields)
        publish_after_commit(["dashboard", f"job-{mig.job_id}"], "migration", job_id=mig.job_id,
                             migration_id=mig.pk, rate_bytes_per_s=rate, replanned=True)


def draining_reclaims() -> list[int]:
    """Scheduled reclaims planned and not finished: the ones :func:`release` may finish."""
    return list(ReclaimEvent.objects.filter(kind__in=NOTICE_KINDS, finished_at__isnull=True,
                                            work__phase=ReclaimPhase.PLANNED).values_list("pk", flat=True))


def release(reclaim_id: int) -> bool:
    """The node has nothing left to send: give it back to the provider (draining → reclaimed), once. A window
    reclaim (design §9.13) only finishes: its node stays online, out of placement until its next window."""
    reclaim = ReclaimEvent.objects.select_related("node").get(pk=reclaim_id)
    if MigrationWork.objects.filter(migration__reclaim=reclaim, migration__source=reclaim.node,
                                    phase__in=ACTIVE_PHASES).exists():
        return False
    if Job.objects.filter(placements__node=reclaim.node, placements__ended_at__isnull=True,
                          state=JobState.RUNNING).exists():
        return False
    if not lifecycle.claim_reclaim(reclaim_id, ReclaimPhase.PLANNED, ReclaimPhase.RELEASED):
        return False
    node = Node.objects.select_for_update().get(pk=reclaim.node_id)
    window = reclaim.kind == ReclaimKind.WINDOW
    if not window:
        if node.state == NodeState.DRAINING:
            node_lifecycle.reclaim(node)
        commands.send(node.pk, "killswitch", engaged=True, stop_jobs=True, reclaim_id=reclaim.pk)
    degraded = Migration.objects.filter(reclaim=reclaim, mode=MigrationMode.DEGRADED).exists()
    outcome = ReclaimOutcome.DEGRADED if degraded else ReclaimOutcome.COMPLETED
    _set_outcome(reclaim, outcome, "lending window ends: node drained" if window else "node drained", finished=True)
    events.emit("reclaim.done", reclaim=reclaim)
    publish_after_commit(["dashboard", f"node-{node.pk}", f"provider-{node.provider_id}"], "node.state",
                         node_id=node.pk, state=node.state, reclaim_id=reclaim.pk, outcome=outcome)
    return True


def enforce_deadline(reclaim_id: int) -> str:
    """The provider always wins at the deadline (design §1): kill-switch on, unfinished final checkpoints fall back
    to the freshest replica, the node is reclaimed. Established transfers off the node may finish. At a lending
    window's end (kind ``window``, design §9.13) the jobs left are stopped and resume elsewhere, but the node is
    neither kill-switched nor reclaimed: it lends again when its next window opens."""
    reclaim = ReclaimEvent.objects.select_related("node").get(pk=reclaim_id)
    if reclaim.kind not in NOTICE_KINDS or reclaim.deadline_at > timezone.now():
        return "not due"
    window = reclaim.kind == ReclaimKind.WINDOW  # its jobs are stopped one by one; the node stays lent
    if reclaim.finished_at is None and not window:
        # First, outside the transaction below: should the recovery fail and roll back (and be retried by the
        # next tick), the kill-switch has still gone out at the deadline. Engaging it twice is harmless.
        commands.send(reclaim.node_id, "killswitch", engaged=True, stop_jobs=True, reclaim_id=reclaim.pk)
    with transaction.atomic():
        forced = any(lifecycle.claim_reclaim(reclaim_id, current, ReclaimPhase.FORCED)
                     for current in (ReclaimPhase.PLANNED, ReclaimPhase.REQUESTED))
        if not forced:
            return "already enforced or finished"
        node = Node.objects.select_for_update().get(pk=reclaim.node_id)
        late = list(MigrationWork.objects.select_related("migration").filter(
            migration__reclaim=reclaim, phase=MigrationPhase.CHECKPOINTING))
        campus = load_campus() if late else None
        for work in late:
            job = Job.objects.get(pk=work.migration.job_id)
            recover_from_replica(job, node.pk, reclaim, "deadline", work=work, campus=campus)
        for job in _jobs_on(node.pk):
            recover_from_replica(job, node.pk, reclaim, "deadline", campus=campus)
        if node.state == NodeState.DRAINING and not window:
            node_lifecycle.reclaim(node)
        _set_outcome(reclaim, ReclaimOutcome.FORCED, ngettext("%(n)d job not checkpointed by the deadline",
                                                              "%(n)d jobs not checkpointed by the deadline",
                                                              len(late)) % {"n": len(late)},
                     finished=True)
        events.emit("reclaim.done", reclaim=reclaim)
        events.emit("reclaim.forced", reclaim=reclaim)
        return "forced"


def node_lost(node_id: int) -> int | None:
    """Heartbeat lost for longer than the timeout: the node is offline and its jobs recover from replicas.

    Recorded as a ReclaimEvent of kind ``heartbeat_lost`` (notice 0) so it shows with the other departures.
    """
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.state == NodeState.ONLINE:
            node_lifecycle.go_offline(node)
        elif node.state == NodeState.DRAINING:
            node_lifecycle.reclaim(node)
        else:
            return None
        _fail_transfers_of(node.pk)
        events.emit("node.offline", node=node)
        events.emit("node.lost", node=node)
        if not _jobs_on(node.pk) and not MigrationWork.objects.filter(
            migration__source=node, phase=MigrationPhase.CHECKPOINTING
        ).exists():
            return None
        now = timezone.now()
        reclaim = ReclaimEvent.objects.create(node=node, kind=ReclaimKind.HEARTBEAT_LOST, notice_s=0.0,
                                              deadline_at=now + dt.timedelta(seconds=0))
        # In the same transaction: if the recovery fails, the node stays online and the next tick retries all
        # of it (a committed offline node would never be looked at again, its jobs left running nowhere).
        run_reclaim(reclaim.pk)
    return reclaim.pk
