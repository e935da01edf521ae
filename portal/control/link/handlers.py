"""What the portal does with each agent message (design §1-§4, §9.9). Called by the consumer in a worker thread.

A reliable report (with a ``msg_id``) is handled once: its :class:`ReceivedReport` row is inserted in the
handler's own transaction, so a copy the agent re-sends finds it and is answered without being handled again.
Each handler checks that the message concerns this node (its job's open placement, a transfer it is party
to) and raises :class:`RefusedError` otherwise — before changing anything. Facts are recorded here; the workflow
steps they unblock run as Celery tasks after commit.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone

from portal.control.activity import record_activity
from portal.control.config import rn
from portal.control.link import commands
from portal.control.link import output as job_output
from portal.control.link.class_samples import sample_class_bytes
from portal.control.link.protocol import (
    RESTORE_FAILED,
    CheckpointDone,
    CheckpointsDropped,
    Heartbeat,
    Hello,
    JobExited,
    JobOutputReport,
    JobStarted,
    ProtocolError,
    TransferReceived,
    TransferRejected,
    TransferSent,
    Welcome,
    held_items,
    job_gpu_util,
    pause_intervals,
)
from portal.control.models import (
    AgentSession,
    MigrationPhase,
    MigrationWork,
    ReceivedReport,
    RejectedMessage,
    Transfer,
    TransferPurpose,
    TransferState,
)
from portal.control.owner_use import hello_gpu_state, observe_gpu_state  # processes on lent GPUs (design §1)
from portal.control.progress import record_progress
from portal.control.reclaim import evict, lifecycle
from portal.control.reclaim.workflow import (
    close_placement,
    finish_started,
    forget_copies,
    job_groups,
    old_run_ended,
    open_placement,
    publish_after_commit,
    restore_failed,
    run_died,
    runtime,
)
from portal.core import events, outbox
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.lifecycle import nodes as node_lifecycle
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import BandwidthSample, Checkpoint, Gpu, Job, Node, Placement
from portal.core.models.nodes import hash_agent_token
from portal.core.outbox import Task
from portal.core.services.nodes import node_for_agent_token
from portal.notify.dispatch import observe_heartbeats  # a lent GPU its lab uses (design §12)

log = logging.getLogger(__name__)


MAX_BYTES_PER_S = 1e12  # 8 Tbit/s: a sample above any NIC is the agent's error, not a measurement


class RefusedError(Exception):
    """The message is refused (wrong node, unknown object, inconsistent data); nothing was changed."""


def authenticate(token: str) -> int | None:
    """The node id for an agent token, or None if unknown, revoked or the node is retired."""
    node = node_for_agent_token(token)
    if node is None or node.state == NodeState.RETIRED:
        return None
    return node.pk


def record_rejection(node_id: int | None, reason: str, kind: str) -> None:
    RejectedMessage.objects.create(node_id=node_id, reason=reason[:300], message_type=kind[:64])


def open_session(node_id: int, channel_name: str, remote: str) -> int:
    """Record a new session; older sessions of the node still marked open (a portal that died without closing
    them, or a connection superseded by this one) are closed, so their data addresses are never used."""
    AgentSession.objects.filter(node_id=node_id, closed_at__isnull=True).update(closed_at=timezone.now(),
                                                                               close_reason="superseded")
    return AgentSession.objects.create(node_id=node_id, channel_name=channel_name, remote_addr=remote[:64]).pk


def close_session(session_id: int | None, reason: str) -> None:
    if session_id is not None:
        AgentSession.objects.filter(pk=session_id, closed_at__isnull=True).update(closed_at=timezone.now(),
                                                                                 close_reason=reason[:200])


def _decimal(value: Any) -> Decimal:
    """A compute capability as reported (0.0-99.9); anything else (NaN, Infinity, text) counts as unknown, 0."""
    try:
        number = Decimal(str(value))
        if not number.is_finite() or not 0 <= number < 100:
            return Decimal("0")
        return number.quantize(Decimal("0.1"))
    except (InvalidOperation, ValueError):
        return Decimal("0")


def hello(node_id: int, session_id: int | None, msg: Hello) -> Welcome:
    """Agent connected: record its data address and inventory, bring the node online, reconcile jobs.

    1. Session: data address, version, edge backend.
    2. Inventory: create GPU rows the portal does not know yet (same path for NVML and simulated GPUs).
    3. Node registered/offline → online (lifecycle).
    4. Jobs the agent runs that are not placed there are stopped; jobs placed there that it no longer runs
       (agent restarted) are recovered from their replicas.
    """
    with transaction.atomic():
        AgentSession.objects.filter(pk=session_id).update(
            data_host=msg["data_host"][:255], data_port=msg["data_port"], agent_version=msg["agent_version"][:32],
            edge_backend=str(msg.get("edge_backend", ""))[:32])
        node = Node.objects.select_for_update().get(pk=node_id)
        known = {g.index: g for g in node.gpus.all()}
        unregistered = []
        for gpu in msg["gpus"][:64]:
            if not isinstance(gpu, dict) or not isinstance(gpu.get("index"), int):
                continue
            # GPUs only as the provider registered them (a node registered with none takes the agent's list).
            if known and gpu["index"] not in known:
                unregistered.append(gpu["index"])
                continue
            vram = gpu.get("vram_gb", 1)
            if not isinstance(vram, int | float) or isinstance(vram, bool) or not 0 < vram <= 1024:
                record_rejection(node_id, f"hello: GPU {gpu['index']} vram_gb {vram!r} is not in (0, 1024]",
                                 "hello")
                continue
            fields = {"model": str(gpu.get("model", ""))[:64], "uuid": str(gpu.get("uuid", ""))[:64],
                      "driver_version": str(gpu.get("driver_version", ""))[:32],
                      "cuda_version": str(gpu.get("cuda_version", ""))[:16]}
            if gpu["index"] in known:
                Gpu.objects.filter(pk=known[gpu["index"]].pk).update(
                    uuid=fields["uuid"], driver_version=fields["driver_version"], cuda_version=fields["cuda_version"])
            else:
                Gpu.objects.create(node=node, index=gpu["index"], vram_gb=max(0.5, float(vram)),
                                   compute_capability=_decimal(gpu.get("capability", 0)), **fields)
        if unregistered:
            record_rejection(node_id, f"hello: GPU index(es) {sorted(unregistered)} not registered for this node; "
                             "register them or fix the agent's inventory", "hello")
        hello_gpu_state(node_id, msg.get("gpu_state"), timezone.now())  # MIG, foreign processes (design §1)
        Node.objects.filter(pk=node_id).update(last_heartbeat_at=timezone.now(),
                                               enforcement_backend=str(msg.get("edge_backend", ""))[:32],
                                               job_confinement=msg.get("confinement", ""))
        if node.state in (NodeState.REGISTERED, NodeState.OFFLINE) and node_lifecycle.can(node, NodeState.ONLINE):
            node_lifecycle.come_online(node)
            publish_after_commit(["dashboard", f"node-{node.pk}", f"provider-{node.provider_id}"], "node.state",
                                 node_id=node.pk, state=node.state)
            events.emit("node.returned", node=node)
        reported = {int(j["job_id"]) for j in msg["jobs"]}
        placed = set(Job.objects.filter(placements__node_id=node_id, placements__ended_at__isnull=True,
                                        state__in=[JobState.RUNNING, JobState.MIGRATING, JobState.QUEUED])
                     .values_list("pk", flat=True))
        for job_id in reported - placed:
            commands.send(node_id, "stop_job", job_id=job_id, reason="not placed here")
        _runs_left(node_id, msg.get("ended_jobs"), reported)  # before the recovery measures from the progress
        lost = [j for j in placed - reported
                if Job.objects.filter(pk=j, state=JobState.RUNNING).exists()]
        if lost:
            outbox.enqueue(Task.RECOVER_LOST_JOBS, node_id, sorted(lost))
        if "checkpoints" in msg:
            held, well_formed = held_items(msg["checkpoints"])
            sync_holdings(node_id, held, complete=well_formed and not msg.get("checkpoints_truncated", False))
            _copies_arrived(node_id, held)
    node.refresh_from_db()
    # The jobs still placed here and the timeout after which the portal gives them away: an agent that has not
    # been heard for a fraction of it pauses its jobs, and after a reconnect resumes only these (design §9.10).
    return {"type": "welcome", "node_id": node_id,
            "heartbeat_interval_s": settings.RECLAIMNET["HEARTBEAT_INTERVAL_S"],
            "heartbeat_timeout_s": rn("HEARTBEAT_TIMEOUT_S"), "jobs": sorted(placed),
            "killswitch": bool(node.killswitch_engaged or node.state == NodeState.RECLAIMED)}


MAX_ENDED_JOBS = 64  # runs a hello reports as left by the agent's predecessor (the agent sends its newest 64)


def _runs_left(node_id: int, items: Any, running: set[int]) -> int:
    """A restarted agent's ``ended_jobs``: for each job its predecessor ran, the progress the job itself recorded
    (step, unix time) before it died with that agent — evidence of the steps no heartbeat reported (design §9.9,
    ``workflow.run_died``). Malformed items, jobs the agent runs and jobs never placed here are ignored.
    Returns how many were taken as evidence."""
    if not isinstance(items, list):
        return 0
    taken = 0
    for item in items[:MAX_ENDED_JOBS]:
        if not isinstance(item, dict):
            continue
        job_id, step, t = item.get("job_id"), item.get("step"), item.get("t")
        if not (_bigint(job_id) and job_id > 0 and _bigint(step) and step >= 0 and job_id not in running
                and isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t) and 0 < t < 2**33):
            continue
        job = Job.objects.filter(pk=job_id, placements__node_id=node_id).distinct().first()
        if job is not None and run_died(job, node_id, step, dt.datetime.fromtimestamp(t, tz=dt.UTC)):
            taken += 1
    if taken:
        log.info("node %s: the progress of %d run(s) its previous agent left recorded", node_id, taken)
    return taken


def _bigint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) < value < 2**63


def sync_holdings(node_id: int, held: list[dict[str, Any]], *, complete: bool) -> dict[str, int]:
    """Bring the portal's record of what ``node_id`` holds in step with the agent's own list (design §9.9).

    A checkpoint the portal counts on this node (written there or copied there) that the agent does not list
    with the recorded sha256 is gone; one it lists with the recorded sha256 that the portal did not count is a
    confirmed replica. With an incomplete list (``complete`` False) nothing is forgotten."""
    listed = {(int(h["job_id"]), int(h["sequence"])): str(h["sha256"]) for h in held}
    gone: dict[int, list[int]] = {}
    counted = set()
    rows = (Checkpoint.objects.filter(node_id=node_id) | Checkpoint.objects.filter(replica_nodes=node_id)).distinct()
    for job_id, sequence, sha in rows.values_list("job_id", "sequence", "sha256"):
        counted.add((job_id, sequence))
        if complete and listed.get((job_id, sequence)) != sha:
            gone.setdefault(job_id, []).append(sequence)
    for job_id, sequences in gone.items():
        forget_copies(job_id, node_id, sequences)
    confirmed = 0
    for (job_id, sequence), sha in listed.items():
        if (job_id, sequence) in counted:
            continue
        ckpt = Checkpoint.objects.filter(job_id=job_id, sequence=sequence, sha256=sha,
                                         completed_at__isnull=False).first()
        if ckpt is not None:
            ckpt.replica_nodes.add(node_id)
            confirmed += 1
    if gone:
        log.info("node %s no longer holds %s", node_id, gone)
    return {"forgotten": sum(len(v) for v in gone.values()), "confirmed": confirmed}


def checkpoints_dropped(node_id: int, msg: CheckpointsDropped) -> None:
    """The agent pruned, dropped or found corrupt these checkpoints: they are no longer counted on this node."""
    forget_copies(msg["job_id"], node_id, [int(s) for s in msg["sequences"][:256]])


def ack(node_id: int, msg: dict[str, Any]) -> None:
    """The agent acknowledged commands (``cmd_id``, and ``cmd_ids`` at once): they are never sent again."""
    commands.acknowledge(node_id, [msg["cmd_id"], *msg.get("cmd_ids", [])])


def _job_on_node(node_id: int, job_id: int) -> Job:
    """The job, if its open placement is on this node; otherwise the message is for another node's job."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        raise RefusedError(f"unknown job {job_id}")
    placement = open_placement(job)
    if placement is None or placement.node_id != node_id:
        raise RefusedError(f"job {job_id} is not placed on this node")
    return job


