"""``/api/`` routes (included from ``portal/urls.py``)."""

from __future__ import annotations

from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.authtoken.views import obtain_auth_token
from rest_framework.permissions import AllowAny
from rest_framework.routers import DefaultRouter

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
from portal.core.api.views_nodes import NodeViewSet
from portal.core.api.views_output import JobOutputView

router = DefaultRouter()
router.register("nodes", NodeViewSet, basename="node")
router.register("jobs", JobViewSet, basename="job")
router.register("reclaims", ReclaimViewSet, basename="reclaim")
router.register("providers", ProviderViewSet, basename="provider")
router.register("groups", ResearchGroupViewSet, basename="group")
router.register("campus/buildings", BuildingViewSet, basename="building")
router.register("campus/switches", SwitchViewSet, basename="switch")
router.register("campus/links", LinkViewSet, basename="link")



urlpatterns = [
    path("auth/token/", obtain_auth_token, name="api-token"),
    path("me/", MeView.as_view(), name="api-me"),
    path("summary/", SummaryView.as_view(), name="api-summary"),
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
    path("", include(router.urls)),
    # Last: any other path ending in "/" (an id the router's pattern refuses, an unknown route) answers JSON.
    re_path(r"^.*/$", ApiNotFoundView.as_view(), name="api-not-found"),
]
