"""Job output on the agent: read what a job prints, keep a capped tail, ship it in bounded batches (design §9.11).

The runner points a job's stdout and stderr at ``<work>/job.log``: a file, so a slow or absent portal never
blocks the job's writes. :class:`OutputTail` reads what the run appended (through a descriptor opened before the
job started, so a job that renames or removes the file changes nothing), decodes it (UTF-8, invalid bytes
replaced), removes escape sequences and control characters but newline and tab, folds progress-bar redraws
(``\\r``) into the line's last state, and keeps

- ``pending``: cleaned text not shipped yet, at most :data:`PENDING_CAP_BYTES`; beyond, the oldest is dropped and
  counted (``skipped_bytes``, which the portal shows as a marker line);
- ``tail``: the last :data:`TAIL_CHARS` characters, sent with ``job_exited`` for a failed job's status message.

:class:`OutputShipper` decides when output goes to the portal, as reliable ``job_output`` reports (``msg_id``,
kept until answered ``received``, design §9.9): per job at most every :data:`FLUSH_S`, sooner once
:data:`BATCH_BYTES` wait, never while the job's previous report is unanswered (so an outage keeps one report per
job queued, and the rest as a capped tail), and at most :data:`MESSAGES_PER_S` for the whole agent. Output
therefore never crowds heartbeats and reports out of the portal's 20 messages a second per agent.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Protocol

FLUSH_S = 2.0  # a job's new output is shipped at most this often ...
BATCH_BYTES = 16 * 1024  # ... or sooner once this much waits; also the most one report carries (UTF-8 bytes)
PENDING_CAP_BYTES = 64 * 1024  # output waiting to be shipped, per job; the oldest is dropped beyond (counted)
TAIL_CHARS = 4096  # the end of the output kept for job_exited (the portal reads at most this much of it)
PARTIAL_LINE_CHARS = 4096  # an unfinished line longer than this is shipped without waiting for its end
MESSAGES_PER_S = 2.0  # output reports per second for the whole agent (a token bucket) ...
MESSAGES_BURST = 4.0  # ... holding this many

# ESC [ … final (CSI), ESC ] … BEL/ST (OSC), ESC P/X/^/_ … ST (DCS, SOS, PM, APC), ESC + (intermediates +) final.
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]?|\][^\x07\x1b\n]*(?:\x07|\x1b\\)?|[PX^_][^\x1b\n]*(?:\x1b\\)?"
                  r"|[ -/]*[0-~])?")
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _char_start(data: bytes, cut: int) -> int:
    """``cut`` moved back to the start of the UTF-8 character it falls in."""
    while 0 < cut < len(data) and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return cut


class OutputTail:
    """One run's output: read from the log file from ``start_offset`` on, cleaned, pending and tail kept."""

    def __init__(self, path: Path, start_offset: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.position = start_offset
        self._file: BinaryIO | None = None
        with contextlib.suppress(OSError):
            # kept open for the run, closed by close(); never through a symlink (design §19)
            self._file = os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""  # the current line, not finished yet (raw, uncleaned)
        self._partial_since: float | None = None
        self._continued = False  # the last text shipped ended inside a line
        self._resync = False  # output was skipped mid-line: drop up to the next line start
        self.pending = ""
        self.pending_bytes = 0
        self.skipped_bytes = 0
        self.tail = ""

    # --- reading ------------------------------------------------------------------------------------------------
    def poll(self, final: bool = False) -> None:
        """Read what the job appended since the last poll (at most PENDING_CAP_BYTES of it: older bytes are
        skipped and counted); ``final``: the run ended, its unfinished line and undecodable bytes count too."""
        new = self._read()
        text = self._decoder.decode(new, final=final)
        self._take(text, final)

    def _read(self) -> bytes:
        f = self._file
        if f is None:
            return b""
        try:
            size = os.fstat(f.fileno()).st_size
            if size < self.position:  # the job truncated its log: what it writes now starts at 0
                self.position = 0
            available = size - self.position
            if available > PENDING_CAP_BYTES:
                self.skipped_bytes += available - PENDING_CAP_BYTES + len(self._partial.encode())
                self.position = size - PENDING_CAP_BYTES
                self._decoder.reset()
                self._partial, self._partial_since = "", None
                self._resync = True
            f.seek(self.position)
            data = f.read(available) if available > 0 else b""
        except (OSError, ValueError):
            return b""
        self.position += len(data)
        if self._resync:  # skipped into the middle of a line: what is shown starts at the next line
            newline = data.find(b"\n")
            cut = len(data) if newline < 0 else newline + 1
            self.skipped_bytes += cut
            data = data[cut:]
            self._resync = newline < 0
        return data

    def _take(self, text: str, final: bool) -> None:
        """Queue the finished lines; hold an unfinished one until it ends, grows long, waits FLUSH_S, or the run
        ends (so a progress bar's redraws fold into its last state)."""
        now = self.clock()
        text = self._partial + text
        cut = text.rfind("\n") + 1
        partial = text[cut:]
        waited = self._partial_since is not None and now - self._partial_since >= FLUSH_S and not text[:cut]
        if final or len(partial) > PARTIAL_LINE_CHARS or (partial and waited):
            cut = len(text)
            partial = ""
        self._partial = partial
        if not partial:
            self._partial_since = None
        elif self._partial_since is None or text[:cut]:
            self._partial_since = now
        if text[:cut]:
            self._queue(self._clean(text[:cut]))

    def _clean(self, text: str) -> str:
        """No escape sequences or control characters but newline and tab; a line redrawn with ``\\r`` keeps its
        last state (a redraw of a line already shipped starts a new line)."""
        lines = ANSI.sub("", text).replace("\r\n", "\n").split("\n")
        for i, line in enumerate(lines):
            if "\r" in line:
                states = [s for s in line.split("\r") if s]
                lines[i] = ("\n" if i == 0 and self._continued else "") + (states[-1] if states else "")
        cleaned = CONTROL.sub("", "\n".join(lines))
        if cleaned:
            self._continued = not cleaned.endswith("\n")
        return cleaned

    def _queue(self, text: str) -> None:
        if not text:
            return
        self.tail = (self.tail + text)[-TAIL_CHARS:]
        self.pending += text
        self.pending_bytes += len(text.encode())
        if self.pending_bytes > PENDING_CAP_BYTES:
            data = self.pending.encode()
            drop = len(data) - PENDING_CAP_BYTES
            newline = data.find(b"\n", drop, drop + PARTIAL_LINE_CHARS)
            drop = newline + 1 if newline >= 0 else _char_start(data, drop)
            self._set_pending(data[drop:].decode("utf-8", "ignore"))
            self.skipped_bytes += drop

    def _set_pending(self, text: str) -> None:
        self.pending = text
        self.pending_bytes = len(text.encode())

    # --- shipping -----------------------------------------------------------------------------------------------
    @property
    def has_news(self) -> bool:
        return bool(self.pending) or self.skipped_bytes > 0

    def take(self, limit_bytes: int = BATCH_BYTES, newest: bool = False) -> tuple[str, int]:
        """Up to ``limit_bytes`` of pending text, cut after a newline where one falls inside, and the bytes skipped
        before it. ``newest``: the last ``limit_bytes`` instead, the older pending text counted as skipped."""
        data = self.pending.encode()
        if len(data) <= limit_bytes:
            text, rest = self.pending, ""
        elif newest:  # from the first line start inside the window (a newline that is not the last byte)
            first = len(data) - limit_bytes
            start = data.find(b"\n", first, len(data) - 1) + 1 or _char_start(data, first + 3)
            self.skipped_bytes += start
            text, rest = data[start:].decode("utf-8", "ignore"), ""
        else:
            cut = data.rfind(b"\n", 0, limit_bytes) + 1 or _char_start(data, limit_bytes)
            text, rest = data[:cut].decode("utf-8", "ignore"), data[cut:].decode("utf-8", "ignore")
        self._set_pending(rest)
        skipped, self.skipped_bytes = self.skipped_bytes, 0
        return text, skipped

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


class HasOutput(Protocol):
    output: OutputTail | None


class OutputShipper:
    """When each running job's output goes to the portal (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.tokens = MESSAGES_BURST
        self._refilled = clock()
        self.in_flight: dict[str, str] = {}  # job id → msg_id of its report not answered yet
        self.last_sent: dict[str, float] = {}

    def _refill(self, now: float) -> None:
        self.tokens = min(MESSAGES_BURST, self.tokens + (now - self._refilled) * MESSAGES_PER_S)
        self._refilled = now

    @staticmethod
    def _message(job_id: str, text: str, skipped: int, final: bool) -> dict[str, Any]:
        msg: dict[str, Any] = {"type": "job_output", "msg_id": uuid.uuid4().hex, "job_id": int(job_id), "text": text}
        if skipped:
            msg["skipped_bytes"] = skipped
        if final:
            msg["final"] = True
        return msg

    def due(self, jobs: Mapping[str, HasOutput], unanswered: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Read every job's new output; the reports due now (the jobs waiting longest first)."""
        now = self.clock()
        self._refill(now)
        messages = []
        for job_id in sorted(jobs, key=lambda j: self.last_sent.get(j, -float("inf"))):
            out = jobs[job_id].output
            if out is None or not job_id.isdigit():
                continue
            out.poll()
            if not out.has_news or self.in_flight.get(job_id) in unanswered or self.tokens < 1:
                continue
            if now - self.last_sent.get(job_id, -float("inf")) < FLUSH_S and out.pending_bytes < BATCH_BYTES:
                continue
            text, skipped = out.take()
            msg = self._message(job_id, text, skipped, final=False)
            self.tokens -= 1
            self.in_flight[job_id] = msg["msg_id"]
            self.last_sent[job_id] = now
            messages.append(msg)
        return messages

    def final(self, job_id: str, out: OutputTail | None) -> dict[str, Any] | None:
        """The run ended: one last report with the newest BATCH_BYTES not shipped yet (older ones counted as
        skipped), sent before ``job_exited`` whatever is in flight — one message per job, so a kill-switch
        stopping every job at once stays a small burst. Forgets the job."""
        self.in_flight.pop(job_id, None)
        self.last_sent.pop(job_id, None)
        if out is None:
            return None
        out.poll(final=True)
        out.close()
        if not out.has_news or not job_id.isdigit():
            return None
        text, skipped = out.take(newest=True)
        return self._message(job_id, text, skipped, final=True)
