"""An evaluation: policies × seeds of the simulator on one campus trace, and its report (design §7 "The what-if
report")."""

from __future__ import annotations

import json
import zlib
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class EvaluationState(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    DONE = "done", "done"
    FAILED = "failed", "failed"


class TraceSource(models.TextChoices):
    HISTORY = "history", "portal history"
    UPLOAD = "upload", "uploaded file"


class Evaluation(models.Model):
    """Who asked, on which trace, for which policies and seeds; where the run is; the report when done.

    The trace travels in the row (``trace_gz``: zlib-compressed design §7 JSON), so a worker on any host runs it
    without a shared filesystem: an upload is stored when it is accepted, the portal's history when the run starts
    (the last ``history_days`` days up to then)."""

    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                   related_name="evaluations")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)  # the running task touches it with every progress step
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    source = models.CharField(max_length=16, choices=TraceSource.choices)
    history_days = models.PositiveIntegerField(null=True, blank=True,
                                               validators=[MinValueValidator(1), MaxValueValidator(366)])
    trace_name = models.CharField(max_length=200, blank=True, default="")
    trace_gz = models.BinaryField(null=True, blank=True, editable=False)
    policies = models.JSONField(default=list)
    seeds = models.JSONField(default=list)
    state = models.CharField(max_length=16, choices=EvaluationState.choices, default=EvaluationState.QUEUED)
    progress = models.FloatField(default=0.0, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)])
    progress_label = models.CharField(max_length=200, blank=True, default="")
    error = models.TextField(blank=True, default="")
    report = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(progress__gte=0.0, progress__lte=1.0),
                                   name="whatif_progress_0_1"),
        ]

    def __str__(self) -> str:
        return f"evaluation #{self.pk} ({self.state})"

    @property
    def source_label(self) -> str:
        if self.source == TraceSource.HISTORY:
            return f"portal history, last {self.history_days} days"
        return f"uploaded file {self.trace_name}"

    def set_trace(self, rows: dict[str, Any]) -> None:
        self.trace_gz = zlib.compress(json.dumps(rows, separators=(",", ":")).encode(), 6)

    def trace_rows(self) -> dict[str, Any] | None:
        if not self.trace_gz:
            return None
        return json.loads(zlib.decompress(bytes(self.trace_gz)))
