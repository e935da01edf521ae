"""Django admin for every model. States are read-only here: only the lifecycles move them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from portal.core import models as m

admin.site.site_header = "ReclaimNet administration"  # not "Django administration"
admin.site.site_title = "ReclaimNet admin"
admin.site.index_title = "Campus records"


class GpuInline(admin.TabularInline):
    model = m.Gpu
    extra = 0


class LendingWindowInline(admin.TabularInline):
    model = m.LendingWindow
    extra = 0


class PlacementInline(admin.TabularInline):
    model = m.Placement
    extra = 0
    readonly_fields = ["started_at"]


@admin.register(m.Building)
class BuildingAdmin(admin.ModelAdmin):
    list_display = ["name"]
    search_fields = ["name"]


@admin.register(m.Switch)
class SwitchAdmin(admin.ModelAdmin):
    list_display = ["name", "tier", "building"]
    list_filter = ["tier", "building"]
    search_fields = ["name"]


@admin.register(m.Link)
class LinkAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "upper", "lower_switch", "capacity_bytes_per_s"]
    list_filter = ["kind"]
    search_fields = ["name", "upper__name"]
    list_select_related = ["upper", "lower_switch"]


@admin.register(m.Provider)
class ProviderAdmin(admin.ModelAdmin):
    list_display = ["name", "slug"]
    search_fields = ["name", "slug", "members__username"]
    prepopulated_fields = {"slug": ["name"]}
    filter_horizontal = ["members"]


@admin.register(m.ResearchGroup)
class ResearchGroupAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "gpu_hours_used", "gpu_hours_lost_to_reclaims"]
    search_fields = ["name", "slug", "members__username"]
    prepopulated_fields = {"slug": ["name"]}
    filter_horizontal = ["members"]


@admin.register(m.Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "provider", "building", "state", "gpu_floor", "killswitch_engaged", "last_heartbeat_at"]
    list_filter = ["state", "provider", "building", "killswitch_engaged", "agent_token_revoked"]
    search_fields = ["name", "provider__name"]
    list_select_related = ["provider", "building"]
    # The token digest is shown, never editable; tokens are rotated through the API or the provider pages.
    readonly_fields = ["state", "agent_token_hash", "agent_token_prefix", "agent_token_revoked",
                       "killswitch_engaged", "last_heartbeat_at", "created_at"]
    inlines = [GpuInline, LendingWindowInline]


@admin.register(m.Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["node", "index", "model", "vram_gb", "compute_capability", "driver_version", "cuda_version"]
    list_filter = ["model", "compute_capability"]
    search_fields = ["node__name", "model", "uuid"]
    list_select_related = ["node"]


@admin.register(m.LendingWindow)
class LendingWindowAdmin(admin.ModelAdmin):
    list_display = ["node", "weekday", "start_time", "end_time"]
    list_filter = ["weekday"]
    search_fields = ["node__name"]


@admin.register(m.Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "owner", "group", "state", "gpu_count", "priority_class", "submitted_at"]
    list_filter = ["state", "priority_class", "group", "loss_budget_at_risk"]
    search_fields = ["name", "owner__username", "group__name", "command", "image"]
    list_select_related = ["owner", "group"]
    readonly_fields = ["state", "submitted_at", "started_at", "finished_at"]
    inlines = [PlacementInline]


@admin.register(m.Placement)
class PlacementAdmin(admin.ModelAdmin):
    list_display = ["job", "node", "started_at", "ended_at", "end_reason"]
    list_filter = ["end_reason"]
    search_fields = ["job__name", "node__name"]
    list_select_related = ["job", "node"]


@admin.register(m.Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ["job", "sequence", "node", "size_bytes", "taken_at", "completed_at", "gpu_model"]
    list_filter = ["gpu_model", "framework"]
    search_fields = ["job__name", "sha256"]
    list_select_related = ["job", "node"]
    filter_horizontal = ["replica_nodes"]


@admin.register(m.ReclaimEvent)
class ReclaimEventAdmin(admin.ModelAdmin):
    list_display = ["id", "node", "kind", "notice_s", "requested_by", "requested_at", "deadline_at", "outcome"]
    list_filter = ["kind", "outcome"]
    search_fields = ["node__name", "requested_by__username"]
    list_select_related = ["node", "requested_by"]
    readonly_fields = ["requested_at"]


@admin.register(m.Migration)
class MigrationAdmin(admin.ModelAdmin):
    list_display = ["id", "job", "source", "destination", "mode", "bytes", "work_lost_s", "downtime_s", "success"]
    list_filter = ["mode", "success", "degraded_reason"]
    search_fields = ["job__name", "source__name", "destination__name"]
    list_select_related = ["job", "source", "destination"]


@admin.register(m.BandwidthSample)
class BandwidthSampleAdmin(admin.ModelAdmin):
    list_display = ["link", "node", "sampled_at", "bytes_per_s"]
    list_filter = ["link__kind"]
    search_fields = ["link__name", "node__name"]
    list_select_related = ["link", "node"]


@admin.register(m.LinkEstimate)
class LinkEstimateAdmin(admin.ModelAdmin):
    list_display = ["link", "mean_bytes_per_s", "lower_bytes_per_s", "updated_at"]
    search_fields = ["link__name"]
    list_select_related = ["link"]


@admin.register(m.NodeAvailability)
class NodeAvailabilityAdmin(admin.ModelAdmin):
    """The record exposure is computed from: read-only (the node lifecycle writes it)."""

    list_display = ["node", "state", "lent", "at"]
    list_filter = ["lent", "state"]
    search_fields = ["node__name"]
    list_select_related = ["node"]
    date_hierarchy = "at"

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(m.HazardEstimate)
class HazardEstimateAdmin(admin.ModelAdmin):
    list_display = ["scope", "node", "provider", "hour_of_day", "hazard_per_s", "hazard_upper_per_s", "updated_at"]
    list_filter = ["scope", "hour_of_day"]
    search_fields = ["node__name", "provider__name"]
    list_select_related = ["node", "provider"]


class AppendOnlyAdmin(admin.ModelAdmin):
    """Logs are evidence ("why did my job go there?", "who did what"): viewable, never added, edited or deleted
    by hand, not even by an admin (the services and the control plane write them)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(m.DecisionLog)
