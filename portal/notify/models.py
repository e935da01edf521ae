"""Preferences, webhooks, deliveries and their attempts, and the demo's stored mail (docs/design.md §12)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from portal.core.models import Job, Provider, ResearchGroup


class EmailMode(models.TextChoices):
    OFF = "off", "off"
    NOW = "now", "at once"
    DIGEST = "digest", "in the digest"


class Preference(models.Model):
    """One user's choice for one event of the catalogue (absent: the defaults of ``portal.notify.preferences``)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notify_preferences")
    event = models.CharField(max_length=64)
    toast = models.BooleanField(default=True)
    email = models.CharField(max_length=8, choices=EmailMode.choices, default=EmailMode.OFF)
    webhook = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "event"], name="notify_one_preference_per_event")]

    def __str__(self) -> str:
        return f"{self.user_id} {self.event}"


class Webhook(models.Model):
    """A URL that receives signed POSTs: a user's own, or a research group's or a lab's (exactly one owner).

    The secret is kept to sign with (HMAC needs it) and shown once, when the webhook is created."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="notify_webhooks")
    group = models.ForeignKey(ResearchGroup, null=True, blank=True, on_delete=models.CASCADE,
                              related_name="notify_webhooks")
    provider = models.ForeignKey(Provider, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="notify_webhooks")
    name = models.CharField(max_length=100, blank=True)
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=100)
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.CheckConstraint(
            condition=(Q(user__isnull=False, group__isnull=True, provider__isnull=True)
                       | Q(user__isnull=True, group__isnull=False, provider__isnull=True)
                       | Q(user__isnull=True, group__isnull=True, provider__isnull=False)),
            name="notify_webhook_one_owner")]

    def __str__(self) -> str:
        return self.name or self.url

    @property
    def owner_label(self) -> str:
        if self.group_id:
            return f"group {self.group.name}"
        if self.provider_id:
            return f"lab {self.provider.name}"
        return "you" if self.user_id else ""


class Channel(models.TextChoices):
    EMAIL = "email", "email"
    WEBHOOK = "webhook", "webhook"
    DIGEST = "digest", "digest"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "pending"
    RETRYING = "retrying", "retrying"
    SENT = "sent", "sent"
    GAVE_UP = "gave_up", "gave up"
    IN_DIGEST = "in_digest", "waiting for the digest"
    DIGESTED = "digested", "sent in a digest"


class Delivery(models.Model):
    """One notice to one target by one channel, with its attempts (the delivery log)."""

    notice_id = models.CharField(max_length=32)
    event = models.CharField(max_length=64)
    level = models.CharField(max_length=16, default="info")
    channel = models.CharField(max_length=8, choices=Channel.choices)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
                             related_name="notify_deliveries")
    webhook = models.ForeignKey(Webhook, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries")
    key = models.CharField(max_length=80)  # "email:<user>", "webhook:<id>", "digest:<user>": one per notice
    target = models.CharField(max_length=500)  # the address or the URL, as it was when sent
    text = models.TextField()
    url = models.CharField(max_length=300, blank=True)
    facts = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_status_code = models.IntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)  # when the current attempt began

    class Meta:
        ordering = ["-pk"]
        indexes = [models.Index(fields=["user", "-created_at"]), models.Index(fields=["status", "channel"])]
        constraints = [models.UniqueConstraint(fields=["notice_id", "key"], name="notify_one_delivery_per_target")]

    def __str__(self) -> str:
        return f"{self.event} by {self.channel} to {self.target}"

    @property
    def badge(self) -> str:
        """The page's badge class for the status."""
        return {"sent": "ok", "retrying": "pending", "pending": "pending", "gave_up": "failed",
                "in_digest": "scheduled", "digested": "completed"}.get(self.status, "")


class Attempt(models.Model):
    """One try of a delivery: the HTTP status code or the error, and how long it took."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    at = models.DateTimeField(auto_now_add=True)
    status_code = models.IntegerField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    duration_ms = models.FloatField(default=0.0)

    class Meta:
        ordering = ["delivery_id", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery {self.delivery_id}"

    @property
    def ok(self) -> bool:
        return not self.error and (self.status_code is None or 200 <= self.status_code < 300)


class StoredMail(models.Model):
    """A message the database mail backend kept instead of sending (``make demo``: no SMTP server)."""

    sent_at = models.DateTimeField(auto_now_add=True)
    from_email = models.CharField(max_length=300)
    to = models.TextField()  # comma-separated
    subject = models.CharField(max_length=300)
    body = models.TextField()

    class Meta:
        ordering = ["-pk"]

    def __str__(self) -> str:
        return self.subject


class BudgetRiskSeen(models.Model):
    """A job whose ``loss_budget_at_risk`` was already announced (the watcher announces each turn to true once)."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="+")
    seen_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"job {self.job_id}"
