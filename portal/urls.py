"""Root URL configuration."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from portal.core.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/", include("portal.core.api.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("", include("portal.web.urls")),
]
