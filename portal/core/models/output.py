"""A job's output: the size-capped tail of its stdout+stderr across its runs, kept after it ends (design §9.11).

The output is one byte stream per job (UTF-8 text, cleaned by ``portal.control.link.output``). Every byte has an
offset that only grows: ``JobOutput.end_offset`` is the offset the next byte gets, ``start_offset`` the first
one still kept. The bytes are stored as the chunks the agents shipped (one row per report, plus run markers);
past :data:`OUTPUT_CAP_BYTES` the oldest chunks are deleted whole, so a reader following with ``since`` reads
only the chunks after its offset (one indexed range read) and learns how many bytes it missed.
"""

from __future__ import annotations

from django.db import models

from portal.core.models.jobs import Job
from portal.core.models.nodes import Node

OUTPUT_CAP_BYTES = 256 * 1024  # kept per job, across runs; the oldest chunks are dropped whole beyond it


class JobOutput(models.Model):
    """One job's output stream: where it starts and ends, its runs, and who wrote last."""

    job = models.OneToOneField(Job, primary_key=True, on_delete=models.CASCADE, related_name="output")
    start_offset = models.BigIntegerField(default=0, help_text="bytes dropped before the kept tail")
    end_offset = models.BigIntegerField(default=0, help_text="bytes ever written: the next byte's offset")
    runs = models.PositiveIntegerField(default=0, help_text="runs started (one per job_started)")
    run_node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                 help_text="the node of the newest run")
    last_node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                  help_text="the node whose output was written last")
    ends_with_newline = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)
    published_at = models.DateTimeField(null=True, blank=True, help_text="the last live event (throttled)")

    def __str__(self) -> str:
        return f"output of job {self.job_id} ({self.end_offset - self.start_offset} bytes kept)"


class JobOutputChunk(models.Model):
    """Bytes ``[start_offset, end_offset)`` of a job's output stream, as UTF-8 text."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="output_chunks")
    start_offset = models.BigIntegerField()
    end_offset = models.BigIntegerField()
    text = models.TextField()

    class Meta:
        ordering = ["job", "start_offset"]
        constraints = [models.UniqueConstraint(fields=["job", "start_offset"], name="output_chunk_offset_unique")]
        indexes = [models.Index(fields=["job", "end_offset"], name="output_chunk_follow")]

    def __str__(self) -> str:
        return f"job {self.job_id} output [{self.start_offset}, {self.end_offset})"


def read_output(job_id: int, since: int, start_offset: int, end_offset: int) -> tuple[int, str]:
    """The job's output from byte ``since`` (or the first byte still kept) up to ``end_offset``, read from the
    chunks in one indexed range read; returns (the offset the text starts at, the text).

    ``start_offset``/``end_offset`` are the head's as read just before: a chunk appended since is left for the
    next read, and chunks trimmed since move the returned offset forward (the caller reports them dropped)."""
    begin = max(since, start_offset)
    if begin >= end_offset:
        return end_offset, ""
    rows = (JobOutputChunk.objects.filter(job_id=job_id, end_offset__gt=begin, start_offset__lt=end_offset)
            .order_by("start_offset").values_list("start_offset", "text"))
    parts: list[str] = []
    offset = None
    for start, text in rows:
        if offset is None:
            offset = max(begin, start)
            if start < begin:  # the reader stopped inside this chunk: the rest of it (a split character dropped)
                text = text.encode()[begin - start:].decode("utf-8", "ignore")
        parts.append(text)
    return (end_offset, "") if offset is None else (offset, "".join(parts))
