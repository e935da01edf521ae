"""Loans on the web (design §15): the ladder page and the owner's "Resume" of a released job.

``/ladder/`` is readable by every signed-in user: the classes in order, what each may borrow, notice and grace,
loan and idle limits, the classes the idle watchdog never touches, and how a reclaim proceeds — the facts of
``GET /api/ladder/`` (``portal.control.ladder.ladder_facts``). ``POST /jobs/<id>/resume/`` resumes a
``suspended`` job (``portal.control.reclaim.evict.resume_job``) and returns to its page.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal.control.ladder import ladder_facts
from portal.control.reclaim.evict import resume_job
from portal.core.lifecycle import ConcurrentTransition, InvalidTransition
from portal.web.access import jobs_for
from portal.web.views.common import submit_once


@login_required
def ladder_page(request: HttpRequest) -> HttpResponse:
    return render(request, "web/ladder.html", {"ladder": ladder_facts()})


@login_required
@require_POST
def job_resume(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(jobs_for(request.user).select_related("group", "owner"), pk=job_id)

    def resume() -> HttpResponse:
        try:
            resume_job(job, request.user)
        except PermissionDenied:
            messages.error(request, f"Only {job.owner.get_username()}, who submitted {job.name}, can resume it.")
        except (InvalidTransition, ConcurrentTransition):
            messages.error(request, f"Job {job.name} is {job.get_state_display()}: only a suspended job resumes.")
        else:
            messages.success(request, f"Job {job.name} resumed: it is queued and continues from its checkpoint.")
        return redirect("web:job-detail", job_id=job.pk)

    return submit_once(request, resume)
