"""Start an evaluation and run it (design §7 "The what-if report").

`create_evaluation` validates the choice (policies the simulator knows, seeds, the trace: the last N days of the
portal's history or an uploaded file checked by `portal.whatif.upload`), stores the row and queues
``whatif.run_evaluation`` through the outbox in the same transaction (design §8), routed to the ``evaluation``
queue (design §10), never ``control``. `run_evaluation` is the task body: it claims the row (queued → running, a
conditional update, so a second delivery does nothing), runs ``scheduler.sim.whatif.compare`` writing its
progress to the row at most every ``PROGRESS_EVERY_S``, and stores the report or the error.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from portal.core import outbox
from portal.whatif.export import history_trace
from portal.whatif.models import Evaluation, EvaluationState, TraceSource
from portal.whatif.upload import UploadError, parse_upload, rows_of
from scheduler.sim.policies import POLICY_NAMES
from scheduler.sim.trace import TraceError, from_rows
from scheduler.sim.whatif import check_choice, compare

log = logging.getLogger(__name__)

TASK = "whatif.run_evaluation"
PROGRESS_EVERY_S = 0.5
STALE_S = 600.0  # a running evaluation that has not moved for this long lost its worker
DEFAULT_POLICIES: tuple[str, ...] = ("slurm-pr", "static", "reclaimnet")
# what the page offers (the API takes any name scheduler.sim.policies.get_policy knows: fixed:S, abl-XYZ, +fair)
OFFERED_POLICIES: tuple[str, ...] = tuple(p for p in POLICY_NAMES if ":" not in p)


def upload_limits() -> tuple[int, int]:
    """(bytes an upload may have as sent, bytes once unzipped)."""
    return (int(getattr(settings, "RECLAIMNET_WHATIF_UPLOAD_MAX_BYTES", 2_500_000)),
            int(getattr(settings, "RECLAIMNET_WHATIF_TRACE_MAX_BYTES", 64 * 2**20)))


def parse_seeds(value: Any) -> list[int]:
    """Seeds as a list of integers or a comma-separated string; UploadError naming ``seeds``."""
    items = value if isinstance(value, list | tuple) else str(value if value is not None else "").split(",")
    seeds: list[int] = []
    for item in items:
        if isinstance(item, str):
            item = item.strip()
            if not item:
                continue
            if not item.isdigit():
                raise UploadError("seeds", f"not a non-negative integer: {item[:40]!r}")
            item = int(item)
        if isinstance(item, bool) or not isinstance(item, int):
            raise UploadError("seeds", f"not an integer: {item!r}")
        seeds.append(item)
    return seeds


def parse_policies(value: Any) -> list[str]:
    items = value if isinstance(value, list | tuple) else str(value if value is not None else "").split(",")
    if not all(isinstance(p, str) for p in items):
        raise UploadError("policies", "a list of policy names")
    return [p.strip() for p in items if p.strip()]


def create_evaluation(user: Any, *, policies: Sequence[str], seeds: Sequence[int], source: str,
                      days: Any = None, upload: tuple[str, bytes] | None = None) -> Evaluation:
    """Validate, store and queue an evaluation. Raises UploadError naming the field."""
    try:
        names, seed_list = check_choice(policies, seeds)
    except TraceError as e:
        raise UploadError(e.field, e.message) from None
    ev = Evaluation(created_by=user if getattr(user, "is_authenticated", False) else None,
                    policies=names, seeds=seed_list)
    if source == TraceSource.HISTORY:
        try:
            n_days = int(str(days).strip()) if days not in (None, "") else 30
        except ValueError:
            raise UploadError("days", f"not a whole number of days: {str(days)[:40]!r}") from None
        if not 1 <= n_days <= 366:
            raise UploadError("days", "from 1 to 366")
        ev.source, ev.history_days, ev.trace_name = TraceSource.HISTORY, n_days, f"portal history, last {n_days} days"
    elif source == TraceSource.UPLOAD:
        if upload is None:
            raise UploadError("trace", "upload a JSON file or a zip of the CSV folder")
        name, data = upload
        trace = parse_upload(data, name, *upload_limits())
        ev.source, ev.trace_name = TraceSource.UPLOAD, name[:200]
        ev.set_trace(rows_of(trace))
    else:
        raise UploadError("source", "history or upload")
    with transaction.atomic():
        ev.save()
        outbox.enqueue(TASK, ev.pk)
    return ev


def expire_stale(now: dt.datetime | None = None) -> int:
    """Running evaluations whose worker stopped (no progress for STALE_S) become failed."""
    now = now or timezone.now()
    return Evaluation.objects.filter(state=EvaluationState.RUNNING,
                                     updated_at__lt=now - dt.timedelta(seconds=STALE_S)).update(
        state=EvaluationState.FAILED, finished_at=now, updated_at=now,
        error=f"the run stopped: no progress for {STALE_S:.0f} s (its worker ended)")


def run_evaluation(evaluation_id: int) -> str:
    """The task body. Returns the final state (or ``skipped`` when the row was not queued)."""
    now = timezone.now()
    if not Evaluation.objects.filter(pk=evaluation_id, state=EvaluationState.QUEUED).update(
            state=EvaluationState.RUNNING, started_at=now, updated_at=now, progress=0.0,
            progress_label="loading the trace"):
        return "skipped"
    ev = Evaluation.objects.get(pk=evaluation_id)
    last = [0.0]

    def progress(fraction: float, label: str) -> None:
        mono = time.monotonic()
        if mono - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = mono
        Evaluation.objects.filter(pk=evaluation_id, state=EvaluationState.RUNNING).update(
            progress=round(min(max(fraction, 0.0), 0.999), 4), progress_label=label[:200],
            updated_at=timezone.now())

    try:
        if ev.source == TraceSource.HISTORY:
            until = ev.started_at or now
            trace = history_trace(until - dt.timedelta(days=ev.history_days or 30), until)
            ev.set_trace(rows_of(trace))
            Evaluation.objects.filter(pk=ev.pk).update(trace_gz=ev.trace_gz, updated_at=timezone.now())
        else:
            trace = from_rows(ev.trace_rows())
        report = compare(trace, ev.policies, ev.seeds, progress=progress)
    except TraceError as e:
        return _fail(ev, f"{e.field}: {e.message}")
    except Exception as e:  # the report says why; the worker carries on (a time limit lands here too)
        log.exception("evaluation %s failed", evaluation_id)
        return _fail(ev, f"{type(e).__name__}: {e}"[:2000])
    done = timezone.now()
    Evaluation.objects.filter(pk=ev.pk).update(state=EvaluationState.DONE, progress=1.0, progress_label="done",
                                               report=report, finished_at=done, updated_at=done)
    return EvaluationState.DONE


def _fail(ev: Evaluation, error: str) -> str:
    done = timezone.now()
    Evaluation.objects.filter(pk=ev.pk).update(state=EvaluationState.FAILED, error=error, finished_at=done,
                                               updated_at=done)
    return EvaluationState.FAILED
