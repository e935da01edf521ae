"""Checkpoint data plane: agent-to-agent TCP transfer (design §1 pre-sync and migration, §4 pacing and DSCP).

Wire protocol (one checkpoint per connection, JSON lines for control, raw bytes for data):

1. sender → ``{"transfer_id", "token", "manifest"}``\\n
2. receiver checks the transfer was announced by the portal (``expect``) with this token's hash and the same
   sha256/size; replies ``{"ok": true, "offset": N}``\\n (N = bytes already held from an earlier broken
   attempt, so a transfer resumes) or ``{"ok": false, "error"}``\\n and closes.
3. sender streams bytes ``[N, size)``, paced at the P3 rate, DSCP-marked by class.
4. receiver hashes the whole file; on a match it publishes data + manifest into its store and replies
   ``{"ok": true, "done": true}``; on a mismatch it deletes the partial file (never resumed from) and replies
   ``{"ok": false, "error": "sha256 mismatch"}``; the sender then retries from offset 0.
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
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent import jobkit
from nodeagent.classbytes import TRANSFER_TALLY
from nodeagent.edge import DSCP_BY_CLASS, Edge, TokenBucket, mark_socket

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
MAX_HEADER_BYTES = 16 * 1024
IDLE_TIMEOUT_S = 60.0  # a silent sender (partitioned, not closed) frees the transfer for its next attempt
FATAL_REFUSALS = frozenset({"bad token", "token expired", "killswitch engaged"})


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Expected:
    """A transfer the portal announced to this (receiving) agent."""

    transfer_id: str
    token_hash: str
    job_id: str
    sequence: int
    sha256: str
    size_bytes: int
    expires_at: float


@dataclass
class SendResult:
    ok: bool
    attempts: int
    bytes_sent: int
    elapsed_s: float
    errors: list[str] = field(default_factory=list)


class Faults:
    """Test-only fault injection read from ``<data_dir>/faults.json``: ``{"corrupt": n, "truncate": n,
    "classes": [...]}`` makes the next n send attempts (of those flow classes, default all) flip a byte / drop
    the connection halfway. Consumed as used."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def take(self, flow_class: str) -> str | None:
        try:
            faults = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        if faults.get("classes") and flow_class not in faults["classes"]:
            return None
        for kind in ("corrupt", "truncate"):
            if int(faults.get(kind, 0)) > 0:
                faults[kind] = int(faults[kind]) - 1
                jobkit.atomic_write_bytes(self.path, json.dumps(faults).encode())
                return kind
        return None


_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def safe_id(value: object, what: str = "id") -> str:
    """``value`` as a string that is safe as one path component (job and transfer ids arrive over the network:
    ``../x`` or ``/etc`` must never name a file outside the agent's data directory)."""
    text = str(value)
    if isinstance(value, bool) or not _SAFE_ID.match(text):
        raise ValueError(f"unsafe {what} {text[:40]!r}")
    return text


def store_dir(data_dir: Path, job_id: str) -> Path:
    """Where an agent keeps job ``job_id``'s checkpoints (its own and the ones it received)."""
    return data_dir / "ckpt" / safe_id(job_id, "job id")


async def _read_json_line(reader: asyncio.StreamReader) -> dict[str, Any]:
    line = await reader.readline()
    if not line or len(line) > MAX_HEADER_BYTES:
        raise ConnectionError("no or oversized control line")
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("control line is not an object")
    return obj


