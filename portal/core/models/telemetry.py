"""Measurements feeding the estimators (design §2): bandwidth samples, link and hazard estimates."""

from __future__ import annotations

from django.db import models

from portal.core.models.accounts import Provider
from portal.core.models.campus import Link
from portal.core.models.nodes import Node


class BandwidthSample(models.Model):
    """Egress bytes/s on a link over one sampling interval (agents sample counters every 100 ms)."""

    link = models.ForeignKey(Link, on_delete=models.CASCADE, related_name="samples")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL)
    sampled_at = models.DateTimeField(db_index=True)
    bytes_per_s = models.FloatField()
    resolution_s = models.PositiveIntegerField(
        default=0, db_default=0, help_text="0: one agent sample; 60 or 3600: the mean of a minute or an hour (rolled up)")

    class Meta:
        ordering = ["-sampled_at"]

    def __str__(self) -> str:
        return f"{self.link_id} at {self.sampled_at:%Y-%m-%d %H:%M:%S}: {self.bytes_per_s:.0f} B/s"


class NodeAvailability(models.Model):
    """One change of a node's lifecycle state, with its time: what the hazard estimator's exposure (how long
    each node was lent) is computed from (design §2 estimators). Written by the node lifecycle on every move."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="availability")
    at = models.DateTimeField(db_index=True)
    state = models.CharField(max_length=16)
    lent = models.BooleanField(help_text="Online and not kill-switched from this moment on")

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["node", "at"])]
        verbose_name = "node state change"
        verbose_name_plural = "node state changes"

    def __str__(self) -> str:
        return f"{self.node_id} {self.state} at {self.at:%Y-%m-%d %H:%M:%S}"


class LinkEstimate(models.Model):
    link = models.OneToOneField(Link, on_delete=models.CASCADE, related_name="estimate")
    mean_bytes_per_s = models.FloatField()
    lower_bytes_per_s = models.FloatField()
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"estimate for link {self.link_id}"


class HazardScope(models.TextChoices):
    NODE = "node", "node"
    PROVIDER = "provider", "provider"
    CAMPUS = "campus", "campus"


class HazardEstimate(models.Model):
    """Emergency-reclaim hazard by hour of day for a node, a provider or the campus."""

    scope = models.CharField(max_length=16, choices=HazardScope.choices)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE, related_name="hazard_estimates")
    provider = models.ForeignKey(Provider, null=True, blank=True, on_delete=models.CASCADE)
    hour_of_day = models.PositiveSmallIntegerField()
    hazard_per_s = models.FloatField()
    hazard_upper_per_s = models.FloatField()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["scope", "hour_of_day"]
        constraints = [
            models.UniqueConstraint(fields=["scope", "node", "provider", "hour_of_day"], name="hazard_estimate_unique")
        ]

    def __str__(self) -> str:
        return f"{self.scope} hazard at hour {self.hour_of_day}"
