"""Who lends and who borrows: provider labs and researcher groups (design §1 "Who may do what")."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Provider(models.Model):
    """A lab that owns GPU nodes and lends them while idle. Members manage and reclaim only its nodes."""

    name = models.CharField(max_length=120, unique=True)
    slug = models.SlugField(max_length=60, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="providers", blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ResearchGroup(models.Model):
    """A group of researchers; usage and losses are charged here, never to the wrong person."""

    name = models.CharField(max_length=120, unique=True)
    slug = models.SlugField(max_length=60, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="research_groups", blank=True)
    gpu_hours_used = models.FloatField(default=0.0)
    gpu_hours_lost_to_reclaims = models.FloatField(default=0.0)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
