"""``/api/`` routes (included from ``portal/urls.py``)."""

from __future__ import annotations

from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.authtoken.views import obtain_auth_token
from rest_framework.permissions import AllowAny
from rest_framework.routers import DefaultRouter

from portal.core.api.views_auth import TokenRevokeView
from portal.core.api.views_campus import (
    ApiNotFoundView,
    BuildingViewSet,
    LinkViewSet,
    MeView,
    ProviderViewSet,
    ReclaimViewSet,
    ResearchGroupViewSet,
    SummaryView,
    SwitchViewSet,
    TopologyView,
    decide_view,
)
from portal.core.api.views_jobs import JobViewSet
from portal.core.api.views_ladder import LadderView
from portal.core.api.views_nodes import NodeViewSet
from portal.core.api.views_output import JobOutputView
from portal.core.api.views_reserve import LinkReserveView
from portal.core.api.views_results import (
    JobCheckpointView,
    JobResultFileView,
    JobResultsView,
    agent_complete_view,
    agent_manifest_view,
    agent_upload_view,
)
from portal.queue.api import JobArrayViewSet

router = DefaultRouter()
router.register("nodes", NodeViewSet, basename="node")
router.register("jobs", JobViewSet, basename="job")
router.register("arrays", JobArrayViewSet, basename="array")  # design §16.6
router.register("reclaims", ReclaimViewSet, basename="reclaim")
router.register("providers", ProviderViewSet, basename="provider")
router.register("groups", ResearchGroupViewSet, basename="group")
router.register("campus/buildings", BuildingViewSet, basename="building")
router.register("campus/switches", SwitchViewSet, basename="switch")
router.register("campus/links", LinkViewSet, basename="link")



urlpatterns = [
    path("auth/token/", obtain_auth_token, name="api-token"),
    path("auth/token/revoke/", TokenRevokeView.as_view(), name="api-token-revoke"),  # design §13
    path("me/", MeView.as_view(), name="api-me"),
    path("summary/", SummaryView.as_view(), name="api-summary"),
    path("ladder/", LadderView.as_view(), name="api-ladder"),  # design §15
    path("campus/topology/", TopologyView.as_view(), name="api-topology"),
    path("decide/p1/", decide_view("p1"), name="api-decide-p1"),
    path("decide/p2/", decide_view("p2"), name="api-decide-p2"),
    path("decide/p3/", decide_view("p3"), name="api-decide-p3"),
    # The schema and its docs pages are public (a visitor can read the API before signing in); they
    # describe the API, and every endpoint they describe still requires authentication.
    path("schema/", SpectacularAPIView.as_view(permission_classes=[AllowAny]), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema", permission_classes=[AllowAny]),
         name="api-docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api-schema", permission_classes=[AllowAny]),
         name="api-redoc"),
    path("jobs/<int:id>/output/", JobOutputView.as_view(), name="api-job-output"),
    # Job results (design §14): researchers read them; agents upload them with their node token.
    path("jobs/<int:id>/results/", JobResultsView.as_view(), name="api-job-results"),
    path("jobs/<int:id>/results/files/<path:file_path>", JobResultFileView.as_view(), name="api-job-result-file"),
    # Any other path under a job's results/files (an id that is not a number, a path with a line break) answers
    # JSON 404 itself: with no trailing slash, the catch-all below would only redirect it.
    re_path(r"^jobs/[^/]+/results/files/[\s\S]*$", ApiNotFoundView.as_view(), name="api-job-result-file-not-found"),
    path("jobs/<int:id>/checkpoint/", JobCheckpointView.as_view(), name="api-job-checkpoint"),
    path("agent/jobs/<int:job_id>/results/", agent_manifest_view, name="api-agent-results"),
    path("agent/jobs/<int:job_id>/results/complete/", agent_complete_view, name="api-agent-results-complete"),
    path("agent/jobs/<int:job_id>/results/<str:kind>/<path:file_path>", agent_upload_view,
         name="api-agent-results-upload"),
    path("notify/", include("portal.notify.api_urls")),  # mail and webhooks (design §12)
    path("campus/links/<int:id>/reserve/", LinkReserveView.as_view(), name="api-link-reserve"),  # design §4
    path("whatif/", include("portal.whatif.api_urls")),  # what-if evaluations (design §7)
    path("", include(router.urls)),
    # Last: any other path ending in "/" (an id the router's pattern refuses, an unknown route, one holding a line
    # break, which "." would not match) answers JSON.
    re_path(r"^[\s\S]*/$", ApiNotFoundView.as_view(), name="api-not-found"),
]
