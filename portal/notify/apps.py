"""The notify app (design §12): on ready, joins ``portal.core.events.DELIVERIES``."""

from __future__ import annotations

from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "portal.notify"
    label = "notify"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Notifications"

    def ready(self) -> None:
        from portal.core import events
        from portal.notify import dispatch

        if dispatch.queue_notice not in events.DELIVERIES:
            events.DELIVERIES.append(dispatch.queue_notice)
