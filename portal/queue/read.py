"""What pages and the API show of a job's place in the fair queue (design §16.6), cheaply: one statement for a
job's standing and array, one more for its dependencies (the API only)."""

from __future__ import annotations

from typing import Any

from portal.core.lifecycle.jobs import JobState
from portal.core.models import Job
from portal.queue.models import DependencyKind, JobDependency

_FIELDS = ("queue_entry__priority", "queue_entry__class_term", "queue_entry__fair_share_term",
           "queue_entry__age_term", "queue_entry__rank", "queue_entry__reason", "queue_entry__reason_text",
           "queue_entry__estimated_start_at", "queue_entry__computed_at", "queue_entry__reserved_node__name",
           "array_task__index", "array_task__array_id", "array_task__array__spec", "array_task__array__name")


def priority_text(value: float, class_part: float, fair_part: float, age_part: float) -> str:
    return f"{value:.2f} = class {class_part:.2f} + fair share {fair_part:.2f} + age {age_part:.2f}"


def job_queue(job: Job) -> dict[str, Any]:
    """``{priority, estimated_start_at, queue_reason, queue_reason_text, reserved_node, array}`` of ``job``
    (one statement). The standing is shown only while the job is queued (a row left by a job that has
    started since is ignored)."""
    row = Job.objects.filter(pk=job.pk).values(*_FIELDS).first() or {}
    queued = job.state == JobState.QUEUED and row.get("queue_entry__priority") is not None
    out: dict[str, Any] = {"priority": None, "estimated_start_at": None, "queue_reason": None,
                           "queue_reason_text": "", "reserved_node": None, "array": None}
    if queued:
        terms = {"class": row["queue_entry__class_term"], "fair_share": row["queue_entry__fair_share_term"],
                 "age": row["queue_entry__age_term"]}
        out["priority"] = {"value": row["queue_entry__priority"], "terms": terms,
                           "text": priority_text(row["queue_entry__priority"], *terms.values()),
                           "rank": row["queue_entry__rank"], "computed_at": row["queue_entry__computed_at"]}
        out["estimated_start_at"] = row["queue_entry__estimated_start_at"]
        out["queue_reason"] = row["queue_entry__reason"] or None
        out["queue_reason_text"] = row["queue_entry__reason_text"]
        out["reserved_node"] = row["queue_entry__reserved_node__name"]
    if row.get("array_task__array_id") is not None:
        out["array"] = {"id": row["array_task__array_id"], "index": row["array_task__index"],
                        "spec": row["array_task__array__spec"], "name": row["array_task__array__name"]}
    return out


def job_parents(job: Job) -> dict[str, list[int]]:
    """``{"after_ok": [ids], "after_any": [ids]}`` (one statement)."""
    out: dict[str, list[int]] = {DependencyKind.AFTER_OK: [], DependencyKind.AFTER_ANY: []}
    for parent_id, kind in JobDependency.objects.filter(job=job).values_list("parent_id", "kind"):
        out[kind].append(parent_id)
    return {"after_ok": out[DependencyKind.AFTER_OK], "after_any": out[DependencyKind.AFTER_ANY]}
