"""Quotas, shares and fair-share settings are edited in Django admin (design §16.6)."""

from __future__ import annotations

from django.contrib import admin

from portal.queue.models import (
    ArrayTask,
    FairShareConfig,
    GroupQuota,
    JobArray,
    JobDependency,
    QueueEntry,
    UserQuota,
)


@admin.register(FairShareConfig)
class FairShareConfigAdmin(admin.ModelAdmin):
    list_display = ("__str__", "half_life_s", "weight_class", "weight_fair_share", "weight_age", "backfill",
                    "preempt_over_quota")

    def has_add_permission(self, request) -> bool:  # type: ignore[no-untyped-def]
        return not FairShareConfig.objects.exists()

    def save_model(self, request, obj, form, change) -> None:  # type: ignore[no-untyped-def]
        obj.pk = 1  # one row
        super().save_model(request, obj, form, change)


@admin.register(GroupQuota)
class GroupQuotaAdmin(admin.ModelAdmin):
    list_display = ("group", "max_gpus", "max_gpu_hours_30d", "share")
    list_select_related = ("group",)


@admin.register(UserQuota)
class UserQuotaAdmin(admin.ModelAdmin):
    list_display = ("group", "user", "max_gpus", "max_gpu_hours_30d")
    list_select_related = ("group", "user")
    raw_id_fields = ("user",)


class ArrayTaskInline(admin.TabularInline):
    model = ArrayTask
    raw_id_fields = ("job",)
    extra = 0


@admin.register(JobArray)
class JobArrayAdmin(admin.ModelAdmin):
    list_display = ("name", "group", "owner", "spec", "size", "throttle", "submitted_at")
    list_select_related = ("group", "owner")
    inlines = [ArrayTaskInline]


@admin.register(JobDependency)
class JobDependencyAdmin(admin.ModelAdmin):
    list_display = ("job", "parent", "kind")
    raw_id_fields = ("job", "parent")


@admin.register(QueueEntry)
class QueueEntryAdmin(admin.ModelAdmin):
    list_display = ("job", "rank", "priority", "reason", "estimated_start_at", "computed_at")
    raw_id_fields = ("job",)
