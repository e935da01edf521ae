"""A job's work done, from its real progress (design §9.9): one definition, kept on the job row.

    work_done_s = progress_step × seconds per step

``progress_step`` is the step the job's current run has reached (heartbeats raise it; a run resumed from a
checkpoint starts again from that checkpoint's step), so work done survives a move and the work a move lost is
subtracted by itself: after resuming at step k the job has done k steps' worth. Seconds per step is measured,
best evidence first (:func:`seconds_per_step`):

1. the slope of the job's newest two consecutive checkpoints written by one run (taken_at against step) — it
   leaves out start-up and restore time;
2. else the current run's duration over the steps it made since it started (from the newest checkpoint taken
   before it started, 0 if none) — a new job's first minutes, where work done is simply the time it has run.

Nothing tells (no step made yet): work done keeps its last value. :func:`record_progress` is called where
heartbeats record progress (``portal.control.link.handlers.record_heartbeats``) and writes both columns for a
whole batch in two statements (design §9.10; a job's newest checkpoints are index lookups, however many it has
written). The control plane's remaining work (``portal.control.state.remaining_s``), the job page and the API
read the column.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.db.models import OuterRef, Subquery

from portal.core.bulk import update_columns
from portal.core.models import Checkpoint, Job, Placement

NEWEST_CHECKPOINTS = 3  # enough to find the newest pair written by one run just after a move


@dataclass(frozen=True)
class CheckpointPoint:
    """Where a checkpoint was taken: its sequence, step, time and the node that wrote it (None: forgotten)."""

    sequence: int
    step: int
    taken_at: dt.datetime
    node_id: int | None


def seconds_per_step(
    step: int, at: dt.datetime, run_started_at: dt.datetime | None, newest: Sequence[CheckpointPoint],
) -> float | None:
    """How long one step of the job takes, from the best evidence (module docstring); None when nothing tells.

    ``newest``: the job's newest checkpoints (any order); ``run_started_at``: when its current run was placed
    (None: no open run)."""
    points = sorted(newest, key=lambda p: p.sequence)
    for older, newer in reversed(list(itertools.pairwise(points))):
        one_run = ((run_started_at is not None and older.taken_at >= run_started_at)
                   or (older.node_id is not None and older.node_id == newer.node_id
                       and (run_started_at is None or newer.taken_at < run_started_at)))
        if one_run and newer.step > older.step and newer.taken_at > older.taken_at:
            return (newer.taken_at - older.taken_at).total_seconds() / (newer.step - older.step)
    if run_started_at is None:
        return None
    before = [p.step for p in points if p.taken_at <= run_started_at]
    first_step = max(before) if before else 0
    elapsed_s = (at - run_started_at).total_seconds()
    if step <= first_step or elapsed_s <= 0:
        return None
    return elapsed_s / (step - first_step)


def work_done_s(step: int, per_step_s: float | None, previous_s: float) -> float:
    """progress_step × seconds per step; the previous value when the pace is unknown (0 steps: nothing done)."""
    if step <= 0:
        return 0.0
    return previous_s if per_step_s is None else step * per_step_s


def _newest(position: int, field: str) -> Subquery:
    """``field`` of the job's checkpoint at ``position`` from the newest (0): one index lookup per job."""
    return Subquery(Checkpoint.objects.filter(job_id=OuterRef("pk")).order_by("-sequence")
                    .values(field)[position:position + 1])


def record_progress(reports: Mapping[int, tuple[int, dt.datetime]]) -> int:
    """Store ``progress_step`` and ``work_done_s`` for these jobs (job pk → (the step its agent reported, when))
    in two statements whatever their number. Returns the rows written."""
    if not reports:
        return 0
    fields = ("sequence", "step", "taken_at", "node_id")
    newest = {f"c{k}_{name}": _newest(k, name) for k in range(NEWEST_CHECKPOINTS) for name in fields}
    run = Placement.objects.filter(job_id=OuterRef("pk"), ended_at__isnull=True).values("started_at")[:1]
    rows = (Job.objects.filter(pk__in=list(reports)).order_by()
            .annotate(run_started_at=Subquery(run), **newest)
            .values_list("pk", "work_done_s", "run_started_at", *newest))
    keys, steps, done = [], [], []
    for job_id, previous, started_at, *points in rows:
        step, at = reports[job_id]
        known = [CheckpointPoint(*points[k * 4:k * 4 + 4]) for k in range(NEWEST_CHECKPOINTS)
                 if points[k * 4] is not None]
        keys.append(job_id)
        steps.append(int(step))
        done.append(work_done_s(int(step), seconds_per_step(int(step), at, started_at, known), float(previous)))
    return update_columns(Job, "pk", keys, {"progress_step": steps, "work_done_s": done})
