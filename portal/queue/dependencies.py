"""What a job's end does to the jobs that depend on it, and what people are told (design §16.6).

An ``after_ok`` dependant of a job that failed or was cancelled can never start: it is cancelled with the reason,
in the transaction that ended its parent, and so are its own dependants, level by level — a worklist, one
statement to find, one to lock and one to cancel each level, so a chain of any depth never recurses and a
1,000-task array is one UPDATE. ``after_ok`` dependants of a completed parent, and ``after_any`` ones, simply
become eligible: the next placement pass sees it.

Notices: a single job cancelled this way gets its own ``job.dependency_cancelled``; an array gets ONE
``array.dependency_cancelled`` per cascade with the count, and one ``array.finished`` (counts per outcome) when
its last task ends; its tasks' own ``job.finished`` / ``job.failed`` / ``job.dependency_cancelled`` are folded
away (``events.FOLDED``), so an array of any size sends a bounded number of notices.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from django.db import transaction
from django.db.models import Case, CharField, Count, Value, When
from django.urls import reverse
from django.utils import timezone

from portal.core import events
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.lifecycle.jobs import JobState
from portal.core.models import AuditLog, Job
from portal.queue.models import ArrayTask, DependencyKind, JobArray, JobDependency

# An array task's own notices of these kinds are folded into its array's notices.
ARRAY_FOLDED_EVENTS = frozenset({"job.finished", "job.failed", "job.dependency_cancelled"})
BAD_ENDS = (JobState.FAILED, JobState.CANCELLED)


def cancel_reason(parent: Job) -> str:
    return (f"Cancelled: it runs only after job {parent.pk} “{parent.name}” completes, and that job "
            f"{'failed' if parent.state == JobState.FAILED else 'was cancelled'}.")


def job_ended(job: Job) -> None:
    """The lifecycle's end hook (``END_HOOKS``): cancel the queued ``after_ok`` dependants of a job that did not
    complete (one statement when it has none), and tell the array's people once its last task ended."""
    with transaction.atomic():  # the caller's transaction, normally (locks need one)
        if job.state in BAD_ENDS:
            cascade(next_level([job]))
        array_id = ArrayTask.objects.filter(job_id=job.pk).values_list("array_id", flat=True).first()
        if array_id is not None:
            announce_if_ended(array_id)


def parents_failed(jobs: list[Job]) -> list[tuple[Job, Job]]:
    """For queued jobs with an ``after_ok`` parent that failed or was cancelled: (job, that parent), two
    statements (the placement pass's catch-all for parents that ended before the hook could see a dependant)."""
    first: dict[int, int] = {}
    for job_id, parent_id in (JobDependency.objects.filter(job__in=[j.pk for j in jobs], kind=DependencyKind.AFTER_OK,
                                                           parent__state__in=BAD_ENDS)
                              .order_by("job_id", "parent_id").values_list("job_id", "parent_id")):
        first.setdefault(job_id, parent_id)
    parents = Job.objects.in_bulk(set(first.values()))
    return [(j, parents[first[j.pk]]) for j in jobs if j.pk in first]


def next_level(parents: Iterable[Job]) -> list[tuple[Job, Job]]:
    """The queued ``after_ok`` dependants of ``parents`` (ended badly), locked, each with its first such parent."""
    by_pk = {p.pk: p for p in parents if p.state in BAD_ENDS}
    if not by_pk:
        return []
    first: dict[int, int] = {}
    for job_id, parent_id in (JobDependency.objects.filter(parent_id__in=list(by_pk), kind=DependencyKind.AFTER_OK,
                                                           job__state=JobState.QUEUED)
                              .order_by("job_id", "parent_id").values_list("job_id", "parent_id")):
        first.setdefault(job_id, parent_id)
    if not first:
        return []
    children = Job.objects.select_for_update().filter(pk__in=list(first), state=JobState.QUEUED).order_by("pk")
    return [(child, by_pk[first[child.pk]]) for child in children]


def _cancel_level(level: list[tuple[Job, Job]]) -> list[tuple[Job, Job]]:
    """Cancel one level in one UPDATE (each with its parent's reason) and audit it in one INSERT; the pairs whose
    job was still queued."""
    now = timezone.now()
    reasons = {child.pk: cancel_reason(parent)[:500] for child, parent in level}
    by_reason: dict[str, list[int]] = defaultdict(list)
    for pk, reason in reasons.items():
        by_reason[reason].append(pk)
    Job.objects.filter(pk__in=list(reasons), state=JobState.QUEUED).update(
        state=JobState.CANCELLED, finished_at=now,
        failure_reason=Case(*[When(pk__in=pks, then=Value(r)) for r, pks in by_reason.items()],
                            output_field=CharField()))
    done = {pk for pk, state in Job.objects.filter(pk__in=list(reasons)).values_list("pk", "state")
            if state == JobState.CANCELLED}
    cancelled = [(child, parent) for child, parent in level if child.pk in done]
    for child, _parent in cancelled:
        child.state, child.finished_at, child.failure_reason = JobState.CANCELLED, now, reasons[child.pk]
    AuditLog.objects.bulk_create([AuditLog(actor=None, action="job.dependency_cancelled", object_type="job",
                                           object_id=str(child.pk), detail={"parent": parent.pk})
                                  for child, parent in cancelled])
    return cancelled


