"""Per-class link telemetry and the calibrated research reserve (design §4 "Calibrated reserve")."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

from portal.core.models.campus import Link
from portal.core.models.nodes import Node


class LinkScope(models.TextChoices):
    """Where an agent counted the bytes: its own access link, or a trunk (a building uplink) it can see."""

    ACCESS = "access", "access link"
    TRUNK = "trunk", "trunk (building uplink)"


class LinkClassSample(models.Model):
    """Bytes per traffic class on one link over one interval, as one agent counted them (design §4 classes:
    research = best effort, checkpoint = pre-sync + planned migration + emergency metadata, other = the rest the
    agent sent that it cannot attribute). Deltas, never counters: each row covers (sampled_at − interval_s,
    sampled_at]."""

    link = models.ForeignKey(Link, on_delete=models.CASCADE, related_name="class_samples")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL)
    scope = models.CharField(max_length=8, choices=LinkScope.choices, default=LinkScope.ACCESS)
    sampled_at = models.DateTimeField(db_index=True)
    interval_s = models.FloatField(validators=[MinValueValidator(0.001)])
    research_bytes = models.BigIntegerField(default=0, validators=[MinValueValidator(0)])
    checkpoint_bytes = models.BigIntegerField(default=0, validators=[MinValueValidator(0)])
    other_bytes = models.BigIntegerField(default=0, validators=[MinValueValidator(0)])
    source = models.CharField(max_length=32, blank=True, default="",
                              help_text="what counted them: the enforcement backend, or 'agent' (no kernel counters)")

    class Meta:
        ordering = ["-sampled_at"]
        indexes = [models.Index(fields=["link", "sampled_at"])]
        constraints = [
            models.CheckConstraint(condition=models.Q(interval_s__gt=0), name="class_sample_interval_positive"),
            models.CheckConstraint(condition=models.Q(research_bytes__gte=0, checkpoint_bytes__gte=0,
                                                      other_bytes__gte=0), name="class_sample_bytes_nonnegative"),
        ]
        verbose_name = "link class sample"

    def __str__(self) -> str:
        return f"{self.link_id} {self.scope} at {self.sampled_at:%Y-%m-%d %H:%M:%S}"

    @property
    def research_bytes_per_s(self) -> float:
        return self.research_bytes / self.interval_s


class ReserveSource(models.TextChoices):
    CALIBRATED = "calibrated", "calibrated (p95 of 7 days)"
    OVERRIDE = "override", "admin override"
    DEFAULT = "default", "default (β·B, no samples)"


class LinkReserve(models.Model):
    """B_min of one link (design §4): what P3 keeps for research on it. ``reserve_bytes_per_s`` is what counts:
    the admin's override when set, else the daily calibration (never below β·B)."""

    link = models.OneToOneField(Link, on_delete=models.CASCADE, related_name="reserve")
    reserve_bytes_per_s = models.FloatField(validators=[MinValueValidator(0)])
    source = models.CharField(max_length=16, choices=ReserveSource.choices, default=ReserveSource.DEFAULT)
    calibrated_bytes_per_s = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)])
    p95_share = models.FloatField(null=True, blank=True, help_text="research's p95 share of the link, last 7 days")
    samples = models.PositiveIntegerField(default=0, help_text="class samples the calibration saw")
    override_bytes_per_s = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0)],
        help_text="set by an admin: wins over the calibration (bytes/s; at most the link's capacity)")
    calibrated_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["link"]
        verbose_name = "link research reserve"

    def __str__(self) -> str:
        return f"reserve of {self.link_id}: {self.reserve_bytes_per_s:.0f} B/s ({self.source})"
