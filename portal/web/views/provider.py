"""Provider pages: my nodes, register a node, lending windows and floor, reclaim (scheduled, emergency,
kill-switch) with the predicted per-job outcome first, and the reclaim history (design §1).

Every write goes through ``portal.core.services``; nodes are looked up through ``nodes_for(user)``, so another
lab's node id in a URL or a form is a 404.
"""

from __future__ import annotations

import functools
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery, prefetch_related_objects
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from portal.control.reclaim.plan import preview as preview_reclaim
from portal.core.lifecycle import ConcurrentTransition, InvalidTransition
from portal.core.lifecycle.labels import refusal
from portal.core.models import Checkpoint, Node, Placement, ReclaimEvent
from portal.core.services import nodes as node_services
from portal.core.services import reclaims as reclaim_services
from portal.web.access import nodes_for, page_roles, user_providers
from portal.web.forms import (
    ConfirmForm,
    FloorForm,
    LendingWindowFormSet,
    ReclaimForm,
    RegisterNodeForm,
    apply_service_errors,
    windows_from_formset,
)
from portal.web.views.common import render_page, submit_once

LIFECYCLE_ERRORS = (InvalidTransition, ConcurrentTransition)
DEFAULT_NOTICE_S = 120


def _preview(node: Node, notice_s: float) -> dict[str, Any]:
    """The planner's preview; the "use it" button fills in exactly the shortest loss-free notice shown."""
    preview = preview_reclaim(node, notice_s)
    preview["use_notice_s"] = preview.get("shortest_loss_free_notice_s")
    return preview


def _require_provider(request: HttpRequest) -> None:
    """Provider pages exist only for lab members and admins: anyone else gets a 404, not a hint."""
    roles = page_roles(request)
    if not (roles.admin or roles.provider):
        raise Http404("no provider pages for this user")


def _node(request: HttpRequest, node_id: int) -> Node:
    _require_provider(request)
    return get_object_or_404(nodes_for(request.user).select_related("provider", "building"), pk=node_id)


def _hosted(nodes: QuerySet[Node]) -> dict[int, list[dict[str, Any]]]:
    """The jobs each node hosts now, with checkpoint age and P1's current interval and bandwidth."""
    placements = (
        Placement.objects.filter(node__in=nodes, ended_at__isnull=True)
        .select_related("job", "job__group")
        # the newest completed checkpoint's time, in the same query (not every checkpoint of every job)
        .annotate(last_checkpoint_at=Subquery(
            Checkpoint.objects.filter(job=OuterRef("job"), completed_at__isnull=False)
            .order_by("-sequence").values("completed_at")[:1]))
    )
    hosted: dict[int, list[dict[str, Any]]] = {}
    for p in placements:
        hosted.setdefault(p.node_id, []).append(
            {
                "job": p.job,
                "gpus": len(p.gpu_indices) or p.job.gpu_count,
                "since": p.started_at,
                "last_checkpoint": p.last_checkpoint_at,
                "interval_s": p.job.checkpoint_interval_s,
                "bandwidth": p.job.checkpoint_bandwidth_bytes_per_s,
            }
        )
    return hosted


def _node_rows(user: Any) -> list[dict[str, Any]]:
    nodes = (nodes_for(user).select_related("provider", "building").prefetch_related("gpus", "lending_windows")
             .order_by("name"))
    hosted = _hosted(nodes)
    rows = []
    for node in nodes:
        gpus = list(node.gpus.all())
        models = sorted({g.model for g in gpus})
        rows.append(
            {
                "node": node,
                "gpu_count": len(gpus),
                "gpu_models": ", ".join(models) or "—",
                "lendable": Node.lendable_of(len(gpus), node.gpu_floor),
                "jobs": hosted.get(node.pk, []),
            }
        )
    return rows


@login_required
def provider_home(request: HttpRequest) -> HttpResponse:
    _require_provider(request)
    context = {
        "all_labs": page_roles(request).admin,  # an admin sees every lab's nodes: "Nodes", not "My nodes"
        "rows": _node_rows(request.user),
        "reclaims": _reclaims(request.user)[:5],
        "providers": user_providers(request.user),
    }
    return render_page(
        request,
        "web/provider/home.html",
        context,
        {"nodes": "web/provider/_nodes.html", "reclaims": "web/provider/_reclaims.html"},
    )


def _reclaims(user: Any) -> QuerySet[ReclaimEvent]:
    return (
        ReclaimEvent.objects.filter(node__in=nodes_for(user))
        .select_related("node", "requested_by")
        .prefetch_related("migrations__job")
        .order_by("-requested_at", "-id")
    )


@login_required
def reclaim_history(request: HttpRequest) -> HttpResponse:
    _require_provider(request)
    return render_page(
        request,
        "web/provider/reclaims.html",
        {"reclaims": _reclaims(request.user)[:200]},
        {"reclaims": "web/provider/_reclaims.html"},
    )


