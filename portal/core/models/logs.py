"""Why things happened: every scheduler decision and every human action."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class DecisionLog(models.Model):
    """One P1/P2/P3 decision with its full JSON input and output ("why did my job go there?")."""

    class Kind(models.TextChoices):
        P1 = "p1", "P1 checkpoint schedule"
        P2 = "p2", "P2 destination"
        P3 = "p3", "P3 admission"

    decision_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    kind = models.CharField(max_length=4, choices=Kind.choices)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    job = models.ForeignKey("core.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="decisions")
    reclaim = models.ForeignKey(
        "core.ReclaimEvent", null=True, blank=True, on_delete=models.SET_NULL, related_name="decisions"
    )
    request = models.JSONField()
    response = models.JSONField()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} decision {self.decision_id}"


class AuditLog(models.Model):
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=64)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    detail = models.JSONField(default=dict)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.object_type}:{self.object_id}"
