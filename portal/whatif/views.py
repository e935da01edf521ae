"""The what-if pages (staff only; anyone else signed in gets 403): the list with the start form, one evaluation
with its live progress bar and then its report, and the downloads (design §7 "The what-if report")."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_http_methods

from portal.core.permissions import is_admin
from portal.web.views.common import submit_once
from portal.whatif import services
from portal.whatif.models import Evaluation, EvaluationState, TraceSource
from portal.whatif.upload import UploadError
from scheduler.sim.whatif import TIE_PCT, pareto_svg, simpler_wins, to_csv

FORM_FIELDS = ("source", "days", "policies", "seeds", "trace")


class StartForm(forms.Form):
    source = forms.ChoiceField(choices=[(TraceSource.HISTORY, "The portal's history"),
                                        (TraceSource.UPLOAD, "An uploaded trace")],
                               initial=TraceSource.HISTORY, widget=forms.RadioSelect)
    days = forms.IntegerField(min_value=1, max_value=366, initial=30, required=False,
                              label="Last N days of history")
    policies = forms.MultipleChoiceField(choices=[(p, p) for p in services.OFFERED_POLICIES],
                                         initial=list(services.DEFAULT_POLICIES),
                                         widget=forms.CheckboxSelectMultiple)
    seeds = forms.CharField(initial="0", max_length=200, help_text="Comma-separated, e.g. 0,1,2")
    trace = forms.FileField(required=False, label="Trace file",
                            help_text="A design §7 JSON file, or the CSV folder as a zip")


def _require_admin(request: HttpRequest) -> None:
    if not is_admin(request.user):
        raise PermissionDenied("What-if evaluations are for campus admins.")


def _evaluation(request: HttpRequest, evaluation_id: int) -> Evaluation:
    _require_admin(request)
    return get_object_or_404(Evaluation.objects.defer("trace_gz"), pk=evaluation_id)


@login_required
@require_http_methods(["GET", "POST"])
def index(request: HttpRequest) -> HttpResponse:
    """The evaluations (newest first) and the form that starts one."""
    _require_admin(request)
    services.expire_stale()
    form = StartForm(request.POST or None, request.FILES or None)
    if request.method == "POST":
        def start() -> HttpResponse:
            if not form.is_valid():
                return _page(request, form, status=400)
            data = form.cleaned_data
            upload = None
            file = data.get("trace")
            if data["source"] == TraceSource.UPLOAD and file is not None:
                limit, _ = services.upload_limits()
                upload = (file.name or "trace", file.read(limit + 1))
            try:
                ev = services.create_evaluation(request.user, policies=data["policies"],
                                                seeds=services.parse_seeds(data["seeds"]), source=data["source"],
                                                days=data.get("days"), upload=upload)
            except UploadError as e:
                where = f" ({e.file})" if e.file else ""
                form.add_error(e.field if e.field in FORM_FIELDS else "trace",
                               f"{e.field}: {e.message}{where}" if e.field not in FORM_FIELDS else e.message)
                return _page(request, form, status=400)
            return redirect("whatif:detail", evaluation_id=ev.pk)

        return submit_once(request, start)
    return _page(request, form)


def _page(request: HttpRequest, form: StartForm, status: int = 200) -> HttpResponse:
    evaluations = Evaluation.objects.defer("trace_gz", "report").select_related("created_by")[:100]
    return render(request, "whatif/index.html", {"form": form, "evaluations": evaluations}, status=status)


@login_required
@require_GET
def detail(request: HttpRequest, evaluation_id: int) -> HttpResponse:
    ev = _evaluation(request, evaluation_id)
    context: dict[str, Any] = {"ev": ev, "running": ev.state in (EvaluationState.QUEUED, EvaluationState.RUNNING)}
    if ev.state == EvaluationState.DONE and ev.report:
        report = ev.report
        context.update({
            "table": report.get("table", []), "runs": report.get("runs", []),
            "group_classes": [c for c in report.get("classes", []) if c["kind"] == "group"],
            "ckpt_classes": [c for c in report.get("classes", []) if c["kind"] == "checkpoint"],
            "trace": report.get("trace", {}),
            "simpler_wins": simpler_wins(report),  # computed here too, so reports stored before it have it
            "has_reclaimnet": any(r.get("policy") == "reclaimnet" for r in report.get("table", [])),
            "tie_pct": TIE_PCT,
            # built from the report's numbers, every name escaped (scheduler.sim.whatif.pareto_svg)
            "pareto_svg": mark_safe(pareto_svg(report)),
        })
    return render(request, "whatif/detail.html", context)


@login_required
@require_GET
def progress(request: HttpRequest, evaluation_id: int) -> JsonResponse:
    """What the progress bar polls (every second while queued or running)."""
    ev = _evaluation(request, evaluation_id)
    return JsonResponse({"id": ev.pk, "state": ev.state, "progress": ev.progress, "label": ev.progress_label,
                         "error": ev.error})


def _report(request: HttpRequest, evaluation_id: int) -> Evaluation | HttpResponse:
    ev = _evaluation(request, evaluation_id)
    if ev.state != EvaluationState.DONE or not ev.report:
        return HttpResponse(f"The evaluation is {ev.state}: no report yet.", status=409, content_type="text/plain")
    return ev


@login_required
@require_GET
def report_json(request: HttpRequest, evaluation_id: int) -> HttpResponse:
    ev = _report(request, evaluation_id)
    if isinstance(ev, HttpResponse):
        return ev
    response = HttpResponse(json.dumps(ev.report, indent=1), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="whatif-{ev.pk}.json"'
    return response


@login_required
@require_GET
def report_csv(request: HttpRequest, evaluation_id: int) -> HttpResponse:
    table = request.GET.get("table", "table")
    if table not in ("table", "runs", "classes"):
        return HttpResponse("table: one of table, runs, classes", status=400, content_type="text/plain")
    ev = _report(request, evaluation_id)
    if isinstance(ev, HttpResponse):
        return ev
    response = HttpResponse(to_csv(ev.report, table), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="whatif-{ev.pk}-{table}.csv"'
    return response


@login_required
@require_GET
def report_svg(request: HttpRequest, evaluation_id: int) -> HttpResponse:
    ev = _report(request, evaluation_id)
    if isinstance(ev, HttpResponse):
        return ev
    response = HttpResponse(pareto_svg(ev.report), content_type="image/svg+xml")
    response["Content-Disposition"] = f'attachment; filename="whatif-{ev.pk}-pareto.svg"'
    return response
