"""The idle watchdog and the loan timer, every control tick (design §15).

:func:`loans_tick` (called by ``portal.control.loop.ticks.control_tick``):

1. drives the evictions under way (``portal.control.reclaim.evict.drive``: releases whose final checkpoint is
   recorded, forces whose deadline passed);
2. reads every running job with what its heartbeats said (``JobActivity``) and its open eviction in one
   statement, and the ladder (``portal.control.ladder.class_policies``, one statement);
3. asks ``scheduler.loans.decide`` about each job — warn, release, lift a warning or nothing — and writes the
   warnings and lifted warnings in one statement each; each warning is a catalogue event
   (``job.idle_warning``, ``job.loan_ending``) with the time of the release;
4. starts the releases that are due (``evict_job`` with the class's grace; idle → ``suspend``, loan end → the
   class's ``loan_end``), each decided again by ``evict_job`` on the job's locked ``JobActivity`` row, so a job
   that showed use after this tick's read is not released.

A quiet campus costs two statements whatever its size, four while evictions are under way (test: equal at 50 and
200 nodes); a job's warning or release costs its own statements only when it happens. A tick that dies midway
leaves what it committed; the next tick decides again from the rows (a warning is written before its event is
sent, in one transaction).
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from portal.control.activity import loan_view_of
from portal.control.ladder import class_policies, terms_of
from portal.control.models import Eviction, JobActivity, LoanEnd
from portal.control.reclaim import evict
from portal.core import events
from portal.core.bulk import update_columns
from portal.core.lifecycle.jobs import JobState
from portal.core.models import Job
from scheduler.loans import Action, LoanView, decide

log = logging.getLogger(__name__)


def _running(now: dt.datetime) -> list[tuple[Any, ...]]:
    """(job pk, class, held_s, busy_at, warning, warned_at, release_at) of every running job not being evicted."""
    draining = Eviction.objects.filter(job=OuterRef("pk"), finished_at__isnull=True)
    return list(Job.objects.filter(state=JobState.RUNNING).exclude(Exists(draining))
                .order_by().values_list("pk", "priority_class", "activity__held_s", "activity__busy_at",
                                        "activity__warning", "activity__warned_at", "activity__release_at"))


def view_of(row: tuple[Any, ...], now: dt.datetime) -> LoanView:
    """The pure view ``scheduler.loans.decide`` takes, from one :func:`_running` row."""
    _, _, held_s, busy_at, warning, warned_at, release_at = row
    return loan_view_of(now, held_s, busy_at, warning, warned_at, release_at)


def loans_tick(now: dt.datetime | None = None, *, drive_evictions: bool = True) -> dict[str, int]:
    """One pass of the watchdog and the timer (module docstring); returns what it did, by kind.
    ``drive_evictions=False``: the caller found no eviction under way (``evict.pending_checks``), step 1 is
    skipped."""
    now = now or timezone.now()
    done = evict.drive(now) if drive_evictions else {"released": 0, "forced": 0, "closed": 0}
    rows = _running(now)
    if not rows:
        return done
    policies = class_policies(fresh=True)
    warn: list[tuple[int, str, float, float]] = []  # (job, "idle" | "loan", release in s, idle s)
    clear: list[int] = []
    releases: list[tuple[int, str, float, str, Action]] = []  # (job, reason, grace s, then, decision)
    for row in rows:
        terms = policies.get(row[1]) or terms_of(row[1])
        view = view_of(row, now)
        decision = decide(view, terms.policy)
        if decision.action in (Action.WARN_IDLE, Action.WARN_LOAN):
            kind = "idle" if decision.action == Action.WARN_IDLE else "loan"
            warn.append((row[0], kind, float(decision.release_in_s or 0.0), view.idle_s or 0.0))
        elif decision.action == Action.CLEAR:
            clear.append(row[0])
        elif decision.action == Action.RELEASE_IDLE:
            releases.append((row[0], "idle", terms.grace_s, LoanEnd.SUSPEND, decision.action))
        elif decision.action == Action.RELEASE_LOAN:
            releases.append((row[0], "loan", terms.grace_s, terms.loan_end, decision.action))
    if warn or clear:
        _write_warnings(warn, clear, now, policies)
    for job_id, reason, grace_s, then, action in releases:
        try:  # decided on an unlocked read: evict_job decides again on the locked activity row
            if evict.evict_job(job_id, reason, grace_s, then, now=now, expect=action) is not None:
                done[f"released_{reason}"] = done.get(f"released_{reason}", 0) + 1
        except Exception:  # this job's release is decided again by the next tick; the others go on
            log.exception("job %s: release (%s) failed; the next tick decides again", job_id, reason)
    done["warned"] = len(warn)
    done["cleared"] = len(clear)
    return done


def _write_warnings(warn: list[tuple[int, str, float, float]], clear: list[int], now: dt.datetime,
                    policies: dict[str, Any]) -> None:
    """Warnings and lifted warnings in one statement each (rows created for jobs that never reported), and one
    catalogue event per warning, in one transaction."""
    with transaction.atomic():
        if warn:
            ids = [w[0] for w in warn]
            have = set(JobActivity.objects.filter(job_id__in=ids).values_list("job_id", flat=True))
            JobActivity.objects.bulk_create([JobActivity(job_id=pk) for pk in ids if pk not in have])
            update_columns(JobActivity, "pk", ids, {
                "warning": [w[1] for w in warn], "warned_at": [now] * len(warn),
                "release_at": [now + dt.timedelta(seconds=w[2]) for w in warn]})
            jobs = Job.objects.select_related("owner", "group").in_bulk(ids)
            for pk, kind, release_in_s, idle_s in warn:
                job = jobs[pk]
                terms = policies.get(job.priority_class) or terms_of(job.priority_class)
                release_at = now + dt.timedelta(seconds=release_in_s)
                then = LoanEnd.SUSPEND if kind == "idle" else terms.loan_end
                if kind == "idle":
                    events.emit("job.idle_warning", job=job, release_at=release_at, idle_s=idle_s, then=then)
                else:
                    events.emit("job.loan_ending", job=job, release_at=release_at, max_loan_s=terms.max_loan_s,
                                then=then)
        if clear:
            JobActivity.objects.filter(job_id__in=clear).update(warning="", warned_at=None, release_at=None)


def loan_state(job: Job, viewer: Any = None, now: dt.datetime | None = None) -> dict[str, Any]:
    """What the job page's loan panel shows (two statements: the activity row and the open eviction; the ladder
    is cached): time held and left on the loan, idle time and limit, the warning under way, the eviction under
    way, and whether ``viewer`` may resume it."""
    now = now or timezone.now()
    terms = terms_of(job.priority_class)
    activity = JobActivity.objects.filter(job=job).first()
    eviction = Eviction.objects.filter(job=job, finished_at__isnull=True).first()
    held_s = float(activity.held_s) if activity is not None else 0.0
    busy_at = activity.busy_at if activity is not None else None
    idle_s = (now - busy_at).total_seconds() if busy_at is not None and job.state == JobState.RUNNING else None
    return {
        "terms": terms,
        "running": job.state == JobState.RUNNING,
        "held_s": held_s,
        "left_s": None if terms.max_loan_s is None else max(0.0, terms.max_loan_s - held_s),
        "idle_s": idle_s,
        "idle": idle_s is not None and terms.idle_watch and idle_s >= 60.0,
        "gpu_util_pct": activity.gpu_util_pct if activity is not None else None,
        "warning": activity.warning if activity is not None else "",
        "release_at": activity.release_at if activity is not None else None,
        "eviction": eviction,
        "suspended": job.state == JobState.SUSPENDED,
        "can_resume": job.state == JobState.SUSPENDED and viewer is not None and evict.can_resume_job(viewer, job),
    }