@dataclass(frozen=True)
class HeartbeatSeen:
    """One heartbeat as the consumer received it, waiting to be recorded with the others (design §9.10)."""

    node_id: int
    session_id: int | None
    token: str | None  # the session's token, re-checked when recorded (None: already authenticated now)
    received_at: dt.datetime
    msg: Heartbeat


def heartbeat(node_id: int, msg: Heartbeat) -> None:
    """One heartbeat, recorded at once (a heartbeat sent as a reliable report; the consumer batches the others)."""
    record_heartbeats([HeartbeatSeen(node_id, None, None, timezone.now(), msg)])


def _token_valid(seen: HeartbeatSeen, token_hash: str, revoked: bool, state: str) -> bool:
    if seen.token is None:
        return True
    return (not revoked and state != NodeState.RETIRED
            and secrets.compare_digest(token_hash, hash_agent_token(seen.token)))


def record_heartbeats(seen: list[HeartbeatSeen]) -> list[HeartbeatSeen]:
    """Record the heartbeats of many nodes in one transaction and a fixed number of statements (design §9.10):
    tokens re-checked (a token revoked, rotated or retired mid-session is refused), last heartbeat times, nodes
    back from offline, job progress, one egress sample per link per control period. The newest heartbeat of a
    node counts. Returns the refused ones (the consumer closes their sessions)."""
    newest: dict[int, HeartbeatSeen] = {}
    for item in seen:
        newest[item.node_id] = item
    if not newest:
        return []
    with transaction.atomic():
        rows = {pk: rest for pk, *rest in Node.objects.filter(pk__in=newest).values_list(
            "pk", "agent_token_hash", "agent_token_revoked", "state", "access_link_id")}
        refused = [h for h in newest.values() if h.node_id not in rows or not _token_valid(h, *rows[h.node_id][:3])]
        if refused:
            RejectedMessage.objects.bulk_create([RejectedMessage(node_id=h.node_id, reason="agent token revoked",
                                                                 message_type="heartbeat")
                                                 for h in refused if h.node_id in rows])
        refused_ids = {h.node_id for h in refused}
        beats = [h for h in newest.values() if h.node_id not in refused_ids]
        if not beats:
            return refused
        steps = {(h.node_id, int(j["job_id"])): int(j.get("step", 0)) for h in beats for j in h.msg["jobs"]}
        if steps:
            # Only a run the portal knows started there (running, or still checkpointing before a move): a
            # destination's report before its job_started must not overwrite the old run's last step (design §9.9).
            mine = list(Placement.objects.filter(ended_at__isnull=True, node_id__in={n for n, _ in steps},
                                                 job_id__in={j for _, j in steps})
                        .filter(Q(job__state=JobState.RUNNING)
                                | Q(job__state=JobState.MIGRATING,
                                    job__migrations__work__phase=MigrationPhase.CHECKPOINTING))
                        .values_list("node_id", "job_id").order_by().distinct())
            mine = [key for key in mine if key in steps]
            record_progress({j: (steps[(n, j)], newest[n].received_at) for n, j in mine})  # and work done
            utils = {(h.node_id, int(j["job_id"])): job_gpu_util(j) for h in beats for j in h.msg["jobs"]}
            record_activity({j: (steps[(n, j)], utils.get((n, j)), newest[n].received_at) for n, j in mine})
        _sample_egress([h for h in beats if rows[h.node_id][3]], {pk: r[3] for pk, r in rows.items()})
        sample_class_bytes(beats, {pk: r[3] for pk, r in rows.items()})  # bytes per class (design §4)
        # The utilisation proxy for owner use, for agents that do not report their GPUs' processes (design §12).
        observe_heartbeats([(h.node_id, h.msg.get("gpu_util")) for h in beats if "gpu_state" not in h.msg],
                           {pk for pk, r in rows.items() if r[2] == NodeState.ONLINE})
        # The node rows last: their locks are held only until the commit right after (a reclaim locks a node row).
        # One time for the batch: the earliest receipt in it (at most FLUSH_S before the others).
        Node.objects.filter(pk__in=[h.node_id for h in beats]).update(
            last_heartbeat_at=min(h.received_at for h in beats))
        # Processes on lent GPUs that are no borrowed job's (design §1 "Owner activity and MIG"): after the node
        # rows, so that its GPU rows are locked after them, in the order a hello locks them.
        observe_gpu_state([(h.node_id, h.msg.get("gpu_state"), h.received_at) for h in beats])
        offline = [h.node_id for h in beats if rows[h.node_id][2] == NodeState.OFFLINE]
        for node in Node.objects.filter(pk__in=offline, state=NodeState.OFFLINE):  # rare: a node coming back
            node_lifecycle.come_online(node)
    return refused


