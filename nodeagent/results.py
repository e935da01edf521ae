"""Job results: the agent uploads a job's output directory and final checkpoint to the portal (design §14).

A job declares ``output_dir`` (relative to its work directory) in its start command. When the job ends on its
own (completed or failed) the agent reports the end first, then queues an upload of that directory and of the
job's newest checkpoint; when it stops to move (its final checkpoint taken, exit 75) the directory is uploaded
too, without the checkpoint (it travels with the job), since the next node has its own working directory;
a cancelled or killed job uploads nothing; with ``upload_with_checkpoints`` the directory is also
uploaded after each checkpoint. The queue is a file in the agent's data directory, so an agent restart resumes
it; uploads run one at a time in the background, paced by a :class:`~nodeagent.edge.TokenBucket` and marked with
the lowest DSCP class, and never hold up the websocket link.

Each file goes over HTTP(S) to the portal (the node's agent token as ``Authorization: Bearer``), in chunks of
at most the portal's ``chunk_bytes``, with the whole file's sha256 (protocol: ``portal/core/services/results.py``).
The portal keeps what it verified, so after any restart the agent asks what is kept and sends only the rest,
resuming a half-sent file at the offset the portal names. A transient failure (connection refused, 5xx) is
retried with exponential backoff and full jitter; a checksum mismatch sends the file again (re-read: it may
have changed); a refusal for good (the group's results cap, 413) ends that job's upload.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import re
import ssl
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from nodeagent import jobkit
from nodeagent.edge import DSCP_BY_CLASS, TokenBucket, mark_socket
from nodeagent.transfer import Faults, safe_id

log = logging.getLogger(__name__)

DEFAULT_RATE_BYTES_PER_S = float(os.environ.get("RECLAIMNET_RESULTS_RATE_BYTES_PER_S", 25e6))  # 200 Mbit/s
DEFAULT_CHUNK_BYTES = 2 * 2**20  # until the portal says its own (``chunk_bytes`` in its manifest)
REQUEST_TIMEOUT_S = 60.0
RETRY_MIN_S = 0.5
RETRY_MAX_S = 300.0
GIVE_UP_AFTER_S = 86_400.0  # as the link's reliable reports: a day
CHECKSUM_RETRIES = 3  # a file whose sha256 keeps mismatching (changing while read) is skipped after this
MAX_FILES = 10_000
MAX_RESPONSE_BYTES = 1 << 20
FLOW_CLASS = "presync"  # the lowest DSCP class: results never crowd out a migration
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


class TransientError(Exception):
    """Worth trying again later (the portal or the network is down, busy, restarting)."""


class UploadRefusedError(Exception):
    """The portal refused the upload for good (cap, unknown job, bad token): stop this job's upload."""


def http_base(portal_url: str) -> str:
    """``ws://host:port/ws/agent/`` → ``http://host:port`` (``wss`` → ``https``)."""
    parts = urlsplit(portal_url)
    scheme = {"ws": "http", "wss": "https", "http": "http", "https": "https"}.get(parts.scheme, "http")
    return f"{scheme}://{parts.netloc}"


def output_root(work_dir: Path, output_dir: str) -> Path | None:
    """The job's output directory inside ``work_dir``, or None when it would leave it (``..``, absolute, a
    symlink pointing out): the start command is checked by the portal, but the agent trusts no path."""
    if not output_dir or output_dir.startswith("/") or _BAD_CHARS.search(output_dir):
        return None
    if any(part == ".." for part in output_dir.split("/")):
        return None
    root = (work_dir / output_dir).resolve()
    work = work_dir.resolve()
    return root if root == work or work in root.parents else None


