"""``{% job_output_tail job as output %}``: the end of a job's output for its page's Output panel (design §9.11).

The panel is included in the job page and re-rendered alone by its fragment view (``web:job-output``), so it
reads what it shows itself instead of relying on the page view's context.
"""

from __future__ import annotations

from typing import Any

from django import template

from portal.core.lifecycle.jobs import TERMINAL
from portal.core.models import Job, JobOutput
from portal.core.models.output import OUTPUT_CAP_BYTES, read_output

register = template.Library()

PAGE_TAIL_BYTES = 64 * 1024  # the page shows the end of the kept output; the API serves all of it
CAP_TEXT = f"{OUTPUT_CAP_BYTES // 1024} KiB"


@register.simple_tag
def job_output_tail(job: Job) -> dict[str, Any]:
    """``text`` (the last PAGE_TAIL_BYTES, from a line start), ``capped`` (earlier output is not shown: dropped
    by the portal's cap, or only in the API), ``running``, ``cap`` (what the portal keeps, in words)."""
    head = JobOutput.objects.filter(job_id=job.pk).values("start_offset", "end_offset").first()
    running = job.state not in TERMINAL
    if head is None:
        return {"text": "", "capped": False, "running": running, "cap": CAP_TEXT}
    since = max(head["start_offset"], head["end_offset"] - PAGE_TAIL_BYTES)
    offset, text = read_output(job.pk, since, head["start_offset"], head["end_offset"])
    if offset > 0 and "\n" in text[:-1]:  # started inside a line: show whole lines only
        text = text[text.index("\n") + 1:]
    return {"text": text, "capped": offset > 0, "running": running, "cap": CAP_TEXT}
