"""Durable hand-over of work: the transactional outbox and the idempotency-key store (docs/design.md §8).

An ``OutboxMessage`` is written in the same transaction as the change that wants work done, so the work exists
exactly when the change does. A relay (``portal.core.outbox``) hands committed rows to the task runner and marks
them sent; until then a row is re-tried with backoff, so a broker outage delays work and never loses it.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class OutboxMessage(models.Model):
    """One unit of work to hand to a task runner: a Celery task name and its JSON arguments."""

    message_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    task_name = models.CharField(max_length=100)
    args = models.JSONField(default=list, blank=True)
    priority = models.PositiveSmallIntegerField(
        default=2, help_text="0 is handed over first: reclaims before migration steps before placements")
    created_at = models.DateTimeField(auto_now_add=True)
    available_at = models.DateTimeField(help_text="not handed over before this time (deadlines, backoff)")
    claimed_until = models.DateTimeField(null=True, blank=True, help_text="a relay holds it until then")
    attempts = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["priority", "available_at", "id"]
        indexes = [models.Index(fields=["sent_at", "priority", "available_at"], name="outbox_pending")]

    def __str__(self) -> str:
        return f"{self.task_name}{tuple(self.args)} ({'sent' if self.sent_at else 'pending'})"


class IdempotencyKey(models.Model):
    """The stored answer to a create request sent with an ``Idempotency-Key`` header (or a web form's one-time
    ``submit_token``): a retry with the same key replays it instead of creating a second row."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    scope = models.CharField(max_length=300, help_text="method and path the key was first used on")
    request_sha256 = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_ciphertext = models.TextField(
        blank=True, default="", help_text="the JSON answer, encrypted (it may carry a one-time agent token)")
    response_location = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_key_per_user")]

    def __str__(self) -> str:
        return f"idempotency key {self.key} of user {self.user_id}"
