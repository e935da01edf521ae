"""Django admin for the control plane's loans tables (design §15): the ladder is edited here; what the watchdog
knows of each job and the evictions are read-only (the control plane writes them)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from portal.control.models import ClassPolicy, Eviction, JobActivity


@admin.register(ClassPolicy)
class ClassPolicyAdmin(admin.ModelAdmin):
    """One row per priority class; the ladder page, the API, the form and the tick read it within seconds."""

    list_display = ["priority_class", "rank", "max_gpus_per_job", "max_loan_s", "loan_end", "idle_watch",
                    "idle_limit_s", "notice_s", "grace_s"]
    list_editable = ["idle_watch"]
    ordering = ["rank"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # every class keeps its row

    def has_add_permission(self, request: HttpRequest) -> bool:
        return ClassPolicy.objects.count() < 3


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(JobActivity)
class JobActivityAdmin(ReadOnlyAdmin):
    list_display = ["job", "gpu_util_pct", "step", "reported_at", "busy_at", "held_s", "warning", "release_at"]
    list_filter = ["warning"]
    search_fields = ["job__name"]
    list_select_related = ["job"]


@admin.register(Eviction)
class EvictionAdmin(ReadOnlyAdmin):
    list_display = ["job", "reason", "then", "phase", "requested_at", "deadline_at", "finished_at", "work_lost_s"]
    list_filter = ["reason", "phase", "then"]
    search_fields = ["job__name"]
    list_select_related = ["job"]
