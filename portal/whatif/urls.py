"""``/whatif/`` pages (included from ``portal/urls.py``)."""

from __future__ import annotations

from django.urls import path

from portal.whatif import views

app_name = "whatif"

urlpatterns = [
    path("", views.index, name="index"),
    path("<int:evaluation_id>/", views.detail, name="detail"),
    path("<int:evaluation_id>/progress.json", views.progress, name="progress"),
    path("<int:evaluation_id>/report.json", views.report_json, name="report-json"),
    path("<int:evaluation_id>/report.csv", views.report_csv, name="report-csv"),
    path("<int:evaluation_id>/pareto.svg", views.report_svg, name="report-svg"),
]
