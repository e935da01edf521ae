"""What-if evaluations in Django admin: read-only (they are started from /whatif/ or the API)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from portal.whatif.models import Evaluation


@admin.register(Evaluation)
class EvaluationAdmin(admin.ModelAdmin):
    list_display = ("id", "created_by", "created_at", "source", "trace_name", "state", "progress")
    list_filter = ("state", "source")
    exclude = ("trace_gz",)
    readonly_fields = ("created_by", "created_at", "updated_at", "started_at", "finished_at", "source",
                       "history_days", "trace_name", "policies", "seeds", "state", "progress", "progress_label",
                       "error", "report")

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False
