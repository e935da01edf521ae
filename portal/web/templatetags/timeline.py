"""The job timeline's checkpoint table, rendered in one pass (design §10 "CPU per request").

A run of checkpoints lists up to ``CHECKPOINT_ROWS`` rows, every one with six cells: through the template
language that is a few hundred variable lookups and filter calls per page, most of the job page's time. Here
each row is one ``format_html`` of values formatted once (the same words as the ``reclaimnet`` filters).
"""

from __future__ import annotations

from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from portal.web.templatetags.reclaimnet import duration, human_bytes

register = template.Library()

ROW = ('<tr><td>{}</td><td>{}</td><td class="num">{}</td><td class="num">{}</td><td>{}</td>'
       '<td>{}</td></tr>')


def _completed(row: Any) -> str:
    """``completed_at|date:"m-d H:i:s"`` in the current time zone ("" when not completed)."""
    return timezone.localtime(row.completed_at).strftime("%m-%d %H:%M:%S") if row.completed_at else ""


@register.simple_tag
def checkpoint_rows(items: list[dict[str, Any]]) -> SafeString:
    """The table rows of a run's shown checkpoints (``{"checkpoint": CheckpointRow, "took_s": …}``)."""
    return format_html_join("", ROW, (
        (c.sequence, _completed(c), human_bytes(c.size_bytes), duration(item["took_s"]), c.node_name or "?",
         c.copies)
        for item in items for c in (item["checkpoint"],)))


@register.simple_tag
def checkpoint_summary(item: dict[str, Any], prefix: str = "") -> SafeString:
    """One checkpoint in a line: size, how long it took, where it was written and copied."""
    c = item["checkpoint"]
    return format_html("{}{} · took {} · written on {} · {}", prefix, human_bytes(c.size_bytes),
                       duration(item["took_s"]), c.node_name or "?", c.copies)