def _sample_egress(beats: list[HeartbeatSeen], link_of: dict[int, int]) -> None:
    """One egress sample per node per control period (the newest heartbeat's mean, when it is a finite rate)."""
    means = {}
    for h in beats:
        mean = h.msg["egress"].get("mean_bytes_per_s")
        if isinstance(mean, int | float) and not isinstance(mean, bool) and math.isfinite(mean) \
                and 0 <= mean <= MAX_BYTES_PER_S:
            means[h.node_id] = (h.received_at, float(mean))
    if not means:
        return
    period = dt.timedelta(seconds=settings.RECLAIMNET["CONTROL_PERIOD_S"])
    last = dict(BandwidthSample.objects.filter(node_id__in=means, resolution_s=0).values("node_id")
                .annotate(last=Max("sampled_at")).values_list("node_id", "last"))
    BandwidthSample.objects.bulk_create([
        BandwidthSample(link_id=link_of[node_id], node_id=node_id, sampled_at=at, bytes_per_s=mean)
        for node_id, (at, mean) in means.items() if last.get(node_id) is None or at - last[node_id] >= period])


def checkpoint_done(node_id: int, msg: CheckpointDone) -> None:
    """A checkpoint was completed on this node: record it, pre-sync it, or let a waiting migration move on."""

    job = _job_on_node(node_id, msg["job_id"])
    compat = msg["compat"]
    existing = Checkpoint.objects.filter(job=job, sequence=msg["sequence"]).first()
    if existing is not None and existing.sha256 != msg["sha256"]:
        raise RefusedError(f"checkpoint {msg['sequence']} of job {job.pk} already recorded with another sha256")
    if existing is None:
        existing = Checkpoint.objects.create(
            job=job, sequence=msg["sequence"], node_id=node_id, step=msg["step"], size_bytes=msg["size_bytes"],
            sha256=msg["sha256"], taken_at=dt.datetime.fromtimestamp(float(msg["taken_at"]), tz=dt.UTC),
            completed_at=timezone.now(), gpu_model=str(compat.get("gpu_model", ""))[:64],
            compute_capability=_decimal(compat["compute_capability"]) if compat.get("compute_capability") else None,
            driver_version=str(compat.get("driver_version", ""))[:32],
            cuda_version=str(compat.get("cuda_version", ""))[:16],
            framework=str(compat.get("framework", ""))[:64],
            framework_version=str(compat.get("framework_version", ""))[:32],
            # design §2 "Asynchronous snapshots" (validated by the protocol; absent from older agents)
            stall_s=msg.get("stall_s"), write_s=msg.get("write_s"), mode=msg.get("mode", ""),
        )
    # Raised only: a heartbeat may already have reported a later step of the same run (design §9.9).
    Job.objects.filter(pk=job.pk, progress_step__lt=msg["step"]).update(progress_step=msg["step"])
    publish_after_commit(job_groups(job), "checkpoint", job_id=job.pk, sequence=existing.sequence,
                         step=existing.step, final=msg["final"])
    ckpt_id = existing.pk
    if msg["final"]:
        evict.lock_for_final_checkpoint(job.pk)  # job, then its open eviction, before the work (design §15.4)
        work = MigrationWork.objects.filter(migration__job=job, phase=MigrationPhase.CHECKPOINTING).first()
        if work is not None:
            MigrationWork.objects.filter(pk=work.pk, restore_sequence__isnull=True).update(
                restore_sequence=existing.sequence, checkpointed_at=timezone.now())
            Checkpoint.objects.filter(pk=existing.pk).update(completed_at=timezone.now())
            mig_id = work.migration_id
            if evict.checkpointed(mig_id):  # an eviction's (design §15): off the node now
                return
            outbox.enqueue(Task.ADVANCE_MIGRATION, mig_id)
            return
    if job.state == JobState.RUNNING:
        outbox.enqueue(Task.PRESYNC_CHECKPOINT, ckpt_id)


