"""``/api/whatif/`` routes (included from ``portal/core/api/urls.py``)."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from portal.whatif.api import EvaluationViewSet

router = SimpleRouter()
router.register("evaluations", EvaluationViewSet, basename="whatif-evaluation")

urlpatterns = router.urls