@never_cache
@login_required
def register_node(request: HttpRequest) -> HttpResponse:
    """Register a node; on success the agent token is shown once, with the command that starts the agent."""
    _require_provider(request)
    providers = user_providers(request.user)
    form = RegisterNodeForm(request.POST or None, providers=providers)
    registered: list[Node] = []

    def register() -> HttpResponse:
        if form.is_valid():
            try:
                node, token = node_services.register_node(request.user, **form.service_kwargs())
            except ValidationError as exc:
                apply_service_errors(form, exc, {"gpus": "gpu_model",
                                                 "access_link_bytes_per_s": "access_link_mbit_s"})
            except PermissionDenied:
                form.add_error("provider", "You are not a member of this lab.")
            else:
                registered.append(node)
                return _token_page(request, node, token, registered=True)
        return render(request, "web/provider/register.html", {"form": form}, status=400 if form.errors else 200)

    if request.method == "POST":
        # A second send of the form leads to the node's page: its token is shown once, on the first answer.
        return submit_once(request, register,
                           lambda _: reverse("web:node-detail", kwargs={"node_id": registered[0].pk}))
    return render(request, "web/provider/register.html", {"form": form})


def _token_page(request: HttpRequest, node: Node, token: str, registered: bool) -> HttpResponse:
    portal_url = request.build_absolute_uri("/").rstrip("/")
    response = render(
        request,
        "web/provider/token.html",
        {
            "node": node,
            "token": token,
            "registered": registered,
            "command": f"python -m nodeagent --portal {portal_url} --token {token}",
        },
    )
    response["Cache-Control"] = "no-store"
    return response


@never_cache
@login_required
@require_POST
def rotate_token(request: HttpRequest, node_id: int) -> HttpResponse:
    node = _node(request, node_id)
    try:
        token = node_services.rotate_agent_token(node, request.user)
    except PermissionDenied as exc:
        raise Http404 from exc
    return _token_page(request, node, token, registered=False)


@login_required
def node_detail(request: HttpRequest, node_id: int) -> HttpResponse:
    node = _node(request, node_id)
    return _render_node(request, node)


def _render_node(
    request: HttpRequest,
    node: Node,
    floor_form: FloorForm | None = None,
    windows: Any = None,
    status: int = 200,
) -> HttpResponse:
    # GPUs and windows read once for the page: the state panel's count, the lent count, the lending summary and
    # the settings form all use these (design §10 "CPU per request").
    prefetch_related_objects([node], "gpus", "lending_windows")
    initial_windows = [
        {"weekday": w.weekday, "start_time": w.start_time, "end_time": w.end_time}
        for w in node.lending_windows.all()
    ]
    windows = windows or LendingWindowFormSet(initial=initial_windows, prefix="w")
    floor_form = floor_form or FloorForm(initial={"gpu_floor": node.gpu_floor,
                                                  "owner_use_policy": node.owner_use_policy})
    context = {
        "node": node,
        "gpus": node.gpus.all(),
        # read only when the page or its fragment shows them
        "jobs": functools.cache(lambda: _hosted(Node.objects.filter(pk=node.pk)).get(node.pk, [])),
        "floor_form": floor_form,
        "windows": windows,
        "settings_errors": _settings_errors(floor_form, windows),
        "reclaims": _reclaims(request.user).filter(node=node)[:20],
        "can_reclaim": node.state in ("online", "draining", "offline", "registered"),
    }
    response = render_page(
        request,
        "web/provider/node.html",
        context,
        {"state": "web/provider/_node_state.html", "actions": "web/provider/_node_actions.html",
         "jobs": "web/provider/_node_jobs.html", "reclaims": "web/provider/_reclaims.html"},
    )
    response.status_code = status
    return response


def _settings_errors(floor_form: FloorForm, windows: Any) -> dict[str, Any] | None:
    """The lending form's error summary (the GPU floor and every window row together, like
    ``partials/form_errors.html`` for one form): how many fields are marked, and the errors of no one field."""
    if not floor_form.is_bound:
        return None
    forms = [floor_form, *windows.forms]
    fields = sum(len([name for name in f.errors if name != "__all__"]) for f in forms)
    general = [*floor_form.non_field_errors(), *windows.non_form_errors(),
               *(e for f in windows.forms for e in f.non_field_errors())]
    if not fields and not general:
        return None
    return {"fields": fields, "general": general}


@login_required
@require_POST
def node_settings(request: HttpRequest, node_id: int) -> HttpResponse:
    """Save the GPU floor and the lending windows together (one form on the node page)."""
    node = _node(request, node_id)
    floor_form = FloorForm(request.POST)
    windows = LendingWindowFormSet(request.POST, prefix="w")
    if floor_form.is_valid() and windows.is_valid():
        try:
            # Both or neither: a refused window must not leave the new floor saved behind an error page.
            with transaction.atomic():
                node_services.update_node(node, request.user, gpu_floor=floor_form.cleaned_data["gpu_floor"],
                                          **({"owner_use_policy": floor_form.cleaned_data["owner_use_policy"]}
                                             if floor_form.cleaned_data.get("owner_use_policy") else {}))
                node_services.set_lending_windows(node, request.user, windows_from_formset(windows))
        except ValidationError as exc:
            apply_service_errors(floor_form, exc)
        except PermissionDenied as exc:
            raise Http404 from exc
        else:
            messages.success(request, f"Lending settings of {node.name} saved.")
            return redirect("web:node-detail", node_id=node.pk)
    node.refresh_from_db()
    return _render_node(request, node, floor_form, windows, status=400)


