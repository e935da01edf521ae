"""Root URL configuration."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.templatetags.static import static
from django.urls import include, path

from portal.core.metrics import metrics_view
from portal.sso import views as sso_views
from portal.web.views import loans as loans_views


def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico on their own: send them to the SVG the pages link (portal/web/static/web/)."""
    return redirect(static("web/favicon.svg"), permanent=True)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/logout/", sso_views.LogoutView.as_view(), name="logout"),  # also ends a campus session
    path("accounts/", include("django.contrib.auth.urls")),
    path("oidc/", include("portal.sso.urls")),  # campus sign-in (design §20); 404 while it is off
    path("api/", include("portal.core.api.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("favicon.ico", favicon, name="favicon"),
    path("notify/", include("portal.notify.urls")),  # mail, webhooks, preferences (design §12)
    path("whatif/", include("portal.whatif.urls")),  # what-if evaluations (design §7)
    path("jobs/arrays/", include("portal.queue.urls")),  # design §16.6
    path("ladder/", loans_views.ladder_page, name="ladder"),  # design §15
    path("jobs/<int:job_id>/resume/", loans_views.job_resume, name="job-resume"),  # design §15
    path("", include("portal.web.urls")),
]
