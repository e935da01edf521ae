"""The array page: an array's tasks together, their states and queue standing; cancel every live task (design
§16.6). Researchers see only their groups' arrays (others 404), admins all."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal.core.lifecycle.jobs import TERMINAL
from portal.core.models import Job
from portal.queue.api import cancel_array, visible_arrays
from portal.queue.models import JobArray
from portal.web.access import page_roles
from portal.web.views.common import submit_once


def _array(request: HttpRequest, array_id: int) -> JobArray:
    roles = page_roles(request)
    if not (roles.admin or roles.researcher):
        raise Http404("no researcher pages for this user")
    return get_object_or_404(visible_arrays(request.user).select_related("group", "owner"), pk=array_id)


@login_required
def array_detail(request: HttpRequest, array_id: int) -> HttpResponse:
    arr = _array(request, array_id)
    jobs = list(Job.objects.filter(array_task__array=arr).order_by("array_task__index")
                .values("pk", "name", "state", "array_task__index", "queue_entry__priority",
                        "queue_entry__estimated_start_at", "queue_entry__reason"))
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j["state"]] = counts.get(j["state"], 0) + 1
    live = sum(n for state, n in counts.items() if state not in TERMINAL)
    return render(request, "queue/array.html", {"array": arr, "jobs": jobs, "counts": sorted(counts.items()),
                                                "live": live})


@login_required
@require_POST
def array_cancel(request: HttpRequest, array_id: int) -> HttpResponse:
    arr = _array(request, array_id)

    def cancel() -> HttpResponse:
        try:
            n = cancel_array(arr, request.user)
        except PermissionDenied as exc:
            raise Http404 from exc
        messages.success(request, f"Array {arr.name}: {n} jobs cancelled.")
        return redirect("queue:array-detail", array_id=arr.pk)

    return submit_once(request, cancel)
