"""What the idle watchdog and the loan timer know of each running job, from its heartbeats (design §15).

:func:`record_activity` is called where heartbeats record progress
(``portal.control.link.handlers.record_heartbeats``), for the jobs running on the nodes of a batch, and writes
``JobActivity`` for all of them in two statements whatever their number (design §9.10): one read of the rows it
updates, one upsert. Per job it keeps the newest GPU utilisation (the mean over the job's GPUs, as its agent
measured it: NVML, or the simulated load), the step, when it last showed use (``scheduler.loans.shows_use``)
and how long it has held its GPUs in its current loan (the gaps between its reports, a gap too long to have
been running left out).

The upsert computes the holding time from the row as it stands when written, not as it was read: a release
(``portal.control.reclaim.evict``) or a resume that started a new loan between the read and the write (its
``reported_at`` cleared) is never overwritten with the old loan's time, and a report older than the stored one
changes nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from django.db import connection

from portal.control.models import JobActivity
from scheduler.loans import MAX_REPORT_GAP_S, LoanView, held_between_reports_s, shows_use


def loan_view_of(now: dt.datetime, held_s: float | None, busy_at: dt.datetime | None, warning: str | None,
                 warned_at: dt.datetime | None, release_at: dt.datetime | None) -> LoanView:
    """The pure view ``scheduler.loans.decide`` takes, from one job's activity columns (all None: no report)."""
    return LoanView(held_s=float(held_s or 0.0),
                    idle_s=(now - busy_at).total_seconds() if busy_at is not None else None,
                    warning=warning or "",
                    release_in_s=(release_at - now).total_seconds() if release_at is not None else None,
                    used_since_warning=busy_at is not None and warned_at is not None and busy_at > warned_at)


def loan_view(activity: JobActivity, now: dt.datetime) -> LoanView:
    """:func:`loan_view_of` of one ``JobActivity`` row."""
    return loan_view_of(now, activity.held_s, activity.busy_at, activity.warning, activity.warned_at,
                        activity.release_at)


def _known(job_ids: list[int]) -> dict[int, tuple[Any, ...]]:
    """job pk → (step, reported_at, busy_at, held_s) as stored now (one statement)."""
    return {pk: tuple(rest) for pk, *rest in JobActivity.objects.filter(job_id__in=job_ids).values_list(
        "job_id", "step", "reported_at", "busy_at", "held_s")}


# The upsert (PostgreSQL): held_s and the fresh-run case read the stored row (``t``) at write time.
_UPSERT = (
    'INSERT INTO "{table}" AS t (job_id, gpu_util_pct, step, reported_at, busy_at, held_s, warning) '
    "SELECT v.j, v.u, v.s, v.r, v.b, 0.0, '' "
    "FROM unnest(%s::bigint[], %s::float8[], %s::bigint[], %s::timestamptz[], %s::timestamptz[]) AS v(j, u, s, r, b) "
    "ORDER BY v.j "
    "ON CONFLICT (job_id) DO UPDATE SET gpu_util_pct = EXCLUDED.gpu_util_pct, step = EXCLUDED.step, "
    "reported_at = EXCLUDED.reported_at, "
    "busy_at = CASE WHEN t.reported_at IS NULL THEN EXCLUDED.reported_at "
    "ELSE GREATEST(t.busy_at, EXCLUDED.busy_at) END, "
    "held_s = t.held_s + CASE WHEN t.reported_at IS NOT NULL AND EXCLUDED.reported_at > t.reported_at "
    "AND EXTRACT(EPOCH FROM EXCLUDED.reported_at - t.reported_at) <= %s "
    "THEN EXTRACT(EPOCH FROM EXCLUDED.reported_at - t.reported_at) ELSE 0 END "
    "WHERE t.reported_at IS NULL OR EXCLUDED.reported_at >= t.reported_at")


def record_activity(reports: Mapping[int, tuple[int, float | None, dt.datetime]]) -> int:
    """Store what these jobs' agents reported (job pk → (step, GPU utilisation in percent or None, when)).
    Returns the rows offered to the upsert (a report older than the stored one is skipped)."""
    if not reports:
        return 0
    known = _known(list(reports))
    rows: list[tuple[int, float | None, int, dt.datetime, dt.datetime]] = []
    held_as_read: dict[int, float] = {}  # the SQLite path only
    for job_id, (step, util_pct, at) in sorted(reports.items()):  # rows locked in job order
        previous_step, reported_at, busy_at, held_s = known.get(job_id, (None, None, None, 0.0))
        gap_s = (at - reported_at).total_seconds() if reported_at is not None else 0.0
        if reported_at is not None and gap_s < 0:
            continue  # an older report than the one recorded: nothing new
        resumed = reported_at is None or (gap_s > 0 and held_between_reports_s(gap_s) == 0.0)
        if resumed:
            previous_step = None  # a fresh run: its first report counts as use (it just started)
        used = resumed or shows_use(util_pct, step, previous_step)
        rows.append((job_id, util_pct, step, at, at if used or busy_at is None else busy_at))
        held_as_read[job_id] = float(held_s) + held_between_reports_s(gap_s)
    if not rows:
        return 0
    if connection.vendor != "postgresql":  # SQLite (a single writer): held_s from the row as read
        JobActivity.objects.bulk_create(
            [JobActivity(job_id=j, gpu_util_pct=u, step=s, reported_at=r, busy_at=b, held_s=held_as_read[j])
             for j, u, s, r, b in rows], update_conflicts=True, unique_fields=["job"],
            update_fields=["gpu_util_pct", "step", "reported_at", "busy_at", "held_s"])
        return len(rows)
    with connection.cursor() as cur:
        cur.execute(_UPSERT.format(table=JobActivity._meta.db_table),
                    [[r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows],
                     [r[4] for r in rows], MAX_REPORT_GAP_S])
    return len(rows)