def list_files(root: Path) -> list[tuple[str, Path]]:
    """Regular files under ``root`` (relative POSIX path, absolute path), sorted; symlinks are never followed
    and names the portal would refuse (control characters, backslashes) are skipped."""
    out: list[tuple[str, Path]] = []
    if not root.is_dir() or root.is_symlink():
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not (Path(dirpath) / d).is_symlink())
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink() or not path.is_file() or _BAD_CHARS.search(rel) or name.endswith(".tmp"):
                continue
            out.append((rel, path))
            if len(out) >= MAX_FILES:
                log.warning("more than %d files under %s: the rest are not uploaded", MAX_FILES, root)
                return out
    return out


class NotRegularFileError(FileNotFoundError):
    """The path is (now) a symlink or not a regular file: not part of the results."""


def open_regular(path: Path) -> Any:
    """``path`` opened for reading without following a symlink in its last component (``O_NOFOLLOW``, checked
    on the open file, not before it: a file swapped for a symlink after listing is refused, not read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO never blocks
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise NotRegularFileError(f"{path}: {exc.strerror}") from exc  # ELOOP: a symlink
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFileError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")


def file_digest(path: Path) -> tuple[str, int]:
    """(sha256, size) of the file as it is now."""
    digest = hashlib.sha256()
    size = 0
    with open_regular(path) as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def retry_delay_s(attempts: int, rand: float) -> float:
    """Exponential backoff with full jitter: uniform in [RETRY_MIN_S, min(RETRY_MAX_S, 2**attempts)]."""
    cap = min(RETRY_MAX_S, max(RETRY_MIN_S, 2.0 ** attempts))
    return RETRY_MIN_S + rand * (cap - RETRY_MIN_S)


@dataclass
class UploadTask:
    """One job's upload: its output directory (absolute) and, when final, its checkpoint directory."""

    job_id: str
    root: str
    ckpt_dir: str = ""
    final: bool = True
    attempts: int = 0
    not_before: float = 0.0  # unix time of the next try
    created_at: float = field(default_factory=time.time)


@dataclass
class HttpAnswer:
    status: int
    body: dict[str, Any]


