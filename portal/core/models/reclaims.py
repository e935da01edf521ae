"""Reclaims (the owner takes a loan back) and the migrations they cause (design §1, §3, §4)."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from portal.core.models.jobs import Job
from portal.core.models.nodes import Node


class ReclaimKind(models.TextChoices):
    SCHEDULED = "scheduled", "scheduled (with notice)"
    EMERGENCY = "emergency", "emergency (no notice)"
    KILLSWITCH = "killswitch", "kill-switch"
    HEARTBEAT_LOST = "heartbeat_lost", "heartbeat lost"
    WINDOW = "window", "lending window ends"  # the control plane drains the node (design §9.13); it stays lent


class ReclaimOutcome(models.TextChoices):
    PENDING = "pending", "pending"
    DRAINING = "draining", "draining"
    COMPLETED = "completed", "completed: every job left with no loss"
    DEGRADED = "degraded", "completed: some jobs lost work"
    FORCED = "forced", "forced at the deadline"


class ReclaimEvent(models.Model):
    """A provider took a node back. This is a reclaim, never priority preemption (design §1)."""

    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="reclaims")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="reclaims"
    )
    kind = models.CharField(max_length=16, choices=ReclaimKind.choices)
    notice_s = models.FloatField(default=0.0, validators=[MinValueValidator(0)])
    requested_at = models.DateTimeField(auto_now_add=True)
    deadline_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=ReclaimOutcome.choices, default=ReclaimOutcome.PENDING)
    outcome_detail = models.CharField(max_length=500, blank=True, default="")
    reason = models.CharField(max_length=64, blank=True, default="")  # why, when not a person's click ("owner use")

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [models.CheckConstraint(condition=models.Q(notice_s__gte=0), name="reclaim_notice_nonnegative")]

    def __str__(self) -> str:
        return f"{self.kind} reclaim of {self.node.name}"


class MigrationMode(models.TextChoices):
    PLANNED = "planned", "planned (final checkpoint within notice)"
    DEGRADED = "degraded", "degraded (resumed from an earlier checkpoint)"


class Migration(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="migrations")
    reclaim = models.ForeignKey(ReclaimEvent, null=True, blank=True, on_delete=models.SET_NULL, related_name="migrations")
    source = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="migrations_out")
    destination = models.ForeignKey(Node, null=True, blank=True, on_delete=models.PROTECT, related_name="migrations_in")
    checkpoint = models.ForeignKey("core.Checkpoint", null=True, blank=True, on_delete=models.SET_NULL)
    mode = models.CharField(max_length=16, choices=MigrationMode.choices)
    degraded_reason = models.CharField(max_length=32, blank=True, default="")
    bytes = models.BigIntegerField(default=0, validators=[MinValueValidator(0)])
    assigned_rate_bytes_per_s = models.FloatField(null=True, blank=True)
    dscp = models.PositiveSmallIntegerField(default=34)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    work_lost_s = models.FloatField(default=0.0)
    downtime_s = models.FloatField(null=True, blank=True)
    success = models.BooleanField(null=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"migration of job {self.job_id}"