def _transfer_for(node_id: int, transfer_id: str, role: str) -> Transfer:
    try:
        transfer = Transfer.objects.select_related("checkpoint").get(transfer_id=uuid.UUID(transfer_id))
    except (Transfer.DoesNotExist, ValueError):  # ValueError: not a UUID
        raise RefusedError(f"unknown transfer {transfer_id[:40]}") from None
    if getattr(transfer, f"{role}_id") != node_id:
        raise RefusedError(f"transfer {transfer_id} does not involve this node as {role}")
    return transfer


def transfer_received(node_id: int, msg: TransferReceived) -> None:
    """The receiver verified the sha256: the checkpoint has a replica here; a migration may start."""

    transfer = _transfer_for(node_id, msg["transfer_id"], "destination")
    ckpt = transfer.checkpoint
    if msg["sha256"] != ckpt.sha256 or msg["size_bytes"] != ckpt.size_bytes:
        raise RefusedError("received checkpoint does not match the recorded sha256/size")
    _copy_arrived(node_id, transfer)


def _copies_arrived(node_id: int, held: list[dict[str, Any]]) -> int:
    """Copies to this node still open whose checkpoint its agent lists with the recorded sha256 (a hello): they
    arrived, and the ``transfer_received`` died with the agent that received them (SIGKILLed before it was
    answered, design §9.9). Each is concluded as that report would have; returns how many."""
    listed = {(int(h["job_id"]), int(h["sequence"])): str(h["sha256"]) for h in held}
    arrived = 0
    for transfer in Transfer.objects.filter(destination_id=node_id, state=TransferState.ISSUED).select_related(
            "checkpoint"):
        if listed.get((transfer.job_id, transfer.checkpoint.sequence)) == transfer.checkpoint.sha256:
            arrived += _copy_arrived(node_id, transfer)
    return arrived


