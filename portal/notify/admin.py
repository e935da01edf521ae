"""Django admin for the notify app (design §12)."""

from __future__ import annotations

from django.contrib import admin

from portal.notify.models import Attempt, Delivery, Preference, StoredMail, Webhook


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ["pk", "name", "url", "user", "group", "provider", "enabled", "created_at"]
    exclude = ["secret"]


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    readonly_fields = ["number", "at", "status_code", "error", "duration_ms"]


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["pk", "event", "channel", "target", "status", "attempts", "last_status_code", "created_at"]
    list_filter = ["channel", "status", "event"]
    inlines = [AttemptInline]


admin.site.register(Preference)
admin.site.register(StoredMail)
