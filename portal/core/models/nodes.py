"""GPU nodes lent by providers, their GPUs and lending windows (design §1)."""

from __future__ import annotations

import hashlib
import secrets

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from portal.core.models.accounts import Provider
from portal.core.models.campus import Building, Link
from portal.core.states import NodeState

AGENT_TOKEN_PREFIX_LEN = 8


def hash_agent_token(token: str) -> str:
    """Agent tokens are stored only as a SHA-256 digest (they are 256-bit random, so no salt/KDF is needed)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_agent_token() -> str:
    return "rna_" + secrets.token_urlsafe(32)


class OwnerUsePolicy(models.TextChoices):
    """What the portal does when a lent GPU is used by its lab (design §1 "Owner activity and MIG")."""

    IGNORE = "ignore", "ignore it"
    NOTIFY = "notify", "tell the provider"
    RECLAIM = "reclaim", "take the node back (a reclaim with notice)"


class Node(models.Model):
    name = models.CharField(max_length=100, unique=True)
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="nodes")
    building = models.ForeignKey(Building, on_delete=models.PROTECT, related_name="nodes")
    access_link = models.OneToOneField(Link, null=True, blank=True, on_delete=models.SET_NULL, related_name="node")
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.REGISTERED)
    agent_token_hash = models.CharField(max_length=64, unique=True, editable=False)
    agent_token_prefix = models.CharField(max_length=AGENT_TOKEN_PREFIX_LEN + 4, editable=False)
    agent_token_revoked = models.BooleanField(default=False)
    gpu_floor = models.PositiveSmallIntegerField(default=0, help_text="GPUs the provider never lends")
    killswitch_engaged = models.BooleanField(default=False)
    enforcement_backend = models.CharField(max_length=32, blank=True, default="")
    # How its agent runs jobs, as its last hello said: "confined: …" or "unconfined: …" (design §19.6); "" unknown.
    job_confinement = models.CharField(max_length=400, blank=True, default="", editable=False)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Owner activity (design §1 "Owner activity and MIG"): the provider's choice, and how many heartbeats in a row
    # have shown foreign processes on its lent GPUs (the portal acts once, when the streak reaches its threshold).
    owner_use_policy = models.CharField(max_length=8, choices=OwnerUsePolicy.choices, default=OwnerUsePolicy.NOTIFY)
    owner_use_streak = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def jobs_unconfined(self) -> bool:
        """Its agent said it runs jobs unconfined (allowed by its ``allow_unconfined_jobs``; design §19.6)."""
        return self.job_confinement.startswith("unconfined")

    @property
    def job_confinement_detail(self) -> str:
        """What the agent said after "confined: " or "unconfined: "."""
        return self.job_confinement.partition(": ")[2]

    def set_agent_token(self, token: str) -> None:
        self.agent_token_hash = hash_agent_token(token)
        self.agent_token_prefix = token[: AGENT_TOKEN_PREFIX_LEN + 4]
        self.agent_token_revoked = False

    def check_agent_token(self, token: str) -> bool:
        return not self.agent_token_revoked and secrets.compare_digest(self.agent_token_hash, hash_agent_token(token))

    @staticmethod
    def lendable_of(gpu_count: int, gpu_floor: int) -> int:
        """GPUs a node offers: all of its GPUs but the floor its provider keeps (the one place this is computed;
        the campus read model, ``portal.core.campus``, sums it over the nodes that are lent now)."""
        return max(0, int(gpu_count) - int(gpu_floor))

    @property
    def lendable_gpu_count(self) -> int:
        return Node.lendable_of(self.gpus.count(), self.gpu_floor)

    @property
    def is_lent(self) -> bool:
        """Online and not kill-switched: its lendable GPUs count for the campus."""
        return self.state == NodeState.ONLINE and not self.killswitch_engaged


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    model = models.CharField(max_length=64)
    uuid = models.CharField(max_length=64, blank=True, default="")
    vram_gb = models.FloatField(validators=[MinValueValidator(0.5), MaxValueValidator(1024)])
    compute_capability = models.DecimalField(max_digits=4, decimal_places=1)
    driver_version = models.CharField(max_length=32, blank=True, default="")
    cuda_version = models.CharField(max_length=16, blank=True, default="")
    # As the agent last reported (design §1 "Owner activity and MIG"): MIG mode ("" = no MIG), its instances
    # [{uuid, memory_bytes}], and the processes on the GPU that are none of the agent's jobs'.
    mig_mode = models.CharField(max_length=8, blank=True, default="", editable=False)
    mig_instances = models.JSONField(default=list, blank=True, editable=False)
    foreign_process_count = models.PositiveIntegerField(default=0, editable=False)
    foreign_memory_bytes = models.BigIntegerField(default=0, validators=[MinValueValidator(0)], editable=False)
    foreign_pids = models.JSONField(default=list, blank=True, editable=False)
    activity_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["node", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_index_unique_per_node")]
        verbose_name = "GPU"
        verbose_name_plural = "GPUs"

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index} ({self.model})"


class LendingWindow(models.Model):
    """A weekly window during which the node is lent (e.g. nights and weekends). No window = always lent."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="lending_windows")
    weekday = models.PositiveSmallIntegerField(validators=[MaxValueValidator(6)], help_text="0 = Monday")
    start_time = models.TimeField()
    end_time = models.TimeField(help_text="May be earlier than start_time: the window then runs past midnight")

    class Meta:
        ordering = ["node", "weekday", "start_time"]

    def __str__(self) -> str:
        return f"{self.node.name}: day {self.weekday} {self.start_time}-{self.end_time}"
