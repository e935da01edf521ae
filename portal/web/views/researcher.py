"""Researcher pages: submit a job, my jobs, a job's timeline and current checkpoint interval, cancel.

Jobs are looked up through ``jobs_for(user)`` (the user's research groups; admins: all), so another group's
job id is a 404. Every write goes through ``portal.core.services.jobs``.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Prefetch, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal.control.loop.loans import loan_state
from portal.control.models import Transfer
from portal.core.lifecycle import ConcurrentTransition, InvalidTransition
from portal.core.lifecycle.jobs import TERMINAL
from portal.core.models import Checkpoint, DecisionLog, Job, Migration, Placement
from portal.core.services import explain
from portal.core.services import jobs as job_services
from portal.core.services.results import page_results
from portal.queue import read as queue_read
from portal.queue import submit as queue_submit
from portal.queue.models import JobArray
from portal.web.access import jobs_for, page_roles, user_groups
from portal.web.forms import JobForm, apply_service_errors
from portal.web.templatetags.reclaimnet import copies_words
from portal.web.views.common import render_page, submit_once


def _require_researcher(request: HttpRequest) -> None:
    roles = page_roles(request)
    if not (roles.admin or roles.researcher):
        raise Http404("no researcher pages for this user")


def _job(request: HttpRequest, job_id: int) -> Job:
    _require_researcher(request)
    return get_object_or_404(jobs_for(request.user).select_related("group", "owner"), pk=job_id)


JOBS_PER_PAGE = 50


MAX_JOB_PAGE = 100_000  # pages of JOBS_PER_PAGE: far beyond any group's jobs, far inside a database integer


def _query_number(text: str, limit: int = 2**31 - 1) -> int | None:
    """A positive whole number from a query parameter, or None: ASCII digits only (``"²".isdigit()`` is true
    but ``int("²")`` fails) and at most ``limit`` (a page or id past it would overflow the database's integer)."""
    if not (text.isascii() and text.isdecimal()) or len(text) > len(str(limit)):
        return None
    number = int(text)
    return number if 0 < number <= limit else None


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    _require_researcher(request)
    # Only the open placement (with its node, one query) is shown: not every placement a job ever had.
    open_placements = Prefetch("placements", Placement.objects.filter(ended_at__isnull=True).select_related("node"),
                               to_attr="open_placements")
    jobs = jobs_for(request.user).select_related("group", "owner").prefetch_related(open_placements)
    state = "live" if request.GET.get("state") == "live" else ""  # the one filter the page offers
    if state == "live":
        jobs = jobs.exclude(state__in=TERMINAL)
    array_id = _query_number(request.GET.get("array", ""))  # one array's tasks (design §16.6)
    array = str(array_id) if array_id else ""
    jobs = jobs.select_related("array_task__array").filter(**({"array_task__array_id": array_id} if array_id else {}))
    page = _query_number(request.GET.get("page", ""), MAX_JOB_PAGE) or 1
    # One page of the newest JOBS_PER_PAGE, and one more row to know an older page exists (no COUNT): a group that
    # submitted hundreds of jobs does not make every look at the page cost hundreds of rows (design §10).
    listed = list(jobs[(page - 1) * JOBS_PER_PAGE: page * JOBS_PER_PAGE + 1])
    rows = []
    for job in listed[:JOBS_PER_PAGE]:
        open_placement = job.open_placements[0] if job.open_placements else None
        rows.append({"job": job, "node": open_placement.node if open_placement else None})
    context = {"rows": rows, "state": state, "array": array, "page": page,
               "older": page + 1 if len(listed) > JOBS_PER_PAGE else None, "newer": page - 1 if page > 1 else None}
    return render_page(request, "web/researcher/jobs.html", context, {"jobs": "web/researcher/_jobs.html"})


@login_required
def job_submit(request: HttpRequest) -> HttpResponse:
    """The submission form, validated field by field; what was typed stays when it is refused."""
    _require_researcher(request)
    groups = user_groups(request.user)
    form = JobForm(request.POST or None, groups=groups)

    def submit() -> HttpResponse:
        if form.is_valid():
            try:
                job = queue_submit.submit_any(request.user, **form.service_kwargs(), **form.queue_kwargs())
            except ValidationError as exc:
                apply_service_errors(form, exc, JobForm.SERVICE_FIELDS)
            except PermissionDenied:
                form.add_error("group", "You are not a member of this group.")
            else:
                if isinstance(job, JobArray):  # an array: its page lists its tasks (design §16.6)
                    messages.success(request, f"Array {job.name} submitted: {job.size} jobs queued.")
                    return redirect("queue:array-detail", array_id=job.pk)
                messages.success(request, f"Job {job.name} submitted; it is queued for a GPU.")
                return redirect("web:job-detail", job_id=job.pk)
        return render(request, "web/researcher/submit.html", {"form": form}, status=400 if form.errors else 200)

    if request.method == "POST":
        return submit_once(request, submit)
    return render(request, "web/researcher/submit.html", {"form": form})


@dataclass
class TimelineEntry:
    at: datetime
    kind: str  # placement | checkpoint | reclaim | migration | submitted | finished
    title: str
    detail: dict[str, Any]


CHECKPOINT_ROWS = 20  # a run of checkpoints lists its newest this many; "Show all" lists every one


@dataclass(slots=True)
class CheckpointRow:
    """One checkpoint as the timeline shows it: a row of plain values, not a model instance (a long job writes
    hundreds; design §10 "CPU per request"). ``copies`` is filled in for the rows shown."""

    pk: int
    sequence: int
    size_bytes: int
    taken_at: datetime
    completed_at: datetime | None
    node_name: str | None
    copies: str = ""


def timeline(job: Job, checkpoint_rows: int | None = CHECKPOINT_ROWS, placements: list[Placement] | None = None,
             migrations: list[Migration] | None = None) -> list[TimelineEntry]:
    """Placements, checkpoints, reclaims and migrations of one job, newest first; each placement and migration
    with its reason in plain words from the decision log (``portal.core.services.explain``).

    A run of consecutive checkpoints lists its newest ``checkpoint_rows`` (``None``: all); only the checkpoints
    shown have their copies read (design §10 "CPU per request": a long job writes hundreds). ``placements`` and
    ``migrations``: the job's, already read (with their nodes, reclaims and buildings)."""
    entries = [TimelineEntry(job.submitted_at, "submitted", "Submitted", {"group": job.group.name})]
    if placements is None:
        placements = list(job.placements.select_related("node", "node__building"))
    if migrations is None:
        migrations = list(job.migrations.select_related("source", "destination", "reclaim", "reclaim__node"))
    why = explain.decision_words(job, placements, migrations)
    for p in placements:
        entries.append(TimelineEntry(p.started_at, "placement", f"Placed on {p.node.name}",
                                     {"placement": p, "why": why.placement.get(p.pk),
                                      "interval_why": why.interval.get(p.pk)}))
    for c in (CheckpointRow(*row) for row in job.checkpoints.order_by().values_list(
            "pk", "sequence", "size_bytes", "taken_at", "completed_at", "node__name")):
        took = (c.completed_at - c.taken_at).total_seconds() if c.completed_at else None
        entries.append(
            TimelineEntry(c.completed_at or c.taken_at, "checkpoint", f"Checkpoint #{c.sequence}",
                          {"checkpoint": c, "took_s": took})
        )
    seen_reclaims: set[int] = set()
    for m in migrations:
        if m.reclaim and m.reclaim_id not in seen_reclaims:
            seen_reclaims.add(m.reclaim_id)
            entries.append(
                TimelineEntry(m.reclaim.requested_at, "reclaim",
                              f"{m.reclaim.get_kind_display().capitalize()} of {m.reclaim.node.name}",
                              {"reclaim": m.reclaim})
            )
        entries.append(
            TimelineEntry(m.started_at, "migration",
                          f"Migration {m.source.name} → {m.destination.name if m.destination else 'queue'}",
                          {"migration": m, "why": why.migration.get(m.pk)})
        )
    if job.finished_at:
        entries.append(TimelineEntry(job.finished_at, "finished", job.get_state_display().capitalize(),
                                     {"reason": job.failure_reason}))
    order = {"submitted": 0, "placement": 1, "checkpoint": 2, "reclaim": 3, "migration": 4, "finished": 5}
    entries.sort(key=lambda e: (e.at, order[e.kind]))
    folded = _group_checkpoints(entries)[::-1]
    _read_copies(folded, checkpoint_rows)
    return folded


def _read_copies(entries: list[TimelineEntry], checkpoint_rows: int | None) -> None:
    """Choose the rows each run of checkpoints lists (``shown``, newest first; ``hidden``: how many more) and
    read the copies (replicas, transfers) of the checkpoints shown, in two queries for the whole timeline."""
    shown: list[dict[str, Any]] = []
    for entry in entries:
        if entry.kind == "checkpoint":
            shown.append(entry.detail)
        elif entry.kind == "checkpoints":
            items = entry.detail["items"][::-1]
            rows = items if checkpoint_rows is None else items[:checkpoint_rows]
            entry.detail["shown"], entry.detail["hidden"] = rows, len(items) - len(rows)
            shown += rows
    ids = [d["checkpoint"].pk for d in shown]
    holders: dict[int, dict[int, str]] = defaultdict(dict)
    for checkpoint_id, node_id, name in Checkpoint.replica_nodes.through.objects.filter(
            checkpoint_id__in=ids).values_list("checkpoint_id", "node_id", "node__name"):
        holders[checkpoint_id][node_id] = name
    transfers: dict[int, list[tuple[str, int, str]]] = defaultdict(list)
    for checkpoint_id, *transfer in Transfer.objects.filter(checkpoint_id__in=ids).values_list(
            "checkpoint_id", "state", "destination_id", "destination__name"):
        transfers[checkpoint_id].append(tuple(transfer))
    for detail in shown:
        checkpoint = detail["checkpoint"]
        checkpoint.copies = copies_words(holders[checkpoint.pk], transfers[checkpoint.pk])


def _group_checkpoints(entries: list[TimelineEntry]) -> list[TimelineEntry]:
    """Fold each run of consecutive checkpoints into one entry (a long job writes hundreds of them)."""
    folded: list[TimelineEntry] = []
    for entry in entries:
        previous = folded[-1] if folded else None
        if entry.kind == "checkpoint" and previous is not None and previous.kind in ("checkpoint", "checkpoints"):
            if previous.kind == "checkpoint":
                previous = folded[-1] = TimelineEntry(previous.at, "checkpoints", "", {"items": [previous.detail]})
            previous.detail["items"].append(entry.detail)
            previous.at = entry.at
            first, last = previous.detail["items"][0], previous.detail["items"][-1]
            previous.title = (
                f"Checkpoints #{first['checkpoint'].sequence} to #{last['checkpoint'].sequence}"
                f" ({len(previous.detail['items'])})"
            )
            previous.detail["last"] = last
        else:
            folded.append(entry)
    return folded


def p1_inputs(job: Job) -> dict[str, Any] | None:
    """Why the current interval: this job's entry in the latest P1 decision (design §2, Eq. 9)."""
    decisions = DecisionLog.objects.filter(kind=DecisionLog.Kind.P1).filter(Q(job=job) | Q(job__isnull=True))
    for decision in decisions.order_by("-created_at", "-id")[:50]:
        request, response = decision.request or {}, decision.response or {}
        wanted = {str(job.pk), f"job-{job.pk}"}
        req = next((j for j in request.get("jobs", []) if str(j.get("id")) in wanted), None)
        if req is None:
            continue
        res = next((j for j in response.get("jobs", []) if str(j.get("id")) in wanted), {})
        hazard_per_s = explain.planned_hazard_per_s(req, res)
        return {
            "decided_at": decision.created_at,
            "decision_id": decision.decision_id,
            "budget": request.get("budget_bytes_per_s"),
            "beta": request.get("beta", 0.2),
            "min_interval_s": request.get("min_interval_s"),
            "hazard_per_s": hazard_per_s,
            "hazard_per_h": hazard_per_s * 3600,
            "ckpt_bytes": req.get("ckpt_bytes"),
            "cap": req.get("cap_bytes_per_s"),
            "loss_budget_s": req.get("loss_budget_s"),
            "notice_s": req.get("notice_s"),
            "restart_s": req.get("restart_s"),
            "bandwidth": res.get("bandwidth_bytes_per_s"),
            "interval_s": res.get("interval_s"),
            "final_checkpoint": res.get("final_checkpoint"),
            "at_risk": res.get("loss_budget_at_risk"),
        }
    return None


def _waiting(job: Job) -> Callable[[], dict[str, Any] | None]:
    """Why a queued job waits, read from the campus only when the page or its fragment shows it (once)."""

    @functools.cache
    def reason() -> dict[str, Any] | None:
        found = explain.waiting_reason(job)
        return None if found is None else {**found, "rows": explain.reason_rows(found)}

    return reason


@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job(request, job_id)
    all_checkpoints = request.GET.get("checkpoints") == "all"
    # Each read once, and only when the page or its fragment shows it (design §10 "CPU per request"): the status
    # and the timeline share the job's placements and migrations.
    placements = functools.cache(lambda: list(job.placements.select_related("node", "node__building")))
    migrations = functools.cache(lambda: list(job.migrations.select_related(
        "source", "destination", "reclaim", "reclaim__node")))
    context = {
        "job": job,
        "placement": functools.cache(lambda: next((p for p in placements() if p.ended_at is None), None)),
        "timeline": functools.cache(lambda: timeline(job, None if all_checkpoints else CHECKPOINT_ROWS,
                                                     placements(), migrations())),
        "all_checkpoints": all_checkpoints,
        "waiting": _waiting(job),
        "queue": functools.cache(lambda: queue_read.job_queue(job)),  # design §16.6: one statement, when shown
        "p1": functools.cache(lambda: p1_inputs(job)),
        "can_cancel": job.state not in TERMINAL,
        "migrations": migrations,
        "results": functools.cache(lambda: page_results(job.pk)),  # design §14: one query, when shown
        "loan": functools.cache(lambda: loan_state(job, request.user)),  # design §15: two statements, when shown
    }
    return render_page(
        request,
        "web/researcher/job.html",
        context,
        {"status": "web/researcher/_job_status.html", "actions": "web/researcher/_job_actions.html", "timeline": "web/researcher/_timeline.html",
         "waiting": "web/researcher/_waiting_reason.html"},
    )


@login_required
def job_output(request: HttpRequest, job_id: int) -> HttpResponse:
    """The job page's Output panel alone, for its live refresh (design §9.11)."""
    return render(request, "web/researcher/_job_output.html", {"job": _job(request, job_id)})


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job(request, job_id)

    def cancel() -> HttpResponse:
        try:
            job_services.cancel_job(job, request.user)
        except PermissionDenied as exc:
            raise Http404 from exc
        except (InvalidTransition, ConcurrentTransition):
            messages.error(request, f"Job {job.name} is {job.get_state_display()} and can no longer be cancelled.")
        else:
            messages.success(request, f"Job {job.name} cancelled.")
        return redirect("web:job-detail", job_id=job.pk)

    return submit_once(request, cancel)
