"""API serializers: input serializers validate every field (400 naming it); output serializers are read-only."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from portal.core.api.fields import FiniteFloatField, StrictCharField, StrictIntegerField, TimeOfDayField
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import (
    Building,
    Checkpoint,
    Gpu,
    Job,
    LendingWindow,
    Link,
    Migration,
    Node,
    Placement,
    PriorityClass,
    Provider,
    ReclaimEvent,
    ReclaimKind,
    ResearchGroup,
    Switch,
)
from portal.core.models.jobs import (
    MAX_JOB_CPU_CORES,
    MAX_JOB_MEMORY_BYTES,
    MIN_JOB_MEMORY_BYTES,
    LossBudgetMode,
)
from portal.core.models.nodes import OwnerUsePolicy
from portal.core.services import explain
from portal.core.services._validate import NAME_RE
from portal.core.services.gpu_catalogue import GPU_CATALOGUE, lookup_gpu
from portal.core.services.jobs import MAX_CKPT_BYTES, MAX_GPUS_PER_JOB, MAX_RUNTIME_S
from portal.core.services.nodes import (
    ACCESS_LINK_DEFAULT_BYTES_PER_S,
    MAX_GPUS_PER_NODE,
    MAX_LENDING_WINDOWS,
    MAX_LINK_BYTES_PER_S,
)
from portal.core.services.reclaims import MAX_NOTICE_S
from portal.queue import read as queue_read
from scheduler.explain import REASONS as EXPLAIN_REASONS

MAX_ID = 2**63 - 1  # a bigint: larger ids cannot exist, and the database refuses to compare with them


def _id_filter(help_text: str) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=1, max_value=MAX_ID, required=False, help_text=help_text)


NAME_HELP = "Letters, digits, '.', '_' and '-', starting with a letter or digit."

# --- campus and accounts ---------------------------------------------------------------------------------------


class BuildingSerializer(serializers.ModelSerializer):
    class Meta:
        model = Building
        fields = ["id", "name"]


class SwitchSerializer(serializers.ModelSerializer):
    class Meta:
        model = Switch
        fields = ["id", "name", "tier", "building"]


class LinkSerializer(serializers.ModelSerializer):
    lower = serializers.SerializerMethodField(help_text="Name of the lower endpoint (switch or node).")

    class Meta:
        model = Link
        fields = ["id", "name", "kind", "upper", "lower_switch", "lower", "capacity_bytes_per_s"]

    def get_lower(self, link: Link) -> str | None:
        return link.lower_endpoint_name()


class ProviderSerializer(serializers.ModelSerializer):
    class Meta:
        model = Provider
        fields = ["id", "name", "slug"]


class ResearchGroupSerializer(serializers.ModelSerializer):
    class Meta:
        model = ResearchGroup
        fields = ["id", "name", "slug", "gpu_hours_used", "gpu_hours_lost_to_reclaims"]


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    is_staff = serializers.BooleanField()
    roles = serializers.ListField(child=serializers.ChoiceField(choices=["admin", "provider", "researcher"]))
    providers = ProviderSerializer(many=True)
    groups = ResearchGroupSerializer(many=True)


# --- list filters (query parameters; an invalid one answers 400 naming it) ------------------------------------------
# Views validate ``query_params.dict()``, not the QueryDict: DRF reads an empty value in a QueryDict as "absent"
# (HTML form semantics), so ``?state=`` would silently mean "no filter" although the schema says it is invalid.


class NodeListQuerySerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=NodeState.choices, required=False)
    provider = _id_filter("Only this provider lab's nodes.")
    building = _id_filter("Only the nodes in this building.")
    mine = serializers.BooleanField(required=False, default=False,
                                    help_text="Only the nodes of the caller's own labs.")


class JobListQuerySerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=JobState.choices, required=False)
    group = _id_filter("Only this research group's jobs.")
    array = _id_filter("Only this array's jobs (design §16.6).")


class ReclaimListQuerySerializer(serializers.Serializer):
    node = _id_filter("Only the reclaims of this node.")
    kind = serializers.ChoiceField(choices=ReclaimKind.choices, required=False)


# --- nodes -------------------------------------------------------------------------------------------------------


class GpuSerializer(serializers.ModelSerializer):
    class Meta:
        model = Gpu
        fields = ["index", "model", "vram_gb", "compute_capability", "driver_version", "cuda_version", "uuid",
                  # as the agent last reported (design §1 "Owner activity and MIG"); the PIDs stay on the lab's page
                  "mig_mode", "mig_instances", "foreign_process_count", "foreign_memory_bytes", "activity_at"]


class GpuDeclarationSerializer(serializers.Serializer):
    """One GPU as a provider declares it; VRAM and capability default from the GPU catalogue."""

    model = StrictCharField(max_length=64, help_text="A catalogue model, e.g. " + ", ".join(sorted(GPU_CATALOGUE)))
    vram_gb = FiniteFloatField(min_value=0.5, max_value=1024, required=False)
    compute_capability = serializers.DecimalField(
        max_digits=4, decimal_places=1, min_value=Decimal("1.0"), max_value=Decimal("99.9"), required=False
    )
    driver_version = StrictCharField(max_length=32, required=False, allow_blank=True, default="")
    cuda_version = StrictCharField(max_length=16, required=False, allow_blank=True, default="")
    uuid = StrictCharField(max_length=64, required=False, allow_blank=True, default="")

    def validate_model(self, value: str) -> str:
        spec = lookup_gpu(value)
        if spec is None:
            raise serializers.ValidationError(
                f"Unknown GPU model {value!r}; known models: {', '.join(sorted(GPU_CATALOGUE))}."
            )
        return spec.model


class LendingWindowSerializer(serializers.ModelSerializer):
    weekday = StrictIntegerField(min_value=0, max_value=6, help_text="0 = Monday … 6 = Sunday")
    start_time = TimeOfDayField()
    end_time = TimeOfDayField()

    class Meta:
        model = LendingWindow
        fields = ["weekday", "start_time", "end_time"]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["start_time"] == attrs["end_time"]:
            raise serializers.ValidationError({"end_time": ["Must differ from start_time."]})
        return attrs


class LendingWindowListSerializer(serializers.Serializer):
    windows = LendingWindowSerializer(many=True, max_length=MAX_LENDING_WINDOWS)


class NodeSerializer(serializers.ModelSerializer):
    provider_name = serializers.CharField(source="provider.name", read_only=True)
    building_name = serializers.CharField(source="building.name", read_only=True)
    gpus = GpuSerializer(many=True, read_only=True)
    lending_windows = LendingWindowSerializer(many=True, read_only=True)
    lendable_gpu_count = serializers.IntegerField(read_only=True)
    access_link_bytes_per_s = serializers.FloatField(
        source="access_link.capacity_bytes_per_s", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = Node
        fields = [
            "id", "name", "provider", "provider_name", "building", "building_name", "state", "gpus",
            "gpu_floor", "lendable_gpu_count", "lending_windows", "access_link_bytes_per_s", "killswitch_engaged",
            "enforcement_backend", "job_confinement", "last_heartbeat_at", "agent_token_prefix", "agent_token_revoked",
            "created_at", "owner_use_policy",
        ]
        read_only_fields = fields


class NodeRegisterSerializer(serializers.Serializer):
    name = StrictCharField(max_length=100, help_text=NAME_HELP)
    provider = serializers.PrimaryKeyRelatedField(
        queryset=Provider.objects.all(), required=False,
        help_text="The lab lending the node; may be left out by a member of exactly one lab.",
    )
    building = serializers.PrimaryKeyRelatedField(queryset=Building.objects.all())
    gpus = GpuDeclarationSerializer(many=True, min_length=1, max_length=MAX_GPUS_PER_NODE)
    gpu_floor = StrictIntegerField(min_value=0, max_value=MAX_GPUS_PER_NODE, default=0,
                                   help_text="GPUs the provider never lends.")
    access_link_bytes_per_s = FiniteFloatField(min_value=1.0, max_value=MAX_LINK_BYTES_PER_S,
                                               default=ACCESS_LINK_DEFAULT_BYTES_PER_S)
    lending_windows = LendingWindowSerializer(many=True, required=False, max_length=MAX_LENDING_WINDOWS)

    def validate_name(self, value: str) -> str:
        if not NAME_RE.match(value):
            raise serializers.ValidationError(NAME_HELP)
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["gpu_floor"] > len(attrs["gpus"]):
            raise serializers.ValidationError({"gpu_floor": ["Cannot exceed the number of GPUs declared."]})
        return attrs


class NodeRegisteredSerializer(NodeSerializer):
    agent_token = serializers.CharField(read_only=True, help_text="Shown once; only its SHA-256 is stored.")

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "agent_token"]
        read_only_fields = fields


class NodeUpdateSerializer(serializers.Serializer):
    name = StrictCharField(max_length=100, required=False, help_text=NAME_HELP)
    gpu_floor = StrictIntegerField(min_value=0, max_value=MAX_GPUS_PER_NODE, required=False)
    access_link_bytes_per_s = FiniteFloatField(min_value=1.0, max_value=MAX_LINK_BYTES_PER_S, required=False)
    owner_use_policy = serializers.ChoiceField(
        choices=OwnerUsePolicy.choices, required=False,
        help_text="When the lab's own processes use a lent GPU: ignore, notify the lab, or reclaim the node.")

    def validate_name(self, value: str) -> str:
        if not NAME_RE.match(value):
            raise serializers.ValidationError(NAME_HELP)
        return value


class AgentTokenSerializer(serializers.Serializer):
    agent_token = serializers.CharField(help_text="Shown once; only its SHA-256 is stored.")
    agent_token_prefix = serializers.CharField()


class ReclaimRequestSerializer(serializers.Serializer):
    notice_s = FiniteFloatField(min_value=0.0, max_value=MAX_NOTICE_S,
                                help_text="Seconds of notice; 0 is an emergency reclaim.")


class ReclaimPreviewQuerySerializer(serializers.Serializer):
    notice_s = FiniteFloatField(min_value=0.0, max_value=MAX_NOTICE_S, default=0.0)


class ReclaimPreviewJobSerializer(serializers.Serializer):
    job_id = serializers.IntegerField()
    name = serializers.CharField()
    ckpt_bytes = serializers.IntegerField()
    bandwidth_bytes_per_s = serializers.FloatField()
    restart_s = serializers.FloatField()
    leave_s = serializers.FloatField()
    loss_free = serializers.BooleanField()
    outcome = serializers.ChoiceField(choices=["loss_free", "from_replica", "from_scratch"],
                                      help_text="Leaves with no loss, resumes from its freshest replica, or "
                                                "restarts from the beginning.")
    destination_id = serializers.IntegerField(allow_null=True)
    destination = serializers.CharField(allow_null=True, help_text="Node name the job goes to (null: it waits).")
    work_lost_s = serializers.FloatField(help_text="Expected work lost (0 when loss-free).")
    reason = serializers.CharField(allow_blank=True, help_text="Why it is not loss-free.")


class ReclaimPreviewSerializer(serializers.Serializer):
    notice_s = serializers.FloatField()
    shortest_loss_free_notice_s = serializers.FloatField(
        allow_null=True, help_text="Null when no notice up to a week lets every job leave with no loss.")
    jobs = ReclaimPreviewJobSerializer(many=True)


class ReclaimEventSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    requested_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True,
        help_text="Who asked; null for the control plane's own reclaims (a node whose heartbeat was lost).")

    class Meta:
        model = ReclaimEvent
        fields = [
            "id", "node", "node_name", "requested_by", "kind", "notice_s", "requested_at", "deadline_at",
            "finished_at", "outcome", "outcome_detail", "reason",
        ]
        read_only_fields = fields


# --- jobs ----------------------------------------------------------------------------------------------------------


class PlacementSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = Placement
        fields = ["id", "node", "node_name", "gpu_indices", "started_at", "ended_at", "end_reason"]
        read_only_fields = fields


class CheckpointSerializer(serializers.ModelSerializer):
    replica_nodes = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)

    class Meta:
        model = Checkpoint
        fields = [
            "id", "sequence", "node", "step", "size_bytes", "sha256", "taken_at", "completed_at", "replica_nodes",
            "gpu_model", "compute_capability", "driver_version", "cuda_version", "framework", "framework_version",
        ]
        read_only_fields = fields


class MigrationSerializer(serializers.ModelSerializer):
    source_name = serializers.CharField(source="source.name", read_only=True)
    destination_name = serializers.CharField(source="destination.name", read_only=True, allow_null=True,
                                             default=None)

    class Meta:
        model = Migration
        fields = [
            "id", "reclaim", "source", "source_name", "destination", "destination_name", "checkpoint", "mode",
            "degraded_reason", "bytes", "assigned_rate_bytes_per_s", "dscp", "started_at", "finished_at",
            "work_lost_s", "downtime_s", "success",
        ]
        read_only_fields = fields


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)
    group_name = serializers.CharField(source="group.name", read_only=True)
    node = serializers.SerializerMethodField(help_text="Name of the node it runs on now (null when not placed).")

    class Meta:
        model = Job
        fields = [
            "id", "name", "owner", "group", "group_name", "command", "image", "gpu_count", "vram_gb_per_gpu",
            "min_capability", "framework", "expected_runtime_s", "ckpt_bytes_estimate", "loss_budget_s",
            "loss_budget_mode", "restart_s", "priority_class", "state", "failure_reason", "submitted_at", "started_at", "finished_at",
            "progress_step", "work_done_s", "checkpoint_interval_s", "checkpoint_bandwidth_bytes_per_s",
            "loss_budget_at_risk", "node", "output_dir", "upload_with_checkpoints", "memory_bytes", "cpu_cores",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "memory_bytes": {"help_text": (
                "The memory limit of the job's cgroup, in bytes (design §19.2); null: the node's per-GPU default.")},
            "cpu_cores": {"help_text": (
                "The CPU quota of the job's cgroup, in cores (may be fractional; design §19.2); null: the node's "
                "per-GPU default.")},
            "progress_step": {"help_text": "The step the job's current run has reached, as its agent reports it."},
            "work_done_s": {"help_text": (
                "Seconds of work the job's progress stands for: progress_step × its measured seconds per step, "
                "updated with every heartbeat while it runs; work lost in a migration is not counted.")},
        }

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_node(self, job: Job) -> str | None:
        for placement in job.placements.all():  # prefetched by the viewset
            if placement.ended_at is None:
                return placement.node.name
        return None


class WaitingReasonCountSerializer(serializers.Serializer):
    reason = serializers.ChoiceField(choices=list(EXPLAIN_REASONS), help_text=(
        "Why these nodes do not take the job now: vram, capability, compatibility (cannot restore its checkpoint), "
        "too_small (fewer lendable GPUs than asked), reclaiming, closing (its lending window is about to end), "
        "not_lent, offline, busy (other jobs hold the GPUs)."))
    nodes = serializers.IntegerField(help_text="How many nodes.")


class WaitingReasonSerializer(serializers.Serializer):
    text = serializers.CharField(help_text="One or two sentences in plain words (design §3).")
    reasons = WaitingReasonCountSerializer(many=True)
    next_window_at = serializers.DateTimeField(allow_null=True, help_text=(
        "When the soonest lending window of a node that would fit opens; null when none is due."))


QUEUE_DETAIL_FIELDS = ["priority", "estimated_start_at", "queue_reason", "array", "after_ok", "after_any"]


class QueuePrioritySerializer(serializers.Serializer):
    value = serializers.FloatField(help_text="The sum of the terms.")
    terms = serializers.DictField(child=serializers.FloatField(), help_text='{"class", "fair_share", "age"}')
    text = serializers.CharField(help_text='"0.72 = class 0.50 + fair share 0.18 + age 0.04"')
    rank = serializers.IntegerField(help_text="Its place among the waiting jobs (1 = next).")
    computed_at = serializers.DateTimeField()


class JobArrayRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    index = serializers.IntegerField()
    spec = serializers.CharField()
    name = serializers.CharField()


class JobDetailSerializer(JobSerializer):
    """A job as its detail answers it: with why it waits, computed on read from the campus read model."""

    waiting_reason = serializers.SerializerMethodField(
        help_text="Why a queued job waits; null when it is not queued.")

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "waiting_reason", *QUEUE_DETAIL_FIELDS]
        read_only_fields = fields

    # The fair queue (design §16.6): read once per job (portal.queue.read).
    priority = serializers.SerializerMethodField(help_text=(
        "A queued job's priority and its terms (class + fair share + age), as the last control period computed "
        "them; null when not queued."))
    estimated_start_at = serializers.SerializerMethodField(help_text=(
        "When a queued job is estimated to start (an estimate: running jobs' expected runtimes); null if none."))
    queue_reason = serializers.SerializerMethodField(help_text=(
        "Why the queue holds it back: over_quota, dependency, array_throttle, reserved, behind_others; null."))
    array = serializers.SerializerMethodField(help_text="The array it belongs to: {id, index, spec, name}, or null.")
    after_ok = serializers.SerializerMethodField(help_text="Job ids it starts after, once they completed.")
    after_any = serializers.SerializerMethodField(help_text="Job ids it starts after, however they ended.")

    def _queue(self, job: Job) -> dict[str, Any]:
        cache = self.__dict__.setdefault("_queue_cache", {})
        if job.pk not in cache:
            cache[job.pk] = {**queue_read.job_queue(job), **queue_read.job_parents(job)}
        return cache[job.pk]

    @extend_schema_field(QueuePrioritySerializer(allow_null=True))
    def get_priority(self, job: Job) -> dict[str, Any] | None:
        return self._queue(job)["priority"]

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_estimated_start_at(self, job: Job) -> Any:
        value = self._queue(job)["estimated_start_at"]
        return None if value is None else serializers.DateTimeField().to_representation(value)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_queue_reason(self, job: Job) -> str | None:
        return self._queue(job)["queue_reason"]

    @extend_schema_field(JobArrayRefSerializer(allow_null=True))
    def get_array(self, job: Job) -> dict[str, Any] | None:
        return self._queue(job)["array"]

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_after_ok(self, job: Job) -> list[int]:
        return self._queue(job)["after_ok"]

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField()))
    def get_after_any(self, job: Job) -> list[int]:
        return self._queue(job)["after_any"]

    @extend_schema_field(WaitingReasonSerializer(allow_null=True))
    def get_waiting_reason(self, job: Job) -> dict[str, Any] | None:
        reason = explain.waiting_reason(job)
        return None if reason is None else WaitingReasonSerializer(reason).data


class JobSubmitSerializer(serializers.Serializer):
    name = StrictCharField(max_length=120)
    group = serializers.PrimaryKeyRelatedField(
        queryset=ResearchGroup.objects.all(), required=False,
        help_text="The group charged; may be left out by a member of exactly one group.",
    )
    command = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")
    image = StrictCharField(max_length=300, required=False, allow_blank=True, default="")
    gpu_count = StrictIntegerField(min_value=1, max_value=MAX_GPUS_PER_JOB)
    vram_gb_per_gpu = FiniteFloatField(min_value=0.0, max_value=1024, default=0.0)
    min_capability = serializers.DecimalField(max_digits=4, decimal_places=1, min_value=Decimal("0"),
                                              max_value=Decimal("99.9"), default=Decimal("0"))
    framework = StrictCharField(max_length=64, required=False, allow_blank=True, default="")
    expected_runtime_s = FiniteFloatField(min_value=1.0, max_value=MAX_RUNTIME_S)
    ckpt_bytes_estimate = StrictIntegerField(min_value=1, max_value=MAX_CKPT_BYTES)
    loss_budget_s = FiniteFloatField(min_value=1.0, max_value=MAX_RUNTIME_S, required=False, allow_null=True,
                                     default=None)
    loss_budget_mode = serializers.ChoiceField(
        choices=LossBudgetMode.choices, default=LossBudgetMode.EXPECTED, help_text=(
            "How the loss budget is read (design §2): 'expected' — the expected loss per interruption stays within "
            "loss_budget_s (Eq. 9); 'bound' — no interruption loses more than loss_budget_s unless its notice makes "
            "that impossible (checkpoints are planned closer together)."))
    restart_s = FiniteFloatField(min_value=0.0, max_value=24 * 3600.0, default=30.0)
    priority_class = serializers.ChoiceField(choices=PriorityClass.choices, default=PriorityClass.STANDARD)
    output_dir = StrictCharField(max_length=500, required=False, allow_blank=True, default="", help_text=(
        "A directory relative to the job's working directory (no absolute path, no '..'; '.' for all of it) "
        "whose files the agent uploads when the job ends, with its final checkpoint (design §14). Empty: none."))
    upload_with_checkpoints = serializers.BooleanField(
        required=False, default=False, help_text="Also upload the output directory with each checkpoint.")
    # design §19.2: the job's cgroup limits, sent in its start command (null or absent: the node's default)
    memory_bytes = StrictIntegerField(
        min_value=MIN_JOB_MEMORY_BYTES, max_value=MAX_JOB_MEMORY_BYTES, required=False, allow_null=True,
        default=None, help_text=(
            "Memory limit of the job's cgroup in bytes, 268435456 (256 MiB) to 17592186044416 (16 TiB); the job is "
            "killed if it uses more. Null or absent: the node's per-GPU default."))
    cpu_cores = FiniteFloatField(
        min_value=0.0, max_value=MAX_JOB_CPU_CORES, required=False, allow_null=True, default=None, help_text=(
            "CPU quota of the job's cgroup in cores, more than 0 and at most 1024 (fractions allowed, e.g. 0.5). "
            "Null or absent: the node's per-GPU default."))

    # The fair queue (design §16.6): checked by portal.queue.submit, errors naming the field.
    array = StrictCharField(max_length=200, required=False, allow_blank=True, default="", help_text=(
        'Submit an array: one job per index, e.g. "0-49" or "0-49%8" (at most 8 running at once); each job sees '
        "RECLAIMNET_ARRAY_INDEX. The answer is then the array and its jobs."))
    after_ok = serializers.ListField(child=StrictIntegerField(min_value=1), required=False, default=list,
                                     max_length=100, help_text=(
                                         "Job ids this job waits for; it starts once every one completed, and is "
                                         "cancelled if one fails or is cancelled."))
    after_any = serializers.ListField(child=StrictIntegerField(min_value=1), required=False, default=list,
                                      max_length=100, help_text="Job ids this job waits for, however they end.")

    def validate_cpu_cores(self, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise serializers.ValidationError("Must be more than 0 cores.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs.get("command", "").strip() and not attrs.get("image", "").strip():
            raise serializers.ValidationError({"command": ["Give a command or a container image."]})
        return attrs


# --- summary -------------------------------------------------------------------------------------------------------


class MigrationTotalsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    planned = serializers.IntegerField()
    degraded = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    success_rate = serializers.FloatField(allow_null=True)


class SummarySerializer(serializers.Serializer):
    nodes_by_state = serializers.DictField(child=serializers.IntegerField())
    jobs_by_state = serializers.DictField(child=serializers.IntegerField())
    reclaims_by_kind = serializers.DictField(child=serializers.IntegerField())
    gpus_total = serializers.IntegerField()
    gpus_lendable_online = serializers.IntegerField()
    gpus_busy = serializers.IntegerField()
    gpu_utilization = serializers.FloatField()
    migrations = MigrationTotalsSerializer()
    work_lost_s = serializers.FloatField()
    work_lost_gpu_hours = serializers.FloatField()


class TopologyLinkSerializer(serializers.Serializer):
    id = serializers.CharField()
    a = serializers.CharField()
    b = serializers.CharField()
    bytes_per_s = serializers.FloatField()


class TopologyNodeSerializer(serializers.Serializer):
    id = serializers.CharField()
    building = serializers.CharField()
    free_gpus = serializers.IntegerField()
    vram_gb = serializers.FloatField()
    capability = serializers.FloatField()
    hazard_per_s_by_hour = serializers.ListField(child=serializers.FloatField(), min_length=24, max_length=24)


class TopologySerializer(serializers.Serializer):
    buildings = BuildingSerializer(many=True)
    switches = SwitchSerializer(many=True)
    links = TopologyLinkSerializer(many=True)
    nodes = TopologyNodeSerializer(many=True)

