"""What a job's start command carries about its place in the fair queue (design §16.6): an array task's id and
index, which the agent puts in the job's environment (``RECLAIMNET_ARRAY_ID``, ``RECLAIMNET_ARRAY_INDEX``)."""

from __future__ import annotations

from typing import Any

from portal.core.models import Job
from portal.queue.models import ArrayTask


def start_fields(job: Job) -> dict[str, Any]:
    """Extra fields of ``job``'s ``start_job`` command: ``{"env": {...}}`` for an array task, else none (one
    statement)."""
    row = ArrayTask.objects.filter(job_id=job.pk).values_list("array_id", "index").first()
    if row is None:
        return {}
    return {"env": {"RECLAIMNET_ARRAY_ID": str(row[0]), "RECLAIMNET_ARRAY_INDEX": str(row[1])}}
