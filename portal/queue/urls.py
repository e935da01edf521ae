"""Array pages (design §16.6). Included at "/jobs/arrays/" by portal/urls.py."""

from __future__ import annotations

from django.urls import path

from portal.queue import views

app_name = "queue"

urlpatterns = [
    path("<int:array_id>/", views.array_detail, name="array-detail"),
    path("<int:array_id>/cancel/", views.array_cancel, name="array-cancel"),
]