class DecisionLogAdmin(AppendOnlyAdmin):
    list_display = ["decision_id", "kind", "created_at", "job", "reclaim"]
    list_filter = ["kind"]
    search_fields = ["decision_id", "job__name"]
    readonly_fields = ["decision_id", "created_at"]


@admin.register(m.AuditLog)
class AuditLogAdmin(AppendOnlyAdmin):
    list_display = ["at", "actor", "action", "object_type", "object_id"]
    list_filter = ["action", "object_type"]
    search_fields = ["actor__username", "action", "object_id"]
    readonly_fields = ["at"]


@admin.register(m.OutboxMessage)
class OutboxMessageAdmin(AppendOnlyAdmin):
    """Work queued for the control plane: pending rows show what a broker outage is holding back."""

    list_display = ["id", "task_name", "args", "created_at", "available_at", "attempts", "sent_at", "last_error"]
    list_filter = ["task_name"]
    search_fields = ["task_name", "message_id"]


@admin.register(m.IdempotencyKey)
class IdempotencyKeyAdmin(AppendOnlyAdmin):
    list_display = ["key", "user", "scope", "response_status", "created_at"]
    search_fields = ["key", "user__username"]
    list_select_related = ["user"]


@admin.register(m.JobOutput)
class JobOutputAdmin(AppendOnlyAdmin):
    list_display = ["job", "runs", "start_offset", "end_offset", "run_node", "updated_at"]
    search_fields = ["job__name"]
    list_select_related = ["job", "run_node"]


@admin.register(m.JobOutputChunk)
class JobOutputChunkAdmin(AppendOnlyAdmin):
    list_display = ["job", "start_offset", "end_offset"]
    search_fields = ["job__name", "text"]
    list_select_related = ["job"]


@admin.register(m.GroupResultsCap)
class GroupResultsCapAdmin(admin.ModelAdmin):
    """A research group's cap on the job results it keeps on the portal (design §14); without a row the
    settings default RECLAIMNET_RESULTS_GROUP_CAP_BYTES applies."""

    list_display = ["group", "cap_bytes"]
    list_select_related = ["group"]
    search_fields = ["group__name"]


@admin.register(m.JobResults)
class JobResultsAdmin(AppendOnlyAdmin):
    """A job's results as its agent uploaded them (design §14); read here, written by the upload endpoint."""

    list_display = ["job", "state", "total_bytes", "refused_reason", "updated_at"]
    list_filter = ["state"]
    search_fields = ["job__name"]
    list_select_related = ["job"]


@admin.register(m.JobResultFile)
class JobResultFileAdmin(AppendOnlyAdmin):
    list_display = ["job", "kind", "path", "size_bytes", "sha256", "uploaded_at"]
    list_filter = ["kind"]
    search_fields = ["job__name", "path"]
    list_select_related = ["job"]
