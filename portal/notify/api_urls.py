"""``/api/notify/`` routes (included from ``portal/core/api/urls.py``; design §12)."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from portal.notify.api import DeliveryViewSet, PreferenceViewSet, WebhookViewSet

router = SimpleRouter()
router.register("preferences", PreferenceViewSet, basename="notify-preference")
router.register("webhooks", WebhookViewSet, basename="notify-webhook")
router.register("deliveries", DeliveryViewSet, basename="notify-delivery")

urlpatterns = router.urls
