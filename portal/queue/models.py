"""The fair queue's tables (design §16.6): quotas and shares an admin edits, arrays and dependencies a submit
writes, and each waiting job's standing as the last control period computed it."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from portal.core.models import Job, Node, ResearchGroup

DAY_S = 24 * 3600.0


class FairShareConfig(models.Model):
    """The one row of fair-share settings (pk 1; absent: these defaults). Priority = w_class·class term +
    w_fair·fair-share term + w_age·age term, each term in [0, 1] (design §16.6)."""

    half_life_s = models.FloatField(default=7 * DAY_S, validators=[MinValueValidator(60)],
                                    help_text="Usage this old counts half: the decay of past GPU-seconds.")
    weight_class = models.FloatField(default=0.5, validators=[MinValueValidator(0)],
                                     help_text="Weight of the priority class (interactive 1, standard 0.5, "
                                               "best effort 0).")
    weight_fair_share = models.FloatField(default=0.4, validators=[MinValueValidator(0)],
                                          help_text="Weight of the group's fair-share factor.")
    weight_age = models.FloatField(default=0.1, validators=[MinValueValidator(0)],
                                   help_text="Weight of the job's waiting time.")
    age_full_s = models.FloatField(default=7 * DAY_S, validators=[MinValueValidator(1)],
                                   help_text="A job waiting this long has the full age term.")
    backfill = models.BooleanField(default=True, help_text="Let smaller jobs start in a reservation's shadow "
                                                           "when they end before it (EASY backfill).")
    preempt_over_quota = models.BooleanField(
        default=True, help_text="Checkpoint and requeue a group's jobs running beyond its quota when a job "
                                "within its quota waits for their GPUs.")

    class Meta:
        verbose_name = "fair-share settings"
        verbose_name_plural = "fair-share settings"

    def __str__(self) -> str:
        return "Fair-share settings"

    @classmethod
    def current(cls) -> FairShareConfig:
        return cls.objects.filter(pk=1).first() or cls(pk=1)


class GroupQuota(models.Model):
    """One research group's limits and share. Empty limits: none. A group without a row has share 1."""

    group = models.OneToOneField(ResearchGroup, on_delete=models.CASCADE, related_name="queue_quota")
    max_gpus = models.PositiveIntegerField(null=True, blank=True,
                                           help_text="GPUs the group's jobs may hold at once (empty: no limit).")
    max_gpu_hours_30d = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)],
                                          help_text="GPU-hours per rolling 30 days (empty: no limit).")
    share = models.FloatField(default=1.0, validators=[MinValueValidator(0.001)],
                              help_text="The group's fair share, relative to the other groups' shares.")

    class Meta:
        ordering = ["group__name"]

    def __str__(self) -> str:
        return f"quota of {self.group}"


class UserQuota(models.Model):
    """Limits for one member within one group (optional; on top of the group's)."""

    group = models.ForeignKey(ResearchGroup, on_delete=models.CASCADE, related_name="queue_user_quotas")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="queue_quotas")
    max_gpus = models.PositiveIntegerField(null=True, blank=True)
    max_gpu_hours_30d = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)])

    class Meta:
        ordering = ["group__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["group", "user"], name="one_user_quota_per_group")]

    def __str__(self) -> str:
        return f"quota of {self.user} in {self.group}"


class JobArray(models.Model):
    """A sweep submitted once: its tasks are jobs sharing every field but their index (design §16.6)."""

    name = models.CharField(max_length=120)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="job_arrays")
    group = models.ForeignKey(ResearchGroup, on_delete=models.PROTECT, related_name="job_arrays")
    spec = models.CharField(max_length=200, help_text='As submitted, e.g. "0-49%8".')
    size = models.PositiveIntegerField()
    throttle = models.PositiveIntegerField(null=True, blank=True,
                                           help_text="At most this many tasks running at once (empty: no limit).")
    submitted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} [{self.spec}]"


class ArrayTask(models.Model):
    """One job of an array and its index (``RECLAIMNET_ARRAY_INDEX`` in its environment)."""

    array = models.ForeignKey(JobArray, on_delete=models.CASCADE, related_name="tasks")
    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="array_task")
    index = models.PositiveIntegerField()

    class Meta:
        ordering = ["array", "index"]
        constraints = [models.UniqueConstraint(fields=["array", "index"], name="one_task_per_array_index")]

    def __str__(self) -> str:
        return f"task {self.index} of array {self.array_id}: job {self.job_id}"


class DependencyKind(models.TextChoices):
    AFTER_OK = "after_ok", "after ok"
    AFTER_ANY = "after_any", "after any"


class JobDependency(models.Model):
    """``job`` starts only after ``parent``: completed (after_ok) or ended in any way (after_any)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="queue_parents")
    parent = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="queue_children")
    kind = models.CharField(max_length=16, choices=DependencyKind.choices)

    class Meta:
        ordering = ["job", "parent"]
        constraints = [models.UniqueConstraint(fields=["job", "parent"], name="one_dependency_per_pair")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.kind} job {self.parent_id}"


class QueueReason(models.TextChoices):
    OVER_QUOTA = "over_quota", "over its group's quota"
    DEPENDENCY = "dependency", "waiting for the jobs it depends on"
    ARRAY_THROTTLE = "array_throttle", "its array's throttle"
    RESERVED = "reserved", "GPUs reserved for a job ahead of it"
    BEHIND_OTHERS = "behind_others", "behind jobs of higher priority"


class QueueEntry(models.Model):
    """A waiting job's standing as the last control period computed it: its priority and terms, rank, why it
    waits, the reservation it holds and when it is estimated to start. Rewritten every period; a job that left
    the queue loses its row."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="queue_entry")
    priority = models.FloatField()
    class_term = models.FloatField()
    fair_share_term = models.FloatField()
    age_term = models.FloatField()
    rank = models.PositiveIntegerField()
    reason = models.CharField(max_length=16, choices=QueueReason.choices, blank=True, default="")
    reason_text = models.CharField(max_length=300, blank=True, default="")
    reserved_node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    estimated_start_at = models.DateTimeField(null=True, blank=True)
    computed_at = models.DateTimeField()

    class Meta:
        ordering = ["rank"]
        verbose_name_plural = "queue entries"

    def __str__(self) -> str:
        return f"job {self.job_id}: #{self.rank}, {self.terms_text()}"

    def terms_text(self) -> str:
        """"0.72 = class 0.50 + fair share 0.18 + age 0.04"."""
        return (f"{self.priority:.2f} = class {self.class_term:.2f} + fair share {self.fair_share_term:.2f} "
                f"+ age {self.age_term:.2f}")


class OverQuotaRun(models.Model):
    """A job that was started beyond its group's (or owner's) quota, on GPUs nobody within quota wanted then: it
    is the first to be checkpointed and requeued when a job within quota waits for its GPUs."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="over_quota_run")
    started_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"job {self.job_id} started over quota"
