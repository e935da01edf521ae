"""The admin dashboard (staff only) and the CSV export of each of its tables. Numbers come from
``portal.web.dashboard``; this module only declares who may see them and how they are sent."""

from __future__ import annotations

import csv

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from portal.web import dashboard
from portal.web.access import is_admin


def _require_admin(request: HttpRequest) -> None:
    if not is_admin(request.user):
        raise Http404("the dashboard is for admins")


@login_required
def dashboard_page(request: HttpRequest) -> HttpResponse:
    _require_admin(request)
    data = dashboard.build()
    if request.GET.get("fragment") == "summary":
        return render(request, "web/dashboard/_summary.html", data)
    return render(request, "web/dashboard/index.html", data)


@login_required
def dashboard_data(request: HttpRequest) -> HttpResponse:
    """The charts' data as JSON, for the live refresh (the page embeds the same data on first render)."""
    _require_admin(request)
    return JsonResponse(dashboard.build()["charts"])


@login_required
def export_csv(request: HttpRequest, name: str) -> HttpResponse:
    _require_admin(request)
    if name not in dashboard.TABLES:
        raise Http404("no such table")
    table = dashboard.TABLES[name]()
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="reclaimnet-{name}.csv"'
    writer = csv.writer(response)
    writer.writerow(table.columns)
    writer.writerows([["" if v is None else v for v in row] for row in table.rows])
    return response
