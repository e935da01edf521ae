"""A job's results: the files of its output directory and its final checkpoint, kept by the portal (design §14).

The node agent uploads them file by file (``nodeagent/results.py``) to the agent results endpoint
(``portal/core/api/views_results.py``); the portal verifies each file's sha256 and stores it through Django's
storage API (``portal.core.results_storage``), content-addressed by job and sha256, so re-sending a file is
harmless. ``JobResults`` is the job's summary (state, bytes kept, why an upload was refused), ``JobResultFile``
one kept file. A research group's results are capped in bytes: ``GroupResultsCap`` (admin-editable) or the
settings default ``RECLAIMNET_RESULTS_GROUP_CAP_BYTES``.
"""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

from portal.core.models.accounts import ResearchGroup
from portal.core.models.jobs import Job
from portal.core.models.nodes import Node


class ResultsState(models.TextChoices):
    """``none``: nothing uploaded; ``partial``: some files, the agent has not said it is done (or a file was
    refused); ``complete``: every file the agent found is kept."""

    NONE = "none", "none"
    PARTIAL = "partial", "partial"
    COMPLETE = "complete", "complete"


class ResultKind(models.TextChoices):
    OUTPUT = "output", "output file"
    CHECKPOINT = "checkpoint", "final checkpoint"


class JobResults(models.Model):
    """One job's results summary (created by its first upload)."""

    job = models.OneToOneField(Job, primary_key=True, on_delete=models.CASCADE, related_name="results")
    state = models.CharField(max_length=16, choices=ResultsState.choices, default=ResultsState.PARTIAL)
    total_bytes = models.BigIntegerField(default=0, help_text="bytes kept for this job (files and checkpoint)")
    refused_reason = models.CharField(max_length=500, blank=True, default="",
                                      help_text="why the newest refused upload was refused (the group's cap)")
    completed_at = models.DateTimeField(null=True, blank=True)
    completed_placements = models.JSONField(default=list, blank=True,
                                            help_text="ids of the placements whose agent said its upload is "
                                                      "complete (each may complete once)")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "job results"

    def __str__(self) -> str:
        return f"results of job {self.job_id} ({self.state}, {self.total_bytes} bytes)"


class JobResultFile(models.Model):
    """One kept file of a job's results: its path inside the output directory (or the checkpoint's name)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="result_files")
    kind = models.CharField(max_length=16, choices=ResultKind.choices, default=ResultKind.OUTPUT)
    path = models.CharField(max_length=1024)
    size_bytes = models.BigIntegerField(validators=[MinValueValidator(0)])
    sha256 = models.CharField(max_length=64)
    storage_name = models.CharField(max_length=1024, help_text="the name in the results storage")
    checkpoint_sequence = models.PositiveIntegerField(null=True, blank=True)
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    uploaded_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["job", "kind", "path"]
        constraints = [models.UniqueConstraint(fields=["job", "kind", "path"], name="result_file_path_unique")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.kind} {self.path}"


class GroupResultsCap(models.Model):
    """A research group's own results cap (absent: the settings default applies)."""

    group = models.OneToOneField(ResearchGroup, primary_key=True, on_delete=models.CASCADE,
                                 related_name="results_cap")
    cap_bytes = models.BigIntegerField(validators=[MinValueValidator(0)],
                                       help_text="bytes of job results (files and final checkpoints) the group "
                                                 "may keep on the portal")

    class Meta:
        verbose_name = "group results cap"

    def __str__(self) -> str:
        return f"{self.group} results cap {self.cap_bytes} bytes"