def _copy_arrived(node_id: int, transfer: Transfer) -> bool:
    """The copy reached ``node_id`` intact: a replica there; a pre-sync moves the job's replica, a migration
    may start. False if the transfer was concluded already."""
    ckpt = transfer.checkpoint
    if not lifecycle.finish_transfer(transfer.pk, TransferState.RECEIVED):
        return False
    ckpt.replica_nodes.add(node_id)
    # The job page's timeline says where each checkpoint is copied: let it show this copy now.
    publish_after_commit([f"job-{transfer.job_id}"], "checkpoint", job_id=transfer.job_id,
                         sequence=ckpt.sequence, copied_to=node_id)
    if transfer.purpose == TransferPurpose.PRESYNC:
        rt = runtime(transfer.job)
        rt.replica_node_id = node_id
        rt.save(update_fields=["replica_node"])
        older = Checkpoint.objects.filter(job=transfer.job, sequence__lt=ckpt.sequence - 1, replica_nodes=node_id)
        for old in older:
            old.replica_nodes.remove(node_id)
        commands.send(node_id, "drop_checkpoints", job_id=transfer.job_id, keep_from=ckpt.sequence - 1)
    if transfer.migration_id is not None:
        mig_id = transfer.migration_id
        outbox.enqueue(Task.ADVANCE_MIGRATION, mig_id)
    return True