def _write_json_line(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    writer.write(json.dumps(obj).encode() + b"\n")


class Receiver:
    """The agent's checkpoint server. ``on_received(transfer_id, manifest_dict)`` is awaited after verification."""

    def __init__(
        self,
        data_dir: Path,
        on_received: Callable[[str, dict[str, Any]], Awaitable[None]],
        on_rejected: Callable[[str, str], Awaitable[None]] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.incoming = data_dir / "incoming"
        self.incoming.mkdir(mode=0o700, parents=True, exist_ok=True)  # other jobs' bytes: no job user's to read
        os.chmod(self.incoming, 0o700)
        self.expected: dict[str, Expected] = {}
        self.active: set[str] = set()  # transfers with a connection writing their partial file now
        self.on_received = on_received
        self.on_rejected = on_rejected
        self.server: asyncio.base_events.Server | None = None
        self.refuse_new = False  # kill-switch: no new transfers in

    def expect(self, exp: Expected) -> None:
        """Accept one transfer (ids checked: the transfer id names the partial file, the job id the store)."""
        safe_id(exp.transfer_id, "transfer id")
        safe_id(exp.job_id, "job id")
        now = time.time()
        for stale in [t for t, e in self.expected.items() if e.expires_at < now and t not in self.active]:
            del self.expected[stale]  # announced copies that never came: their tokens are dead anyway
            (self.incoming / f"{stale}.part").unlink(missing_ok=True)
        self.expected[exp.transfer_id] = exp

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._handle, host, port, limit=MAX_HEADER_BYTES * 2)
        sock = self.server.sockets[0].getsockname()
        return sock[0], sock[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 1.0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one transfer attempt.

        1. Read and check the header against the announced transfer (token hash, sha256, size, expiry).
        2. Reply with the resume offset (size of the partial file from a broken attempt).
        3. Append bytes to the partial file until ``size``; a short read leaves it for the next attempt.
        4. Verify sha256 over the whole file; publish (data, then manifest) or delete and report the mismatch.
        """
        transfer_id = "?"
        owned: str | None = None
        try:
            header = await asyncio.wait_for(_read_json_line(reader), 10.0)
            transfer_id = str(header.get("transfer_id", "?"))
            manifest = header.get("manifest")
            exp = self.expected.get(transfer_id)
            error = None
            if self.refuse_new:
                error = "killswitch engaged"
            elif exp is None:
                error = "unknown transfer"
            elif not isinstance(manifest, dict):
                error = "manifest is not an object"
            elif not secrets.compare_digest(exp.token_hash, token_hash(str(header.get("token", "")))):
                error = "bad token"
            elif exp.expires_at < time.time():
                error = "token expired"
            elif transfer_id in self.active:
                error = "transfer already in progress"  # a second writer would interleave bytes in the .part
            elif manifest.get("sha256") != exp.sha256 or int(manifest.get("size_bytes", -1)) != exp.size_bytes:
                error = "manifest does not match the announced checkpoint"
            if error is not None or exp is None or not isinstance(manifest, dict):
                log.warning("transfer %s refused: %s", transfer_id, error)
                _write_json_line(writer, {"ok": False, "error": error})
                await writer.drain()
                return
            self.active.add(transfer_id)
            owned = transfer_id
            part = self.incoming / f"{transfer_id}.part"
            offset = part.stat().st_size if part.exists() else 0
            offset = min(offset, exp.size_bytes)
            _write_json_line(writer, {"ok": True, "offset": offset})
            await writer.drain()
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(part, flags, 0o600), "ab") as fh:  # design §19: readable by the agent only
                remaining = exp.size_bytes - offset
                while remaining > 0:
                    chunk = await asyncio.wait_for(reader.read(min(CHUNK_BYTES, remaining)), IDLE_TIMEOUT_S)
                    if not chunk:
                        fh.flush()
                        log.info("transfer %s broken at %d/%d bytes; can resume", transfer_id,
                                 exp.size_bytes - remaining, exp.size_bytes)
                        return
                    fh.write(chunk)
                    remaining -= len(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            digest = jobkit.sha256_file(part)
            if digest != exp.sha256:
                part.unlink(missing_ok=True)
                log.warning("transfer %s: sha256 mismatch (got %s), discarded", transfer_id, digest[:12])
                _write_json_line(writer, {"ok": False, "error": "sha256 mismatch"})
                await writer.drain()
                if self.on_rejected is not None:
                    await self.on_rejected(transfer_id, "sha256 mismatch")
                return
            dest_dir = store_dir(self.data_dir, exp.job_id)
            dest_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            stem = jobkit.ckpt_stem(exp.sequence)
            os.replace(part, dest_dir / f"{stem}{jobkit.DATA_SUFFIX}")
            manifest = {**manifest, "file": f"{stem}{jobkit.DATA_SUFFIX}", "sequence": exp.sequence}
            jobkit.atomic_write_bytes(dest_dir / f"{stem}{jobkit.MANIFEST_SUFFIX}", json.dumps(manifest).encode(),
                                      mode=0o600)
            self.expected.pop(transfer_id, None)
            _write_json_line(writer, {"ok": True, "done": True})
            await writer.drain()
            await self.on_received(transfer_id, manifest)
        except (TimeoutError, ConnectionError, ValueError, TypeError, OSError) as exc:
            log.info("transfer %s connection ended: %s", transfer_id, exc)
        finally:
            if owned is not None:
                self.active.discard(owned)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


@dataclass
class SendControl:
    """The live knobs of one outgoing transfer: the current P3 rate and the pacer of the attempt in progress.

    The agent keeps one per transfer id so that a ``set_rate`` command reaches the running attempt and the
    retries after it."""

    rate_bytes_per_s: float | None
    flow_class: str = "migration"
    dest: tuple[str, int] | None = None
    pacer: TokenBucket | None = None

    def set_rate(self, edge: Edge, rate_bytes_per_s: float) -> None:
        self.rate_bytes_per_s = rate_bytes_per_s
        if self.dest is not None:
            edge.update_rate(self.dest[0], self.dest[1], self.flow_class, rate_bytes_per_s, self.pacer)


async def send_checkpoint(
    *,
    host: str,
    port: int,
    transfer_id: str,
    token: str,
    ckpt_path: Path,
    manifest: dict[str, Any],
    rate_bytes_per_s: float | None,
    flow_class: str,
    edge: Edge,
    faults: Faults | None = None,
    max_attempts: int = 6,
    backoff_s: float = 0.1,
    control: SendControl | None = None,
) -> SendResult:
    """Send one checkpoint file, retrying with resume (broken connection) or from 0 (checksum mismatch).

    1. Connect with the class's DSCP already set on the socket; send the header; read the resume offset.
    2. Stream ``[offset, size)`` through the pacer (kernel-shaped flows get an unlimited userspace pacer).
    3. Read the verdict; on failure back off (exponential + jitter) and go to 1.
    """
    started = time.monotonic()
    size = ckpt_path.stat().st_size
    dscp = DSCP_BY_CLASS.get(flow_class, 0)
    result = SendResult(ok=False, attempts=0, bytes_sent=0, elapsed_s=0.0)
    for attempt in range(1, max_attempts + 1):
        result.attempts = attempt
        fault: str | None = None
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
            sock = writer.get_extra_info("socket")
            if sock is not None:
                mark_socket(sock, dscp)
            _write_json_line(writer, {"transfer_id": transfer_id, "token": token, "manifest": manifest})
            await writer.drain()
            reply = await asyncio.wait_for(_read_json_line(reader), 10.0)
            if not reply.get("ok"):
                error = str(reply.get("error"))
                if error in FATAL_REFUSALS:
                    raise PermissionError(error)
                raise ValueError(error)  # e.g. "unknown transfer": the announcement may still be on its way
            offset = int(reply.get("offset", 0))
            # An injected fault (tests) is spent on an attempt that sends data, not on one the receiver refused.
            fault = faults.take(flow_class) if faults is not None else None
            if control is not None:  # a rate update may have arrived since the command
                rate_bytes_per_s = control.rate_bytes_per_s
            pacer = edge.pacer(host, port, flow_class, rate_bytes_per_s)
            if control is not None:
                control.flow_class, control.dest, control.pacer = flow_class, (host, port), pacer
            sent = 0
            with jobkit.open_regular(ckpt_path) as fh:  # never through a symlink a job planted (design §19)
                fh.seek(offset)
                pos = offset
                while pos < size:
                    chunk = fh.read(CHUNK_BYTES)
                    if not chunk:
                        break
                    if fault == "truncate" and pos - offset >= (size - offset) // 2:
                        raise ConnectionResetError("injected truncation")
                    if fault == "corrupt" and sent == 0:
                        chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                    await pacer.consume(len(chunk))
                    writer.write(chunk)
                    await writer.drain()
                    pos += len(chunk)
                    sent += len(chunk)
                    TRANSFER_TALLY.add(flow_class, len(chunk))  # per-class bytes (design §4, nodeagent/classbytes)
            result.bytes_sent += sent
            verdict = await asyncio.wait_for(_read_json_line(reader), 30.0)
            if verdict.get("ok") and verdict.get("done"):
                result.ok = True
                break
            raise ValueError(str(verdict.get("error")))
        except PermissionError as exc:  # refused (token, kill-switch): retrying will not help
            result.errors.append(f"attempt {attempt}: refused: {exc}")
            break
        except (TimeoutError, OSError, ValueError, ConnectionError) as exc:
            result.errors.append(f"attempt {attempt}: {exc}")
            log.info("transfer %s attempt %d failed: %s", transfer_id, attempt, exc)
            await asyncio.sleep(backoff_s * (2 ** (attempt - 1)) * (0.5 + random.random()))
        finally:
            if control is not None:
                control.dest = control.pacer = None
            edge.flow_done(host, port)
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
    result.elapsed_s = time.monotonic() - started
    return result