def cascade(level: list[tuple[Job, Job]]) -> list[tuple[Job, Job]]:
    """Cancel these (queued job, the parent that failed) pairs and, level by level, every queued job that needs
    one of them to complete; then tell people (bounded: one notice per single job, one per array). Every pair
    cancelled, with its direct parent. Runs in the caller's transaction (or its own)."""
    if not level:
        return []
    done: list[tuple[Job, Job]] = []
    with transaction.atomic():
        while level:
            cancelled = _cancel_level(level)
            done.extend(cancelled)
            level = next_level(child for child, _ in cancelled)
        for child, _ in done:  # any other end hook sees each job the cascade ended (not this one: no recursion)
            for hook in job_lifecycle.END_HOOKS:
                if hook is not job_ended:
                    hook(child)
        _announce(done)
    return done


def _announce(done: list[tuple[Job, Job]]) -> None:
    """One ``job.dependency_cancelled`` per single job; one ``array.dependency_cancelled`` per array (the first
    task's direct parent named, how many others), with the array's final counts when it has now ended."""
    task_of = dict(ArrayTask.objects.filter(job_id__in=[c.pk for c, _ in done]).values_list("job_id", "array_id"))
    per_array: dict[int, list[tuple[Job, Job]]] = defaultdict(list)
    for child, parent in done:
        array_id = task_of.get(child.pk)
        if array_id is None:
            events.emit("job.dependency_cancelled", job=child, parent=parent.pk, parent_name=parent.name,
                        parent_state=parent.state)
        else:
            per_array[array_id].append((child, parent))
    arrays = JobArray.objects.in_bulk(list(per_array))
    for array_id, pairs in sorted(per_array.items()):
        arr = arrays[array_id]
        first, parent = pairs[0]
        ended, counts = array_state(array_id)
        events.emit("array.dependency_cancelled", job=first, array_id=array_id, array_name=arr.name,
                    array_size=arr.size, cancelled=len(pairs), parent=parent.pk, parent_name=parent.name,
                    parent_state=parent.state, others=len({p.pk for _, p in pairs} - {parent.pk}),
                    ended_counts=counts if ended else None, page_url=_array_url(array_id))


def array_state(array_id: int) -> tuple[bool, dict[str, int]]:
    """Whether every task of the array has ended, and its tasks by state (one statement)."""
    counts = dict(Job.objects.filter(array_task__array_id=array_id).values_list("state")
                  .annotate(n=Count("pk")).order_by())
    return all(state in job_lifecycle.TERMINAL for state in counts), counts


def announce_if_ended(array_id: int) -> None:
    """``array.finished`` once, when the array's last live task has ended. The array row is locked first, so of
    two tasks ending at once the second to commit sees the first's end and only it announces."""
    with transaction.atomic():
        arr = JobArray.objects.select_for_update().filter(pk=array_id).first()
        if arr is None:
            return
        ended, counts = array_state(array_id)
        if not ended:
            return
        first = Job.objects.filter(array_task__array_id=array_id).order_by("array_task__index").first()
        events.emit("array.finished", job=first, array_id=array_id, array_name=arr.name, array_size=arr.size,
                    counts=counts, page_url=_array_url(array_id))


def fold_array_task_event(name: str, facts: events.Facts) -> bool:
    """``events.FOLDED`` entry: an array task's own finished / failed / dependency_cancelled is not sent (its
    array's notices say it)."""
    return (name in ARRAY_FOLDED_EVENTS and facts.job is not None
            and ArrayTask.objects.filter(job_id=facts.job.pk).exists())


def _array_url(array_id: int) -> str:
    return reverse("queue:array-detail", args=[array_id])


def unmet(dependencies: list[tuple[str, str]]) -> bool:
    """Whether a job with these (kind, parent state) pairs must still wait."""
    for kind, state in dependencies:
        if kind == DependencyKind.AFTER_OK and state != JobState.COMPLETED:
            return True
        if kind == DependencyKind.AFTER_ANY and state not in job_lifecycle.TERMINAL:
            return True
    return False
