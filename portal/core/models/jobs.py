"""Researchers' training jobs, where they ran and the checkpoints they wrote (design §1)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from portal.core.models.accounts import ResearchGroup
from portal.core.models.nodes import Node
from portal.core.states import JobState


class PriorityClass(models.TextChoices):
    """Borrowed capacity is always reclaimable; the class orders placement among borrowers only."""

    INTERACTIVE = "interactive", "interactive"
    STANDARD = "standard", "standard"
    BEST_EFFORT = "best_effort", "best effort"


class LossBudgetMode(models.TextChoices):
    """How P1 reads a job's loss budget L_max (design §2 "Loss budget modes")."""

    EXPECTED = "expected", "expected loss ≤ L_max (Eq. 9)"
    BOUND = "bound", "no interruption loses more than L_max"


# design §19.2: a job's own memory limit and CPU quota (null: the node's per-GPU default applies)
MIN_JOB_MEMORY_BYTES = 256 * 2**20  # 256 MiB
MAX_JOB_MEMORY_BYTES = 16 * 2**40  # 16 TiB
MAX_JOB_CPU_CORES = 1024.0


def validate_cpu_cores(value: float) -> None:
    """More than 0 cores (a CPU quota of 0 would stop the job; design §19.2)."""
    if not value > 0:
        raise ValidationError("Must be more than 0 cores.", code="min_value")


class Job(models.Model):
    name = models.CharField(max_length=120)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    group = models.ForeignKey(ResearchGroup, on_delete=models.PROTECT, related_name="jobs")
    command = models.CharField(max_length=2000, blank=True, default="")
    image = models.CharField(max_length=300, blank=True, default="")
    gpu_count = models.PositiveSmallIntegerField(validators=[MinValueValidator(1), MaxValueValidator(16)])
    vram_gb_per_gpu = models.FloatField(default=0.0, validators=[MinValueValidator(0), MaxValueValidator(1024)])
    min_capability = models.DecimalField(max_digits=4, decimal_places=1, default=0)
    framework = models.CharField(max_length=64, blank=True, default="")
    expected_runtime_s = models.FloatField(validators=[MinValueValidator(1)])
    ckpt_bytes_estimate = models.BigIntegerField(validators=[MinValueValidator(1)])
    loss_budget_s = models.FloatField(null=True, blank=True, validators=[MinValueValidator(1)])
    # design §2 "Loss budget modes": "expected" (Eq. 9) or "bound" (no interruption loses more than L_max)
    loss_budget_mode = models.CharField(max_length=8, choices=LossBudgetMode.choices, default=LossBudgetMode.EXPECTED,
                                        db_default=LossBudgetMode.EXPECTED)
    restart_s = models.FloatField(
        default=30.0, validators=[MinValueValidator(0)], help_text="T_r: seconds to restart from a checkpoint"
    )
    priority_class = models.CharField(max_length=16, choices=PriorityClass.choices, default=PriorityClass.STANDARD)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    failure_reason = models.CharField(max_length=500, blank=True, default="")
    submitted_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    progress_step = models.BigIntegerField(default=0)
    work_done_s = models.FloatField(default=0.0)
    # P1's current decision for the job (the why lives in the decision log).
    checkpoint_interval_s = models.FloatField(null=True, blank=True)
    checkpoint_bandwidth_bytes_per_s = models.FloatField(null=True, blank=True)
    loss_budget_at_risk = models.BooleanField(default=False)
    # Results the agent uploads to the portal (design §14): a directory relative to the job's work directory.
    output_dir = models.CharField(max_length=500, blank=True, default="",
                                  help_text="relative to the job's working directory; uploaded when the job ends")
    upload_with_checkpoints = models.BooleanField(default=False,
                                                  help_text="also upload the output directory at each checkpoint")
    # design §19.2: the job's cgroup limits, sent in its start command; null: the node's per-GPU default
    memory_bytes = models.BigIntegerField(
        null=True, blank=True,
        validators=[MinValueValidator(MIN_JOB_MEMORY_BYTES), MaxValueValidator(MAX_JOB_MEMORY_BYTES)],
        help_text="memory limit of the job's cgroup (bytes); empty: the node's per-GPU default")
    cpu_cores = models.FloatField(
        null=True, blank=True, validators=[validate_cpu_cores, MaxValueValidator(MAX_JOB_CPU_CORES)],
        help_text="CPU quota of the job's cgroup (cores, may be fractional); empty: the node's per-GPU default")

    class Meta:
        ordering = ["-submitted_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(command="", image=""), name="job_has_command_or_image"
            ),
        ]
        indexes = [models.Index(fields=["state"])]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"


class Placement(models.Model):
    """One stretch of a job on one node (a gang job's GPUs are all on that node)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="placements")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="placements")
    gpu_indices = models.JSONField(default=list)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=32, blank=True, default="")

    class Meta:
        ordering = ["job", "started_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["job"], condition=models.Q(ended_at__isnull=True), name="one_open_placement_per_job"
            )
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} on {self.node.name}"


class Checkpoint(models.Model):
    """A completed checkpoint and what it was taken against (design §1: only valid on compatible nodes)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    sequence = models.PositiveIntegerField()
    node = models.ForeignKey(Node, null=True, on_delete=models.SET_NULL, related_name="checkpoints_written")
    step = models.BigIntegerField(default=0)
    size_bytes = models.BigIntegerField(validators=[MinValueValidator(1)])
    sha256 = models.CharField(max_length=64)
    taken_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)
    replica_nodes = models.ManyToManyField(Node, related_name="checkpoint_replicas", blank=True)
    gpu_model = models.CharField(max_length=64, blank=True, default="")
    compute_capability = models.DecimalField(max_digits=4, decimal_places=1, null=True, blank=True)
    driver_version = models.CharField(max_length=32, blank=True, default="")
    cuda_version = models.CharField(max_length=16, blank=True, default="")
    framework = models.CharField(max_length=64, blank=True, default="")
    framework_version = models.CharField(max_length=32, blank=True, default="")
    # design §2 "Asynchronous snapshots": what the job paused for (the cost P1 plans with for an asynchronous
    # job), the time to write it, how it was taken ("" = not reported: an older agent, read as sync), and the
    # time its first copy to a replica took (the sender's elapsed time; the interval is never shorter)
    stall_s = models.FloatField(null=True, blank=True)
    write_s = models.FloatField(null=True, blank=True)
    mode = models.CharField(max_length=8, blank=True, default="")
    transfer_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["job", "sequence"]
        constraints = [models.UniqueConstraint(fields=["job", "sequence"], name="checkpoint_sequence_unique")]
        # What P1 reads for every running job each control tick (portal.control.loop.ticks.p1_tick): the newest
        # asynchronous stall and the newest transfer time, each one probe of its own partial index. Without
        # them a job that never reported one had every checkpoint it ever wrote scanned, every tick.
        indexes = [
            models.Index(fields=["job", "-sequence"], name="checkpoint_async_stall",
                         condition=models.Q(completed_at__isnull=False, mode="async", stall_s__isnull=False)),
            models.Index(fields=["job", "-sequence"], name="checkpoint_transferred",
                         condition=models.Q(transfer_s__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} ckpt #{self.sequence}"
