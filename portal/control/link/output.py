"""Job output from the agents: cleaned, appended to the job's capped tail, with a marker per run (design §9.11).

Agents are untrusted: the text of a ``job_output`` report is bounded by the protocol
(:data:`portal.control.link.protocol.MAX_OUTPUT_TEXT_CHARS`), then made safe here — valid UTF-8 (lone surrogates
replaced), ANSI escape sequences and control characters removed except newline and tab, carriage returns turned
into newlines. Pages escape it again when they render it.

The report is reliable (``msg_id``, answered ``received``): :func:`portal.control.link.handlers.handle` inserts
its ``ReceivedReport`` first, so a re-sent copy is never appended twice. :func:`append_report` writes one chunk
per report (markers included), trims the oldest chunks beyond ``OUTPUT_CAP_BYTES`` and publishes a job-scoped
``job.output`` live event at most once a second per job. :func:`begin_run` writes the marker of a new run when
``job_started`` is handled; :func:`failure_with_output` gives a failed job's status message its last lines.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.utils import timezone

from portal.control.link.protocol import MAX_OUTPUT_TAIL_CHARS
from portal.control.reclaim.workflow import publish_after_commit
from portal.core.models import JobOutput, JobOutputChunk, Node, Placement
from portal.core.models.output import OUTPUT_CAP_BYTES

EVENT_MIN_INTERVAL_S = 1.0  # live events per job at most this often (the agent ships every 2 s per job)
FAILURE_LINES = 3  # lines of output a failed job's status message quotes
FAILURE_REASON_MAX_CHARS = 500  # Job.failure_reason's length
FAILURE_TAIL_CHARS = MAX_OUTPUT_TAIL_CHARS  # how much of the end of the output is searched for those lines

# ESC [ … final (CSI), ESC ] … BEL/ST (OSC), ESC P/X/^/_ … ST (DCS, SOS, PM, APC), ESC + (intermediates +) final.
# An unterminated string sequence ends at the line's end, so a malformed one never swallows the lines after it.
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|\][^\x07\x1b\n]*(?:\x07|\x1b\\)?|[PX^_][^\x1b\n]*(?:\x1b\\)?"
                  r"|[ -/]*[0-~])?")
# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides (text that reads backwards).
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
MARKER = re.compile(r"^(— .* —|\[… .* …\])$")  # lines the portal writes, never quoted as the job's output


def clean_text(text: str) -> str:
    """Agent text made safe to store and show: valid UTF-8, no escape sequences or control characters but
    newline and tab; a carriage return (a progress bar redrawing its line) becomes a newline."""
    text = text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates (valid JSON, invalid UTF-8) → "?"
    text = ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return CONTROL.sub("", text)


def _size(n_bytes: int) -> str:
    size = float(n_bytes)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover  (the loop returns)


def _locked(job_id: int) -> JobOutput:
    """The job's output head, created if needed, locked until the transaction ends (appends are serialised)."""
    out, _ = JobOutput.objects.select_for_update().get_or_create(job_id=job_id)
    return out


def _node_name(node_id: int) -> str:
    return str(Node.objects.filter(pk=node_id).values_list("name", flat=True).first() or f"#{node_id}")


def _write(out: JobOutput, text: str, node_id: int) -> None:
    """Append ``text`` as one chunk, drop the oldest chunks beyond the cap, publish (throttled), save the head."""
    data_bytes = len(text.encode())
    if not data_bytes:
        return
    start = out.end_offset
    JobOutputChunk.objects.create(job_id=out.job_id, start_offset=start, end_offset=start + data_bytes, text=text)
    out.end_offset = start + data_bytes
    out.ends_with_newline = text.endswith("\n")
    out.last_node_id = node_id
    if out.end_offset - out.start_offset > OUTPUT_CAP_BYTES:
        chunks = JobOutputChunk.objects.filter(job_id=out.job_id)
        kept_from = (chunks.filter(start_offset__gte=out.end_offset - OUTPUT_CAP_BYTES).order_by("start_offset")
                     .values_list("start_offset", flat=True).first())
        kept_from = start if kept_from is None else kept_from  # one chunk over the cap: keep that one
        chunks.filter(start_offset__lt=kept_from).delete()
        out.start_offset = kept_from
    now = timezone.now()
    if out.published_at is None or now - out.published_at >= dt.timedelta(seconds=EVENT_MIN_INTERVAL_S):
        out.published_at = now
        publish_after_commit([f"job-{out.job_id}"], "job.output", job_id=out.job_id, offset=out.end_offset)
    out.save()