def transfer_sent(node_id: int, msg: TransferSent) -> None:
    """The sender's report (attempts, errors); a failed planned/emergency copy sends its migration on."""

    transfer = _transfer_for(node_id, msg["transfer_id"], "source")
    errors = [str(e)[:200] for e in msg["errors"][:10]]
    Transfer.objects.filter(pk=transfer.pk).update(attempts=msg["attempts"], sender_elapsed_s=msg["elapsed_s"],
                                                   errors=(transfer.errors or []) + errors)
    if msg["ok"]:
        # The checkpoint's transfer time (design §2 "Asynchronous snapshots": P1 never plans an interval shorter
        # than it): its first successful copy's, the sender's elapsed time at the rate P3 gave it.
        Checkpoint.objects.filter(pk=transfer.checkpoint_id, transfer_s__isnull=True).update(
            transfer_s=float(msg["elapsed_s"]))
        return
    updated = lifecycle.finish_transfer(transfer.pk, TransferState.FAILED)
    if updated and transfer.migration_id is not None:
        mig_id = transfer.migration_id
        outbox.enqueue(Task.ADVANCE_MIGRATION, mig_id)


def transfer_rejected(node_id: int, msg: TransferRejected) -> None:
    transfer = _transfer_for(node_id, msg["transfer_id"], "destination")
    Transfer.objects.filter(pk=transfer.pk).update(
        errors=(transfer.errors or []) + [f"receiver: {msg['reason'][:200]}"])


