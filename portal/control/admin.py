"""Django admin for the control plane's loans tables (design §15): the ladder is edited here; what the watchdog
knows of each job and the evictions are read-only (the control plane writes them)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from portal.control.models import ClassPolicy, Eviction, JobActivity
from portal.control.reserve import ReserveError, set_reserve_override, validate_override
from portal.core.models import LinkClassSample, LinkReserve


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


@admin.register(LinkReserve)
class LinkReserveAdmin(admin.ModelAdmin):
    """The research reserve per link (design §4 "Calibrated reserve"): the daily calibration writes it; an admin
    sets or clears ``override_bytes_per_s`` here (validated, audited, the effective reserve recomputed)."""

    list_display = ["link", "reserve_bytes_per_s", "source", "calibrated_bytes_per_s", "p95_share", "samples",
                    "override_bytes_per_s", "calibrated_at"]
    list_filter = ["source"]
    fields = ["link", "reserve_bytes_per_s", "source", "calibrated_bytes_per_s", "p95_share", "samples",
              "calibrated_at", "override_bytes_per_s"]
    readonly_fields = ["reserve_bytes_per_s", "source", "calibrated_bytes_per_s", "p95_share", "samples",
                       "calibrated_at"]
    list_select_related = ["link"]
    search_fields = ["link__name"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*self.readonly_fields, "link"] if obj is not None else list(self.readonly_fields)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, change=change, **kwargs)

        class ReserveForm(form):  # type: ignore[misc, valid-type]
            def clean(self) -> dict[str, Any]:
                data = super().clean()
                link = data.get("link") or getattr(self.instance, "link", None)
                if link is not None:
                    try:
                        validate_override(link, data.get("override_bytes_per_s"))
                    except ReserveError as exc:
                        self.add_error(exc.field, str(exc))
                return data

        return ReserveForm

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        obj.pk = set_reserve_override(request.user, obj.link, obj.override_bytes_per_s).pk

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the calibration keeps one row per link


@admin.register(LinkClassSample)
class LinkClassSampleAdmin(ReadOnlyAdmin):
    """Bytes per traffic class per link, as the agents reported them (design §4 "Calibrated reserve")."""

    list_display = ["link", "scope", "node", "sampled_at", "interval_s", "research_bytes", "checkpoint_bytes",
                    "other_bytes", "source"]
    list_filter = ["scope", "link__kind"]
    search_fields = ["link__name", "node__name"]
    list_select_related = ["link", "node"]
