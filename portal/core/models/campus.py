"""The campus network tree (design §1): core switch, building switches, access links to nodes."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models


class Building(models.Model):
    name = models.CharField(max_length=100, unique=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Switch(models.Model):
    """A switch of the campus tree. The core switch has no building."""

    class Tier(models.TextChoices):
        CORE = "core", "core"
        BUILDING = "building", "building"

    name = models.CharField(max_length=100, unique=True)
    tier = models.CharField(max_length=16, choices=Tier.choices)
    building = models.ForeignKey(Building, null=True, blank=True, on_delete=models.PROTECT, related_name="switches")

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "switches"

    def __str__(self) -> str:
        return self.name


class Link(models.Model):
    """A link of the tree. ``upper`` is the switch nearer the core; the lower end is either
    ``lower_switch`` (an uplink) or the node whose ``access_link`` this is."""

    class Kind(models.TextChoices):
        ACCESS = "access", "access"
        UPLINK = "uplink", "building uplink"

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    upper = models.ForeignKey(Switch, on_delete=models.PROTECT, related_name="down_links")
    lower_switch = models.OneToOneField(
        Switch, null=True, blank=True, on_delete=models.PROTECT, related_name="uplink"
    )
    capacity_bytes_per_s = models.FloatField(validators=[MinValueValidator(1.0)])

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=models.Q(capacity_bytes_per_s__gt=0), name="link_capacity_positive"),
        ]

    def __str__(self) -> str:
        return self.name

    def lower_endpoint_name(self) -> str | None:
        """The name of the lower endpoint (switch or node), as the scheduler's topology expects."""
        if self.lower_switch_id is not None:
            return self.lower_switch.name
        node = getattr(self, "node", None)
        return node.name if node is not None else None