def job_started(node_id: int, msg: JobStarted) -> None:
    """The agent started the job: queued/migrating → running; a migration in its last phase is done."""

    job = _job_on_node(node_id, msg["job_id"])
    job = Job.objects.select_for_update().get(pk=job.pk)
    new_run = job.state in (JobState.QUEUED, JobState.MIGRATING)
    if new_run:
        job_lifecycle.start(job)
    restored = msg.get("restored_sequence")
    restored = restored if isinstance(restored, int) and not isinstance(restored, bool) else None
    step = msg.get("restored_step")
    step = step if isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= 2**63 - 1 else None
    # An agent that says which step it restored (the key present) corrects the migration's work lost, measured
    # from the old run's last step: the progress recorded before this start (design §9.9).
    work = finish_started(job, node_id, restored, reported="restored_step" in msg, restored_step=step)
    if "restored_step" in msg:  # the new run's progress starts where it resumed (0: from the beginning)
        Job.objects.filter(pk=job.pk).update(progress_step=step or 0)
    if new_run:  # the output gets a marker line: which run, where, resumed from which step (design §9.11)
        job_output.begin_run(job.pk, node_id, restored_sequence=restored, restored_step=step)
    publish_after_commit(job_groups(job, (node_id,)), "job.state", job_id=job.pk, state=job.state, node_id=node_id)
    if work is not None:
        outbox.enqueue(Task.RELEASE_RECLAIMS)


def job_exited(node_id: int, msg: JobExited) -> None:
    """The job process ended on this node.

    A job that left for a migration (final checkpoint, kill-switch) just frees its GPUs; a running job that
    exited 0 is completed with its result; any other exit of a running job fails it.
    """
    job = Job.objects.filter(pk=msg["job_id"]).first()
    if job is None:
        raise RefusedError(f"unknown job {msg['job_id']}")
    placement = open_placement(job)
    if placement is None or placement.node_id != node_id:
        # Not (or no longer) placed here: a late report of a job we moved away; its final step is the best
        # evidence of the work the move threw away (design §9.9).
        if not job.placements.filter(node_id=node_id).exists():
            raise RefusedError(f"job {job.pk} was never placed on this node")
        if msg["reason"] != RESTORE_FAILED:
            old_run_ended(job, node_id, int(msg["step"]), _step_at(msg), _paused(msg))
        return
    job = Job.objects.select_for_update().get(pk=job.pk)
    if msg["reason"] == RESTORE_FAILED:
        seq = msg.get("restore_sequence")
        restore_failed(job, node_id, seq if isinstance(seq, int) and not isinstance(seq, bool) else None)
        job.refresh_from_db()
        publish_after_commit(job_groups(job, (node_id,)), "job.state", job_id=job.pk, state=job.state)
        return
    if job.state in (JobState.RUNNING, JobState.MIGRATING):  # the run's final step: how far it got
        Job.objects.filter(pk=job.pk, progress_step__lt=msg["step"]).update(progress_step=msg["step"])
    rt = runtime(job)
    rt.returncode = msg["returncode"]
    rt.last_step = msg["step"]
    rt.last_report_at = _step_at(msg) or timezone.now()  # the run's final step and when it got there (§9.9)
    rt.result_sha256 = str(msg["result"].get("weights_sha256", ""))[:64]
    rt.save(update_fields=["returncode", "last_step", "last_report_at", "result_sha256"])
    if job.state == JobState.RUNNING and msg["returncode"] == 0:
        close_placement(job, "completed")
        Job.objects.filter(pk=job.pk).update(progress_step=msg["step"])
        job_lifecycle.complete(job)
        events.emit("job.finished", job=job)
    elif job.state == JobState.RUNNING and not _stopped_by_us(node_id):
        close_placement(job, "failed")
        job_lifecycle.fail(job, job_output.failure_with_output(
            job.pk, f"exit code {msg['returncode']}: {msg['reason']}", msg.get("output_tail")))
        events.emit("job.failed", job=job, node=node_id, returncode=msg["returncode"])
    elif job.state == JobState.QUEUED:
        close_placement(job, "start failed")
    else:
        return
    publish_after_commit(job_groups(job, (node_id,)), "job.state", job_id=job.pk, state=job.state)


