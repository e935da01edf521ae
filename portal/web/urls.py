"""Page routes (provider, researcher, admin dashboard). Included at "/" by portal/urls.py."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from portal.web.views import admin, common, provider, researcher

app_name = "web"

urlpatterns: list[URLPattern | URLResolver] = [
    path("", common.home, name="home"),
    # provider
    path("provider/", provider.provider_home, name="provider-home"),
    path("provider/reclaims/", provider.reclaim_history, name="reclaim-history"),
    path("provider/nodes/register/", provider.register_node, name="node-register"),
    path("provider/nodes/<int:node_id>/", provider.node_detail, name="node-detail"),
    path("provider/nodes/<int:node_id>/settings/", provider.node_settings, name="node-settings"),
    path("provider/nodes/<int:node_id>/token/", provider.rotate_token, name="node-token"),
    path("provider/nodes/<int:node_id>/reclaim/", provider.reclaim_dialog, name="reclaim-dialog"),
    path("provider/nodes/<int:node_id>/reclaim/confirm/", provider.reclaim_confirm, name="reclaim-confirm"),
    path("provider/nodes/<int:node_id>/reclaim/emergency/", provider.emergency_reclaim, name="reclaim-emergency"),
    path("provider/nodes/<int:node_id>/reclaim/killswitch/", provider.killswitch, name="reclaim-killswitch"),
    path("provider/nodes/<int:node_id>/lend-again/", provider.lend_again, name="node-lend-again"),
    # researcher
    path("jobs/", researcher.job_list, name="job-list"),
    path("jobs/new/", researcher.job_submit, name="job-submit"),
    path("jobs/<int:job_id>/", researcher.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel/", researcher.job_cancel, name="job-cancel"),
    path("jobs/<int:job_id>/output/", researcher.job_output, name="job-output"),
    # admin
    path("dashboard/", admin.dashboard_page, name="dashboard"),
    path("dashboard/charts.json", admin.dashboard_data, name="dashboard-data"),
    path("dashboard/export/<slug:name>.csv", admin.export_csv, name="dashboard-export"),
]