def _line_start(out: JobOutput) -> str:
    return "" if out.ends_with_newline else "\n"


def append_report(node_id: int, msg: dict[str, Any]) -> str | None:
    """Append a ``job_output`` report of ``node_id``; return why it is refused, or None when it was written.

    A node that never ran the job is refused. Output of an earlier run that arrives after the job moved on is
    kept, under a marker saying so; the newest run's output after it gets a marker again."""
    job_id = int(msg["job_id"])
    if not Placement.objects.filter(job_id=job_id, node_id=node_id).exists():
        return f"job {job_id} was never placed on this node"
    out = _locked(job_id)
    parts = []
    if out.runs and out.last_node_id != node_id:
        name = _node_name(node_id)
        parts.append(_line_start(out) + (f"— run {out.runs} on node {name}, continued —\n"
                                          if node_id == out.run_node_id else
                                          f"— output of an earlier run on node {name}, arrived late —\n"))
    skipped = msg.get("skipped_bytes", 0)
    if isinstance(skipped, int) and not isinstance(skipped, bool) and skipped > 0:
        lead = "" if parts or out.ends_with_newline else "\n"
        parts.append(f"{lead}[… {_size(skipped)} of output skipped here: the job wrote it faster than its node "
                     "sends output …]\n")
    parts.append(clean_text(msg["text"]))
    _write(out, "".join(parts), node_id)
    return None


def begin_run(job_id: int, node_id: int, *, restored_sequence: int | None, restored_step: int | None) -> None:
    """A run of the job started on ``node_id`` (``job_started``): write its marker line."""
    out = _locked(job_id)
    out.runs += 1
    out.run_node_id = node_id
    if restored_sequence is not None:
        how = (f", resumed from step {restored_step}" if restored_step is not None
               else f", resumed from checkpoint #{restored_sequence}")
    else:
        how = ", started again from the beginning" if out.runs > 1 else ""
    _write(out, f"{_line_start(out)}— run {out.runs} on node {_node_name(node_id)}{how} —\n", node_id)


def failure_with_output(job_id: int, reason: str, agent_tail: Any = None) -> str:
    """``reason`` followed by the last lines the job printed, within ``Job.failure_reason``'s 500 characters.

    The lines come from ``agent_tail`` (the end of the output the agent's ``job_exited`` carries) when it sent
    one, else from what the portal stored; the portal's own marker lines are never quoted."""
    if isinstance(agent_tail, str):
        text = clean_text(agent_tail[-FAILURE_TAIL_CHARS:])
    else:
        newest = JobOutputChunk.objects.filter(job_id=job_id).order_by("-start_offset").values_list("text", flat=True)
        text = "".join(reversed(list(newest[:4])))[-FAILURE_TAIL_CHARS:]
    lines = [line.strip() for line in text.split("\n")]
    lines = [line for line in lines if line and not MARKER.match(line)][-FAILURE_LINES:]
    if not lines:
        return reason[:FAILURE_REASON_MAX_CHARS]
    prefix = f"{reason}. Last output: "
    room = FAILURE_REASON_MAX_CHARS - len(prefix)
    if room < 40:
        return reason[:FAILURE_REASON_MAX_CHARS]
    quoted = " | ".join(lines)
    if len(quoted) > room:
        quoted = "…" + quoted[-(room - 1):]
    return prefix + quoted