@login_required
def reclaim_dialog(request: HttpRequest, node_id: int) -> HttpResponse:
    """Pick a notice and see each hosted job's predicted outcome; confirming is only possible from the preview."""
    node = _node(request, node_id)
    form = ReclaimForm({"notice_s": request.GET.get("notice_s", DEFAULT_NOTICE_S)})
    preview = _preview(node, form.cleaned_data["notice_s"]) if form.is_valid() else None
    context = {
        "node": node,
        "form": form,
        "presets": ReclaimForm.PRESETS,
        "preview": preview,
        "emergency_preview": preview_reclaim(node, 0.0),
        "confirm_form": ConfirmForm(),
        "killswitch_form": ConfirmForm(),
    }
    if request.htmx and request.GET.get("fragment") == "preview":
        return render(request, "web/provider/_reclaim_preview.html", context)
    return render(request, "web/provider/reclaim.html", context)


@login_required
@require_POST
def reclaim_confirm(request: HttpRequest, node_id: int) -> HttpResponse:
    """Scheduled reclaim with the notice the provider previewed."""
    node = _node(request, node_id)
    form = ReclaimForm(request.POST)
    if form.is_valid():
        notice = form.cleaned_data["notice_s"]
        return _do_reclaim(request, node, lambda: reclaim_services.request_reclaim(node, request.user, notice))
    return _dialog_with_errors(request, node, form=form)


@login_required
@require_POST
def emergency_reclaim(request: HttpRequest, node_id: int) -> HttpResponse:
    node = _node(request, node_id)
    form = ConfirmForm(request.POST)
    if form.is_valid():
        return _do_reclaim(request, node, lambda: reclaim_services.emergency_reclaim(node, request.user))
    return _dialog_with_errors(request, node, emergency_form=form)


@login_required
@require_POST
def killswitch(request: HttpRequest, node_id: int) -> HttpResponse:
    node = _node(request, node_id)
    form = ConfirmForm(request.POST)
    if form.is_valid():
        return _do_reclaim(request, node, lambda: reclaim_services.engage_killswitch(node, request.user))
    return _dialog_with_errors(request, node, killswitch_form=form)


def _do_reclaim(request: HttpRequest, node: Node, action: Any) -> HttpResponse:
    return submit_once(request, lambda: _reclaim_once(request, node, action))


def _reclaim_once(request: HttpRequest, node: Node, action: Any) -> HttpResponse:
    try:
        reclaim = action()
    except PermissionDenied as exc:
        raise Http404 from exc
    except ValidationError as exc:
        messages.error(request, "; ".join(m for ms in exc.message_dict.values() for m in ms)
                       if hasattr(exc, "error_dict") else "; ".join(exc.messages))
        return redirect("web:reclaim-dialog", node_id=node.pk)
    except LIFECYCLE_ERRORS as exc:
        messages.error(request, _refused(node, exc))
        return redirect("web:node-detail", node_id=node.pk)
    messages.success(request, f"{reclaim.get_kind_display().capitalize()} of {node.name} requested.")
    return redirect(reverse("web:node-detail", kwargs={"node_id": node.pk}) + "#reclaims")


def _refused(node: Node, exc: Exception) -> str:
    """What a person reads when the node's lifecycle refused their action, naming the node, in plain words."""
    if isinstance(exc, InvalidTransition):
        return refusal("node", exc.current, exc.target, subject=node.name)
    node.refresh_from_db()
    return f"{node.name} changed meanwhile: it is {node.get_state_display()} now. Nothing was done."


def _dialog_with_errors(request: HttpRequest, node: Node, **forms: Any) -> HttpResponse:
    form = forms.get("form") or ReclaimForm({"notice_s": DEFAULT_NOTICE_S})
    context = {
        "node": node,
        "form": form,
        "presets": ReclaimForm.PRESETS,
        "preview": _preview(node, form.cleaned_data["notice_s"]) if form.is_valid() else None,
        "emergency_preview": preview_reclaim(node, 0.0),
        "confirm_form": forms.get("emergency_form") or ConfirmForm(),
        "killswitch_form": forms.get("killswitch_form") or ConfirmForm(),
    }
    return render(request, "web/provider/reclaim.html", context, status=400)


@login_required
@require_POST
def lend_again(request: HttpRequest, node_id: int) -> HttpResponse:
    node = _node(request, node_id)

    def lend() -> HttpResponse:
        try:
            node_services.lend_again(node, request.user)
        except PermissionDenied as exc:
            raise Http404 from exc
        except LIFECYCLE_ERRORS as exc:
            messages.error(request, _refused(node, exc))
        else:
            messages.success(request, f"{node.name} is lent again; it comes online when its agent says hello.")
        return redirect("web:node-detail", node_id=node.pk)

    return submit_once(request, lend)

