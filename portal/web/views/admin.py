"""The admin dashboard (staff only) and the CSV export of each of its tables. Numbers come from
``portal.web.dashboard``; this module only declares who may see them, reads the time range from the URL
(``range``, ``from``, ``to``: bookmarkable) and sends them."""

from __future__ import annotations

import csv
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from portal.web import dashboard
from portal.web.access import is_admin

PRESET_LABELS = [("24h", "24 hours"), ("7d", "7 days"), ("30d", "30 days"), ("custom", "Custom")]


def _require_admin(request: HttpRequest) -> None:
    if not is_admin(request.user):
        raise Http404("the dashboard is for admins")


def _window(request: HttpRequest) -> tuple[dashboard.Window | None, dict[str, str]]:
    try:
        return dashboard.parse_window(request.GET), {}
    except dashboard.WindowError as refused:
        return None, refused.errors


def _form(request: HttpRequest, window: dashboard.Window | None) -> dict[str, Any]:
    """What the range picker shows: the range asked for (echoed as typed when it was refused)."""
    selected = window.key if window is not None else (request.GET.get("range") or "custom")
    custom = window is not None and window.key == "custom"
    return {
        "presets": PRESET_LABELS,
        "selected": selected,
        "from_value": str(window.from_date) if custom else (request.GET.get("from") or "")[:40],
        "to_value": str(window.to_date) if custom else (request.GET.get("to") or "")[:40],
        "today": timezone.localdate().isoformat(),
        "tz": timezone.get_current_timezone_name(),
        "max_days": dashboard.MAX_RANGE_DAYS,
    }


@login_required
def dashboard_page(request: HttpRequest) -> HttpResponse:
    """The dashboard for the range in the URL; a range it cannot show answers 400 with the picker and what to
    change."""
    _require_admin(request)
    window, errors = _window(request)
    if request.GET.get("fragment") == "summary":
        if window is None:
            return HttpResponse(" ".join(errors.values()), status=400, content_type="text/plain; charset=utf-8")
        return HttpResponse(dashboard.build(window)["summary_html"])
    context: dict[str, Any] = {"window": window, "errors": errors, "form": _form(request, window)}
    if window is not None:
        data = dashboard.build(window)
        context["summary_html"] = dashboard.html(data["summary_html"])
        context["cards_html"] = dashboard.html(data["cards_html"])
        context["panels_html"] = dashboard.html(data["panels_html"])
    return render(request, "web/dashboard/index.html", context, status=400 if errors else 200)


@login_required
def dashboard_data(request: HttpRequest) -> HttpResponse:
    """The charts' data as JSON, for the live refresh (the page embeds the same data on first render)."""
    _require_admin(request)
    window, errors = _window(request)
    if window is None:
        return JsonResponse({field: [message] for field, message in errors.items()}, status=400)
    return JsonResponse(dashboard.build(window)["charts"])


@login_required
def export_csv(request: HttpRequest, name: str) -> HttpResponse:
    _require_admin(request)
    if name not in dashboard.TABLES:
        raise Http404("no such table")
    window, errors = _window(request)
    if window is None:
        return HttpResponse(" ".join(errors.values()), status=400, content_type="text/plain; charset=utf-8")
    table = dashboard.TABLES[name](window)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="reclaimnet-{name}.csv"'
    writer = csv.writer(response)
    writer.writerow(table.columns)
    writer.writerows([["" if v is None else v for v in row] for row in table.rows])
    return response