def _step_at(msg: JobExited) -> dt.datetime | None:
    """When the run reached its final step, as its progress record says (``step_at``, unix time), if plausible."""
    t = msg.get("step_at")
    if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t) or not 0 < t < 2**33:
        return None
    return dt.datetime.fromtimestamp(t, tz=dt.UTC)


def _paused(msg: JobExited) -> list[tuple[float, float]] | None:
    """When the agent had the run paused (design §9.9), if it said (checked at the boundary: ``validate``)."""
    if "paused" not in msg:
        return None
    try:
        return pause_intervals("job_exited", msg["paused"])
    except ProtocolError:
        return None


def _stopped_by_us(node_id: int) -> bool:
    node = Node.objects.get(pk=node_id)
    return node.state in (NodeState.DRAINING, NodeState.RECLAIMED) or node.killswitch_engaged


def job_output_report(node_id: int, msg: JobOutputReport) -> None:
    """New output of a job this node runs or ran: appended to the job's capped tail (design §9.11)."""
    refused = job_output.append_report(node_id, dict(msg))
    if refused is not None:
        raise RefusedError(refused)


HANDLERS: dict[str, Callable[[int, Any], None]] = {
    "heartbeat": heartbeat,
    "checkpoint_done": checkpoint_done,
    "transfer_received": transfer_received,
    "transfer_sent": transfer_sent,
    "transfer_rejected": transfer_rejected,
    "job_started": job_started,
    "job_exited": job_exited,
    "checkpoints_dropped": checkpoints_dropped,
    "job_output": job_output_report,
    "ack": ack,
}


def handle(node_id: int, kind: str, msg: dict[str, Any]) -> bool:
    """Run the handler for ``kind`` in one transaction (a RefusedError rolls everything back).

    A message with a ``msg_id`` is handled once per node: its ReceivedReport row goes in first (a twin being
    handled concurrently waits on the unique index, then finds it). Returns False for a duplicate, which is
    answered again but changes nothing."""
    fn = HANDLERS.get(kind)
    msg_id = msg.get("msg_id")
    with transaction.atomic():
        if isinstance(msg_id, str):
            try:
                with transaction.atomic():
                    ReceivedReport.objects.create(node_id=node_id, msg_id=msg_id, kind=kind[:32],
                                                  received_at=timezone.now())
            except IntegrityError:
                return False
        if fn is not None:  # killswitch_engaged: informational
            fn(node_id, msg)
    return True


def prune_received(now: dt.datetime | None = None, keep_s: float = 86400.0) -> int:
    """Forget reports handled more than ``keep_s`` ago (an agent stops re-sending long before)."""
    now = now or timezone.now()
    removed, _ = ReceivedReport.objects.filter(received_at__lt=now - dt.timedelta(seconds=keep_s)).delete()
    return removed
