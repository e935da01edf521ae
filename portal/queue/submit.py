"""Submitting with the fair queue's fields (design §16.6): dependencies on earlier jobs, and arrays.

Both wrap ``portal.core.services.jobs.submit_job`` in one transaction: the jobs, their array rows and their
dependency rows exist together or not at all. A dependency names jobs that already exist, so no cycle can be
formed by construction: a new job can only wait for older ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from portal.core import permissions
from portal.core.models import Job
from portal.core.services import jobs as job_services
from portal.core.services.audit import audit
from portal.queue.models import ArrayTask, DependencyKind, JobArray, JobDependency
from scheduler.queue import ArraySpecError, parse_array_spec

MAX_PARENTS = 100


def _ids(field: str, value: Any) -> list[int]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    if not isinstance(value, list | tuple):
        raise ValidationError({field: ["A list of job ids is required."]})
    out: list[int] = []
    for v in value:
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str) and v.strip().isdigit())):
            raise ValidationError({field: [f"“{v}” is not a job id."]})
        out.append(int(v))
    if len(set(out)) > MAX_PARENTS:
        raise ValidationError({field: [f"At most {MAX_PARENTS} jobs."]})
    return sorted(set(out))


def parents(actor: Any, after_ok: Any, after_any: Any) -> list[tuple[int, str]]:
    """(parent id, kind) pairs, each parent a job ``actor`` can see; a 400 naming the field otherwise."""
    ok, any_ = _ids("after_ok", after_ok), _ids("after_any", after_any)
    both = set(ok) & set(any_)
    if both:
        raise ValidationError({"after_any": [f"Job {min(both)} is already in after_ok."]})
    wanted = set(ok) | set(any_)
    if not wanted:
        return []
    visible = Job.objects.all() if actor is None else permissions.visible_jobs(actor)
    found = set(visible.filter(pk__in=wanted).values_list("pk", flat=True))
    for field, ids in (("after_ok", ok), ("after_any", any_)):
        missing = [i for i in ids if i not in found]
        if missing:
            raise ValidationError({field: [f"No job {missing[0]} that you can see."]})
    return [(i, DependencyKind.AFTER_OK) for i in ok] + [(i, DependencyKind.AFTER_ANY) for i in any_]


def _depend(job: Job, pairs: Iterable[tuple[int, str]]) -> None:
    JobDependency.objects.bulk_create([JobDependency(job=job, parent_id=p, kind=k) for p, k in pairs])


def submit(actor: Any, *, after_ok: Any = None, after_any: Any = None, **fields: Any) -> Job:
    """One job, with its dependencies (a plain ``submit_job`` when it has none)."""
    pairs = parents(actor, after_ok, after_any)
    if not pairs:
        return job_services.submit_job(actor, **fields)
    with transaction.atomic():
        job = job_services.submit_job(actor, **fields)
        _depend(job, pairs)
        audit(actor, "job.depend", job, after_ok=[p for p, k in pairs if k == DependencyKind.AFTER_OK],
              after_any=[p for p, k in pairs if k == DependencyKind.AFTER_ANY])
    return job


def submit_array(actor: Any, *, array: str, after_ok: Any = None, after_any: Any = None, **fields: Any
                 ) -> JobArray:
    """An array: one job per index of ``array`` ("0-49%8"), each named "name[i]", sharing every other field
    and the dependencies."""
    try:
        spec = parse_array_spec(array)
    except ArraySpecError as exc:
        raise ValidationError({"array": [f"{str(exc)[:1].upper()}{str(exc)[1:]}."]}) from None
    indices, throttle = list(spec.indices), spec.throttle or None
    pairs = parents(actor, after_ok, after_any)
    name = str(fields.get("name", "")).strip()
    suffix = len(f"[{max(indices)}]")
    if len(name) + suffix > 120:
        raise ValidationError({"name": [f"An array's name has at most {120 - suffix} characters "
                                        "(each task adds its index)."]})
    with transaction.atomic():
        first = job_services.submit_job(actor, **{**fields, "name": f"{name}[{indices[0]}]"})
        arr = JobArray.objects.create(name=name, owner=first.owner, group=first.group, spec=array.strip(),
                                      size=len(indices), throttle=throttle)
        jobs = [first] + [job_services.submit_job(actor, **{**fields, "name": f"{name}[{i}]"})
                          for i in indices[1:]]
        ArrayTask.objects.bulk_create([ArrayTask(array=arr, job=j, index=i)
                                       for j, i in zip(jobs, indices, strict=True)])
        if pairs:
            JobDependency.objects.bulk_create([JobDependency(job=j, parent_id=p, kind=k)
                                               for j in jobs for p, k in pairs])
        audit(actor, "array.submit", arr, spec=arr.spec, size=arr.size, group=first.group.slug)
    return arr


def submit_any(actor: Any, *, array: str | None = None, after_ok: Any = None, after_any: Any = None,
               **fields: Any) -> Job | JobArray:
    """A job, or an array when ``array`` is given; either with its dependencies."""
    if array is not None and str(array).strip():
        return submit_array(actor, array=str(array), after_ok=after_ok, after_any=after_any, **fields)
    return submit(actor, after_ok=after_ok, after_any=after_any, **fields)
