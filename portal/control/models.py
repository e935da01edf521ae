"""Control-plane state kept beside the core model (design §1-§4): agent sessions, transfers, migration progress.

Nothing here is a lifecycle state of a core object: jobs and nodes move only through ``portal.core.lifecycle``.
These rows record what the control plane asked agents to do and what they reported, so every task can re-read
them and act idempotently.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid

from django.core.validators import MinValueValidator
from django.db import models


class AgentSession(models.Model):
    """One websocket connection of a node agent."""

    node = models.ForeignKey("core.Node", on_delete=models.CASCADE, related_name="agent_sessions")
    channel_name = models.CharField(max_length=200)
    connected_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    close_reason = models.CharField(max_length=200, blank=True, default="")
    agent_version = models.CharField(max_length=32, blank=True, default="")
    data_host = models.CharField(max_length=255, blank=True, default="")
    data_port = models.PositiveIntegerField(null=True, blank=True)
    edge_backend = models.CharField(max_length=32, blank=True, default="")
    remote_addr = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["-connected_at", "-id"]
        indexes = [models.Index(fields=["node", "closed_at"])]

    def __str__(self) -> str:
        return f"agent session {self.pk} of node {self.node_id}"


class TransferPurpose(models.TextChoices):
    PRESYNC = "presync", "checkpoint pre-sync (CS1)"
    MIGRATION = "migration", "planned migration (AF41)"
    EMERGENCY = "emergency", "emergency recovery (EF)"


class TransferState(models.TextChoices):
    ISSUED = "issued", "issued"
    RECEIVED = "received", "received and verified"
    FAILED = "failed", "failed"


def new_transfer_token() -> str:
    return "rnt_" + secrets.token_urlsafe(24)


def hash_transfer_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Transfer(models.Model):
    """One agent-to-agent checkpoint copy, authorised by a per-transfer token (stored hashed)."""

    transfer_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    job = models.ForeignKey("core.Job", on_delete=models.CASCADE, related_name="transfers")
    checkpoint = models.ForeignKey("core.Checkpoint", on_delete=models.CASCADE, related_name="transfers")
    migration = models.ForeignKey(
        "core.Migration", null=True, blank=True, on_delete=models.SET_NULL, related_name="transfers"
    )
    source = models.ForeignKey("core.Node", on_delete=models.CASCADE, related_name="transfers_out")
    destination = models.ForeignKey("core.Node", on_delete=models.CASCADE, related_name="transfers_in")
    purpose = models.CharField(max_length=16, choices=TransferPurpose.choices)
    token_hash = models.CharField(max_length=64)
    rate_bytes_per_s = models.FloatField(null=True, blank=True)
    dscp = models.PositiveSmallIntegerField(default=0)
    state = models.CharField(max_length=16, choices=TransferState.choices, default=TransferState.ISSUED)
    attempts = models.PositiveIntegerField(default=0)
    errors = models.JSONField(default=list, blank=True)
    sender_elapsed_s = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "purpose"])]

    def __str__(self) -> str:
        return f"{self.purpose} transfer {self.transfer_id}"


class MigrationPhase(models.TextChoices):
    CHECKPOINTING = "checkpointing", "waiting for the final checkpoint"
    WAITING = "waiting", "waiting for a destination"
    TRANSFERRING = "transferring", "moving the checkpoint"
    STARTING = "starting", "starting on the destination"
    DONE = "done", "done"
    FAILED = "failed", "failed"


class MigrationWork(models.Model):
    """Progress of one core ``Migration`` through warn → final checkpoint → transfer → resume (design §1).

    The timestamps split the downtime into decision, checkpoint, transfer and restart (benchmark).
    """

    migration = models.OneToOneField("core.Migration", on_delete=models.CASCADE, related_name="work")
    phase = models.CharField(max_length=16, choices=MigrationPhase.choices)
    restore_sequence = models.PositiveIntegerField(null=True, blank=True)
    ckpt_holder = models.ForeignKey("core.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    p2_decision_id = models.UUIDField(null=True, blank=True)
    p3_decision_id = models.UUIDField(null=True, blank=True)
    requested_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    checkpointed_at = models.DateTimeField(null=True, blank=True)
    transferred_at = models.DateTimeField(null=True, blank=True)
    resumed_at = models.DateTimeField(null=True, blank=True)
    detail = models.CharField(max_length=300, blank=True, default="")
    # Kept by portal.control.reclaim.lifecycle on every move: when the phase began, by when it should be left (None:
    # another deadline governs it, e.g. the reclaim's or the transfer token's), and how often it was re-entered.
    phase_entered_at = models.DateTimeField(null=True, blank=True)
    phase_deadline_at = models.DateTimeField(null=True, blank=True)
    phase_attempts = models.PositiveIntegerField(default=0)
    # Starts that failed because the destination did not hold the checkpoint to restore: each marks that copy
    # gone and sends the migration back to placement; past MAX_RESTORE_FAILURES it restarts from scratch.
    restore_failures = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-requested_at", "-id"]
        verbose_name = "migration workflow"
        verbose_name_plural = "migration workflows"

    def __str__(self) -> str:
        return f"migration {self.migration_id}: {self.phase}"


class JobRuntime(models.Model):
    """What the agents last reported about a job, and its pre-sync holder."""

    job = models.OneToOneField("core.Job", on_delete=models.CASCADE, related_name="runtime")
    replica_node = models.ForeignKey("core.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    last_step = models.BigIntegerField(default=0)
    last_report_at = models.DateTimeField(null=True, blank=True)
    result_sha256 = models.CharField(max_length=64, blank=True, default="")
    returncode = models.IntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"runtime of job {self.job_id}"


class EstimatorSnapshot(models.Model):
    """The estimators' state at ``until``, shared by every worker (design §2 estimators, §9.5).

    The estimates are a function of the recorded history (departures, node availability, bandwidth samples):
    a worker loads the newest snapshot, replays what was recorded after ``until`` and, now and then, stores a
    newer one. ``arrays`` is a compressed ``numpy.savez`` of the hazard and bandwidth estimators' arrays and of
    what was last written to the estimate tables; ``nodes``/``links`` name the order of their rows.
    """

    key = models.CharField(max_length=32, primary_key=True, default="campus")
    until = models.DateTimeField()
    nodes = models.JSONField(default=list, help_text="[[node pk, provider pk], ...] in array order")
    links = models.JSONField(default=list, help_text="[[link pk, capacity], ...] in array order")
    layout_digest = models.CharField(max_length=64, default="", help_text="sha256 of nodes and links")
    arrays = models.BinaryField()
    hazard_written_at = models.DateTimeField(null=True, blank=True)
    saved_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"estimator snapshot {self.key} at {self.until:%Y-%m-%d %H:%M:%S}"


class ReclaimPhase(models.TextChoices):
    REQUESTED = "requested", "requested, not planned yet"
    PLANNED = "planned", "planned: final checkpoints under way until the deadline"
    RECOVERED = "recovered", "no notice: jobs resumed from their replicas"
    RELEASED = "released", "drained and given back before the deadline"
    FORCED = "forced", "given back at the deadline, unfinished jobs from their replicas"


class ReclaimWork(models.Model):
    """The control plane's progress on one reclaim, moved only by ``portal.control.reclaim.lifecycle`` (each move a
    conditional UPDATE, so a redelivered task or a concurrent tick never does a step twice)."""

    reclaim = models.OneToOneField("core.ReclaimEvent", on_delete=models.CASCADE, related_name="work")
    phase = models.CharField(max_length=16, choices=ReclaimPhase.choices, default=ReclaimPhase.REQUESTED)
    phase_entered_at = models.DateTimeField(null=True, blank=True)
    phase_deadline_at = models.DateTimeField(null=True, blank=True)
    phase_attempts = models.PositiveIntegerField(default=0)
    planned_at = models.DateTimeField(null=True, blank=True)
    forced_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "reclaim workflow"
        verbose_name_plural = "reclaim workflows"

    def __str__(self) -> str:
        return f"work of reclaim {self.reclaim_id}"


class RejectedMessage(models.Model):
    """A websocket message refused by the consumer, with the reason (design §1 identity; refusal audit)."""

    node = models.ForeignKey("core.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    reason = models.CharField(max_length=300)
    message_type = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"refused {self.message_type or 'message'} from node {self.node_id}: {self.reason}"


class AgentCommand(models.Model):
    """One command to a node agent, kept until the agent acknowledges it (design §9.9).

    Written in the caller's transaction, pushed after commit, marked acked when the agent's ``ack`` arrives;
    re-sent on the agent's reconnect and by the reconciler until acked, superseded or expired. A command with a
    ``supersede_key`` (its subject: a node's kill-switch state or reclaim notice, a job's interval or start, a
    transfer's rate) replaces every older unacked command of the same key, which is never sent
    again.
    """

    node = models.ForeignKey("core.Node", on_delete=models.CASCADE, related_name="+")
    cmd_id = models.CharField(max_length=32, unique=True)
    kind = models.CharField(max_length=32)
    payload = models.JSONField()
    supersede_key = models.CharField(max_length=96, blank=True, default="")
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=1)
    next_send_at = models.DateTimeField()
    acked_at = models.DateTimeField(null=True, blank=True)
    superseded_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["node", "created_at"], name="agentcmd_pending_by_node",
                         condition=models.Q(acked_at__isnull=True, superseded_at__isnull=True)),
            models.Index(fields=["next_send_at"], name="agentcmd_pending_due",
                         condition=models.Q(acked_at__isnull=True, superseded_at__isnull=True)),
            models.Index(fields=["supersede_key"], name="agentcmd_pending_key",
                         condition=models.Q(acked_at__isnull=True, superseded_at__isnull=True)),
            models.Index(fields=["expires_at"], name="agentcmd_expiry"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.cmd_id} to node {self.node_id}"


class ReceivedReport(models.Model):
    """A reliable agent report the portal has handled (design §9.9): inserted in the handler's transaction, so
    a report re-sent by the agent is answered again but never handled twice. Pruned after a day."""

    node = models.ForeignKey("core.Node", on_delete=models.CASCADE, related_name="+")
    msg_id = models.CharField(max_length=64)
    kind = models.CharField(max_length=32)
    received_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "msg_id"], name="received_report_once")]

    def __str__(self) -> str:
        return f"{self.kind} {self.msg_id} from node {self.node_id}"


class LinkCounter(models.Model):
    """A campus-wide count of agent-link events (unauthenticated attempts, dropped messages), added to by each
    portal process every few seconds instead of one row per event (design §9.9); ``/metrics`` reports them."""

    name = models.CharField(max_length=64, primary_key=True)
    value = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} = {self.value}"


class LinkServer(models.Model):
    """One agent-link server process (a daphne), beating every few seconds while it can serve agents: its
    channel layer answers and it can write here, on the thread that records heartbeats (design §9.10).

    ``serving_since`` is when its current uninterrupted run of beats began: set at its first beat, and again after
    a beat that came late (the process stalled, the database was down) or after it failed to record an agent's
    message. The tick judges heartbeat silence only over time the link was serving."""

    name = models.CharField(max_length=120, primary_key=True)  # host:pid:random, one per process start
    started_at = models.DateTimeField()
    serving_since = models.DateTimeField()
    alive_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"link server {self.name} (serving since {self.serving_since:%H:%M:%S})"


# --- loans: the ladder, the idle watchdog and the loan timer (design §15) --------------------------------------


class LoanEnd(models.TextChoices):
    """Where a job goes when its loan runs out (design §15)."""

    SUSPEND = "suspend", "suspended until its owner resumes it"
    REQUEUE = "requeue", "put back in the queue"


class ClassPolicy(models.Model):
    """One rung of the ladder (design §15): what a job of this priority class may borrow and for how long.

    Read only through :func:`portal.control.loans_policy.class_policies` (cached per tick and per request).
    The migration that creates the table seeds one row per class; admins edit them in the Django admin.
    """

    priority_class = models.CharField(max_length=16, unique=True, choices=[
        ("interactive", "interactive"), ("standard", "standard"), ("best_effort", "best effort")])
    rank = models.PositiveSmallIntegerField(default=0, help_text="order on the ladder (0 first)")
    summary = models.CharField(max_length=200, blank=True, default="", help_text="what the class is for")
    max_gpus_per_job = models.PositiveSmallIntegerField(null=True, blank=True,
                                                        help_text="GPUs one job may borrow (empty: no limit)")
    max_loan_s = models.FloatField(null=True, blank=True, validators=[MinValueValidator(60)],
                                   help_text="seconds a job may hold its GPUs per loan (empty: no limit)")
    loan_end = models.CharField(max_length=8, choices=LoanEnd.choices, default=LoanEnd.SUSPEND,
                                help_text="what happens to a job whose loan ran out")
    idle_watch = models.BooleanField(default=True, help_text="the idle watchdog may release its jobs")
    idle_limit_s = models.FloatField(default=1800.0, validators=[MinValueValidator(60)],
                                     help_text="seconds with no GPU use and no progress before the warning")
    notice_s = models.FloatField(default=600.0, validators=[MinValueValidator(0)],
                                 help_text="seconds between the warning and the release")
    grace_s = models.FloatField(default=120.0, validators=[MinValueValidator(0)],
                                help_text="seconds the job gets to write its final checkpoint when released")

    class Meta:
        ordering = ["rank", "priority_class"]
        verbose_name = "class policy"
        verbose_name_plural = "class policies"

    def __str__(self) -> str:
        return f"policy of {self.get_priority_class_display()}"


class JobActivity(models.Model):
    """What the watchdog and the loan timer know of one job (design §15), written with the heartbeats in a fixed
    number of statements (``portal.control.activity.record_activity``)."""

    job = models.OneToOneField("core.Job", on_delete=models.CASCADE, primary_key=True, related_name="activity")
    gpu_util_pct = models.FloatField(null=True, blank=True, help_text="newest report: mean over its GPUs")
    step = models.BigIntegerField(default=0, help_text="the step at the newest report")
    reported_at = models.DateTimeField(null=True, blank=True)
    busy_at = models.DateTimeField(null=True, blank=True, help_text="last time it showed use")
    held_s = models.FloatField(default=0.0, help_text="seconds it has held its GPUs in this loan")
    warning = models.CharField(max_length=8, blank=True, default="", help_text="'idle' or 'loan' when warned")
    warned_at = models.DateTimeField(null=True, blank=True)
    release_at = models.DateTimeField(null=True, blank=True, help_text="when the warned release is due")

    class Meta:
        verbose_name = "job activity"
        verbose_name_plural = "job activities"

    def __str__(self) -> str:
        return f"activity of job {self.job_id}"


class EvictionPhase(models.TextChoices):
    DRAINING = "draining", "writing its final checkpoint"
    RELEASED = "released", "released after its final checkpoint"
    FORCED = "forced", "released at the deadline without a final checkpoint"
    SUPERSEDED = "superseded", "overtaken: its node was reclaimed or the job ended first"


class Eviction(models.Model):
    """One job taken off its node with a final checkpoint (design §15): by the idle watchdog, the loan timer or
    over-quota preemption; ``portal.control.reclaim.evict`` moves it draining → released | forced, once."""

    job = models.ForeignKey("core.Job", on_delete=models.CASCADE, related_name="evictions")
    migration = models.OneToOneField("core.Migration", null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="eviction")
    node = models.ForeignKey("core.Node", null=True, on_delete=models.SET_NULL, related_name="+")
    reason = models.CharField(max_length=32)
    then = models.CharField(max_length=8, choices=LoanEnd.choices)
    announce = models.BooleanField(default=True)
    phase = models.CharField(max_length=16, choices=EvictionPhase.choices, default=EvictionPhase.DRAINING)
    requested_at = models.DateTimeField()
    deadline_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    work_lost_s = models.FloatField(default=0.0)

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["job"], condition=models.Q(finished_at__isnull=True),
                                               name="one_open_eviction_per_job")]
        indexes = [models.Index(fields=["phase", "deadline_at"])]

    def __str__(self) -> str:
        return f"eviction of job {self.job_id} ({self.reason})"