class ResultsUploader:
    """The agent's results queue and its one upload loop (see the module docstring)."""

    def __init__(self, data_dir: Path, portal_url: str, token: str, *,
                 rate_bytes_per_s: float | None = DEFAULT_RATE_BYTES_PER_S, faults: Faults | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.base = http_base(portal_url)
        self.token = token
        self.queue_path = data_dir / "results" / "queue.json"
        self.pacer = TokenBucket(rate_bytes_per_s, burst_bytes=256 * 1024)
        self.faults = faults
        self.clock = clock
        self.tasks: dict[str, UploadTask] = {}
        self.chunk_bytes = DEFAULT_CHUNK_BYTES
        self._wake = asyncio.Event()
        self.done: list[str] = []  # job ids whose upload finished (tests and logs)
        self._load()

    # --- the queue ------------------------------------------------------------------------------------------
    def _load(self) -> None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            for raw in json.loads(self.queue_path.read_text()):
                task = UploadTask(**{k: raw[k] for k in UploadTask.__dataclass_fields__ if k in raw})
                self.tasks[safe_id(task.job_id, "job id")] = task
        if self.tasks:
            log.info("resuming the results upload of %d job(s)", len(self.tasks))

    def _save(self) -> None:
        self.queue_path.parent.mkdir(parents=True, exist_ok=True)
        jobkit.atomic_write_bytes(self.queue_path, json.dumps([asdict(t) for t in self.tasks.values()]).encode())

    def enqueue(self, job_id: str, work_dir: Path, output_dir: str, *, final: bool, ckpt_dir: Path | None = None
                ) -> bool:
        """Queue the upload of ``output_dir`` (and, when ``final``, the newest checkpoint in ``ckpt_dir``).
        A final upload replaces a queued interim one; an interim one never replaces a final one."""
        root = output_root(work_dir, output_dir)
        if root is None:
            log.warning("job %s: output_dir %r is not inside its work directory: nothing uploaded", job_id,
                        output_dir)
            return False
        queued = self.tasks.get(job_id)
        if queued is not None and queued.final and not final:
            return False
        self.tasks[job_id] = UploadTask(job_id=job_id, root=str(root), ckpt_dir=str(ckpt_dir or ""), final=final)
        self._save()
        self._wake.set()
        return True

    def _due(self) -> UploadTask | None:
        now = self.clock()
        due = [t for t in self.tasks.values() if t.not_before <= now]
        return min(due, key=lambda t: (t.not_before, t.created_at)) if due else None

    async def run(self) -> None:
        """Forever: the due task, one at a time; sleep until the next is due or one is queued."""
        while True:
            task = self._due()
            if task is None:
                self._wake.clear()
                waits = [t.not_before - self.clock() for t in self.tasks.values()]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), min(waits, default=3600.0))
                continue
            await self.run_task(task)

    async def run_task(self, task: UploadTask) -> bool:
        """One try at ``task``; returns True when it is finished (done, or given up)."""
        try:
            await self.upload(task)
        except TransientError as exc:
            if self.clock() - task.created_at > GIVE_UP_AFTER_S:
                log.warning("job %s results: still failing after a day (%s): given up", task.job_id, exc)
            else:
                task.attempts += 1
                task.not_before = self.clock() + retry_delay_s(task.attempts, random.random())
                log.info("job %s results: %s; trying again in %.1f s", task.job_id, exc,
                         task.not_before - self.clock())
                if self.tasks.get(task.job_id) is task:
                    self._save()
                return False
        except UploadRefusedError as exc:
            log.warning("job %s results refused by the portal: %s", task.job_id, exc)
        except Exception:  # a bug must not stop the other jobs' uploads for good
            log.exception("job %s results: upload failed", task.job_id)
        else:
            self.done.append(task.job_id)
            log.info("job %s results uploaded", task.job_id)
        if self.tasks.get(task.job_id) is task:  # a newer task queued meanwhile stays
            del self.tasks[task.job_id]
            self._save()
        return True

    # --- one job ---------------------------------------------------------------------------------------------
    async def upload(self, task: UploadTask) -> None:
        """Send what the portal does not hold yet; after a final upload, say which files the directory has."""
        base = f"/api/agent/jobs/{int(task.job_id)}/results/"
        held = await self.request("GET", base)
        if held.status != 200:
            self._raise_for(held, "asking what is kept")
        self.chunk_bytes = int(held.body.get("chunk_bytes") or DEFAULT_CHUNK_BYTES)
        kept: dict[str, str] = dict(held.body.get("files") or {})
        listed: list[str] = []
        for rel, path in list_files(Path(task.root)):
            listed.append(rel)
            with contextlib.suppress(FileNotFoundError):  # deleted since listed: not part of the results
                await self.upload_file(base + "files/" + quote(rel, safe="/"), path, kept.get(rel))
        checkpoint_name = None
        if task.final and task.ckpt_dir:
            newest = (jobkit.list_manifests(Path(task.ckpt_dir)) or [None])[-1]
            if newest is not None and not (Path(task.ckpt_dir) / newest.file).is_symlink():
                checkpoint_name = newest.file
                held_ckpt = held.body.get("checkpoint") or {}
                known = held_ckpt.get("sha256") if held_ckpt.get("path") == newest.file else None
                with contextlib.suppress(FileNotFoundError):  # gone, or swapped for a symlink: not sent
                    await self.upload_file(base + "checkpoint/" + quote(newest.file),
                                           Path(task.ckpt_dir) / newest.file, known, sequence=newest.sequence)
        if task.final:
            answer = await self.request("POST", base + "complete/",
                                        json.dumps({"files": listed, "checkpoint": checkpoint_name}).encode(),
                                        {"Content-Type": "application/json"})
            if answer.status != 200:
                self._raise_for(answer, "completing")

    async def upload_file(self, url: str, path: Path, kept_sha256: str | None, sequence: int | None = None) -> None:
        """One file, chunk by chunk from the offset the portal holds; a checksum mismatch re-reads it."""
        for _ in range(CHECKSUM_RETRIES):
            sha, size = await asyncio.to_thread(file_digest, path)
            if sha == kept_sha256:
                return
            headers = {"X-Checksum-SHA256": sha, "X-Total-Size": str(size)}
            if sequence is not None:
                headers["X-Checkpoint-Sequence"] = str(sequence)
            offset = 0
            while True:
                chunk = await asyncio.to_thread(_read_at, path, offset, min(self.chunk_bytes, size - offset))
                if len(chunk) != min(self.chunk_bytes, size - offset):
                    break  # the file changed size while being sent: hash it again
                await self.pacer.consume(len(chunk))
                chunk = self._maybe_corrupt(chunk)
                answer = await self.request("PUT", url, chunk, {**headers, "X-Offset": str(offset),
                                                                "Content-Type": "application/octet-stream"})
                if answer.status in (200, 201) and answer.body.get("complete"):
                    return
                if answer.status == 200 or answer.status == 409:  # next chunk, or resume where the portal is
                    new_offset = answer.body.get("offset")
                    if not isinstance(new_offset, int) or not 0 <= new_offset <= size:
                        raise TransientError(f"portal answered offset {new_offset!r} for {path.name}")
                    offset = new_offset
                    continue
                if answer.status == 422:
                    log.warning("%s: %s", path.name, answer.body.get("detail", "checksum mismatch"))
                    break  # the portal discarded what it staged: hash and send again
                if answer.status == 400:
                    log.warning("%s refused: %s", path.name, answer.body)
                    return
                self._raise_for(answer, f"sending {path.name}")
        log.warning("%s: sha256 kept mismatching after %d tries: not uploaded", path, CHECKSUM_RETRIES)

    def _maybe_corrupt(self, chunk: bytes) -> bytes:
        """Test-only: ``faults.json`` with ``"classes": ["results"]`` corrupts the next chunks sent."""
        if self.faults is not None and chunk and self.faults.take("results") == "corrupt":
            return bytes([chunk[0] ^ 0xFF]) + chunk[1:]
        return chunk

    @staticmethod
    def _raise_for(answer: HttpAnswer, doing: str) -> None:
        detail = answer.body.get("detail", "")
        if answer.status in (401, 403, 404, 413):
            raise UploadRefusedError(f"{doing}: HTTP {answer.status} {detail}")
        raise TransientError(f"{doing}: HTTP {answer.status} {detail}")

    # --- HTTP ------------------------------------------------------------------------------------------------
    async def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
                      ) -> HttpAnswer:
        """One HTTP/1.1 request on its own connection; connection errors and timeouts are TransientError."""
        try:
            return await asyncio.wait_for(self._request(method, path, body, headers or {}), REQUEST_TIMEOUT_S)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            raise TransientError(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc

    async def _request(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> HttpAnswer:
        parts = urlsplit(self.base)
        tls = parts.scheme == "https"
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if tls else 80)
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl.create_default_context() if tls else None,
                                                       server_hostname=host if tls else None)
        try:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                mark_socket(sock, DSCP_BY_CLASS[FLOW_CLASS])
            head = [f"{method} {path} HTTP/1.1", f"Host: {parts.netloc}", f"Authorization: Bearer {self.token}",
                    f"Content-Length: {len(body)}", "Connection: close", "Accept: application/json",
                    *(f"{k}: {v}" for k, v in headers.items())]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            await writer.drain()
            status_line = await reader.readline()
            status = int(status_line.split()[1])
            length = None
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            raw = await (reader.readexactly(length) if length is not None else reader.read(MAX_RESPONSE_BYTES))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"detail": raw[:200].decode("utf-8", "replace")}
        return HttpAnswer(status, parsed if isinstance(parsed, dict) else {"detail": str(parsed)[:200]})


def _read_at(path: Path, offset: int, n_bytes: int) -> bytes:
    with open_regular(path) as fh:
        fh.seek(offset)
        return fh.read(n_bytes)
