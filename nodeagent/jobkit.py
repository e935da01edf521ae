"""Job helper library for training scripts run by a ReclaimNet agent (design §1, §2). No Django, no agent imports.

A training script uses it like this::

    from nodeagent import jobkit
    ck = jobkit.Checkpointer.from_env()
    restored = ck.restore()                     # (step, state) of the newest verified checkpoint, or None
    step, state = restored if restored else (0, init_state())
    while step < total:
        state = train_one_step(state, step); step += 1
        ck.report_progress(step)
        if ck.maybe_checkpoint(step, lambda: state):   # True: a final checkpoint was written, exit now
            ck.exit_checkpointed()

What it does:
- restores the newest checkpoint whose sha256 matches its manifest (a corrupt file is never resumed from);
  the agent can pin the checkpoint to restore with ``RECLAIMNET_RESTORE_SEQ``;
- checkpoints when the agent asks (``SIGUSR1``: checkpoint and continue; ``SIGUSR2``: final checkpoint, then
  exit with :data:`EXIT_CHECKPOINTED`) and at the interval P1 sets (``RECLAIMNET_CKPT_INTERVAL_S``, updated
  live through the control file the agent rewrites);
- saves with ``torch.save`` when torch is installed and the state holds tensors, else ``numpy.savez``;
- writes atomically: temp file, fsync, rename; then the manifest (sha256, size, step, compatibility record)
  the same way. A checkpoint exists iff its manifest exists;
- with ``async_snapshot=True`` (design §2 "Asynchronous snapshots", §17.6) a periodic checkpoint stalls the loop
  only while the state is copied to host memory (:func:`snapshot_state`); serialising, writing, fsync and sha256
  run in one background thread while training continues. At most one write is in flight: a checkpoint that
  falls due while the previous write still runs is deferred (not waited for) until that write ends, so the
  effective interval is never shorter than the write. A final checkpoint (``SIGUSR2``) is always synchronous
  and first waits for the write in flight. The manifest records ``mode`` (``"sync"``/``"async"``), ``stall_s``
  (the loop's pause) and ``write_s`` (serialise + write + hash), which the agent reports to the portal.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import json
import os
import re
import signal
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

EXIT_CHECKPOINTED = 75  # the job stopped after a final checkpoint (it will resume elsewhere)
MANIFEST_SUFFIX = ".json"
DATA_SUFFIX = ".ckpt"
MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few hundred bytes; a bigger file is not one


def ckpt_stem(sequence: int) -> str:
    """File stem of checkpoint ``sequence`` (zero-padded so names sort by sequence)."""
    return f"ckpt-{sequence:08d}"


def open_regular(path: Path) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file reached without following a final symlink, and
    without blocking on a FIFO (design §19: a root agent reads files inside directories a confined job owns)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_small(path: Path, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of a regular file (:func:`open_regular`); longer files raise ValueError."""
    with open_regular(path) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path.name}: over {max_bytes} bytes")
    return data


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's contents."""
    digest = hashlib.sha256()
    with open_regular(path) as fh:
        while chunk := fh.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_exclusive(tmp: Path, mode: int | None) -> BinaryIO:
    """A new file at ``tmp``: never one that exists, never through a symlink (a stale temp file is replaced)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o666)
    except FileExistsError:
        tmp.unlink()
        fd = os.open(tmp, flags, 0o666)
    if mode is not None:
        os.fchmod(fd, mode)
    return os.fdopen(fd, "wb")


def atomic_write_bytes(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same directory, fsync, rename, fsync dir.

    ``mode``: the file's permissions regardless of the umask (None: 0666 less the umask)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with _create_exclusive(tmp, mode) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # disk full, interrupted: leave no half-written temp file behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint is and what it was taken against (design §1: checkpoint-compatible destinations)."""

    job_id: str
    sequence: int
    step: int
    size_bytes: int
    sha256: str
    file: str
    format: str  # "numpy" | "torch"
    taken_at: float  # unix time the state was captured
    compat: dict[str, str] = field(default_factory=dict)
    final: bool = False
    # design §2 "Asynchronous snapshots": optional, absent from older manifests (read as a synchronous checkpoint
    # whose pause was not measured)
    mode: str = "sync"  # "sync" | "async"
    stall_s: float | None = None  # seconds the training loop was paused by this checkpoint
    write_s: float | None = None  # seconds to serialise, write, fsync and hash it (in the background if async)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_path(cls, path: Path) -> Manifest:
        """Read a manifest; ValueError unless it names its own data file (``ckpt-<seq>.ckpt`` beside it).

        The file name is never taken on trust: a manifest written by a job or received from another agent
        could otherwise point the agent at ``../../anything`` when it verifies, sends or deletes a checkpoint.
        """
        raw = json.loads(read_small(path, MAX_MANIFEST_BYTES))
        if not isinstance(raw, dict):
            raise ValueError("manifest is not an object")
        manifest = cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})
        seq, size = manifest.sequence, manifest.size_bytes
        if not (isinstance(seq, int) and isinstance(size, int) and seq >= 0 and size >= 0):
            raise ValueError("manifest sequence/size_bytes must be non-negative integers")
        stem = ckpt_stem(seq)
        if manifest.file != f"{stem}{DATA_SUFFIX}" or path.name != f"{stem}{MANIFEST_SUFFIX}":
            raise ValueError(f"manifest {path.name} names another file: {str(manifest.file)[:40]!r}")
        return manifest


def list_manifests(ckpt_dir: Path) -> list[Manifest]:
    """Manifests in ``ckpt_dir``, oldest sequence first; unreadable ones are skipped."""
    out: list[Manifest] = []
    if not ckpt_dir.is_dir():
        return out
    for path in sorted(ckpt_dir.glob(f"ckpt-*{MANIFEST_SUFFIX}")):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            out.append(Manifest.from_path(path))
    return sorted(out, key=lambda m: m.sequence)


# The temporary :func:`atomic_write_bytes` makes for a checkpoint's data or manifest: ``.<final name>.tmp-<pid>``.
ORPHAN_TEMPORARY = re.compile(r"^\.ckpt-\d{8,}\.(?:ckpt|json)\.tmp-([1-9]\d{0,9})$")


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie, or another user's process, counts: its temporary is kept)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def remove_orphan_temporaries(ckpt_dir: Path | str, dir_fd: int | None = None) -> list[str]:
    """Remove the checkpoint temporaries in ``ckpt_dir`` whose writer process is gone (design §2, §19.5).

    A writer killed between creating ``.ckpt-<seq>.ckpt.tmp-<pid>`` and renaming it leaves it forever. Only names
    matching :data:`ORPHAN_TEMPORARY` exactly, only regular files (a symlink or FIFO of that name is left alone,
    never followed), only when process ``<pid>`` no longer exists (a live writer's temporary is in use). The
    directory is opened with ``O_NOFOLLOW | O_DIRECTORY`` (relative to ``dir_fd`` when given) and every entry is
    examined and unlinked relative to that descriptor: a job that owns the directory cannot redirect the agent
    elsewhere. Returns the names removed; a directory that cannot be opened yields none."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(ckpt_dir, flags, dir_fd=dir_fd)
    except OSError:
        return []
    removed: list[str] = []
    try:
        for name in os.listdir(fd):
            match = ORPHAN_TEMPORARY.match(name)
            if match is None or _pid_alive(int(match.group(1))):
                continue
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=fd)  # unlink never follows a link, even if one was swapped in meanwhile
                    removed.append(name)
    except OSError:
        pass
    finally:
        os.close(fd)
    return removed


def remove_orphan_temporaries_under(root: Path) -> dict[str, list[str]]:
    """:func:`remove_orphan_temporaries` in every job directory of ``root`` (``<data>/ckpt``), none reached
    through a symlink; returns the names removed by job directory."""
    out: dict[str, list[str]] = {}
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return out
    try:
        for name in sorted(os.listdir(fd)):
            removed = remove_orphan_temporaries(name, dir_fd=fd)
            if removed:
                out[name] = removed
    except OSError:
        pass
    finally:
        os.close(fd)
    return out


def remove_checkpoint(ckpt_dir: Path, sequence: int) -> None:
    """Delete checkpoint ``sequence``: manifest first, so there is never a manifest without its data."""
    for suffix in (MANIFEST_SUFFIX, DATA_SUFFIX):
        with contextlib.suppress(OSError):
            (ckpt_dir / f"{ckpt_stem(sequence)}{suffix}").unlink()


def verify(ckpt_dir: Path, manifest: Manifest) -> bool:
    """Whether the data file exists with the manifest's size and sha256."""
    path = ckpt_dir / manifest.file
    try:
        if path.is_symlink():  # a checkpoint is a regular file the job wrote, never a link to elsewhere
            return False
        return path.stat().st_size == manifest.size_bytes and sha256_file(path) == manifest.sha256
    except OSError:
        return False


def compat_record() -> dict[str, str]:
    """The compatibility record of this process: GPU model/capability/driver (from the agent's environment),
    framework and versions."""
    raw = os.environ.get("RECLAIMNET_COMPAT", "")
    rec: dict[str, str] = {}
    if raw:
        with contextlib.suppress(ValueError):
            rec.update({str(k): str(v) for k, v in json.loads(raw).items()})
    rec.setdefault("numpy_version", np.__version__)
    try:
        import torch

        rec.setdefault("framework", "torch")
        rec.setdefault("framework_version", torch.__version__)
    except ImportError:
        rec.setdefault("framework", "numpy")
        rec.setdefault("framework_version", np.__version__)
    return rec


def _is_torch_state(state: Mapping[str, Any]) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return any(isinstance(v, torch.Tensor) or hasattr(v, "state_dict") for v in state.values())


def _serialize(state: Mapping[str, Any], fmt: str | None = None) -> tuple[bytes, str]:
    """Bytes of ``state`` and the format name (torch.save when torch tensors are present, else numpy; ``fmt``
    given: that format, as decided on the live state before it was snapshotted)."""
    import io

    buf = io.BytesIO()
    if fmt == "torch" or (fmt is None and _is_torch_state(state)):
        import torch

        torch.save({k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in state.items()}, buf)
        return buf.getvalue(), "torch"
    np.savez(buf, **{k: np.asarray(v) for k, v in state.items()})
    return buf.getvalue(), "numpy"


def snapshot_state(value: Any) -> Any:
    """A deep copy of ``value`` in host memory that later training steps cannot change (design §17.6).

    Objects with ``state_dict()`` are replaced by a copy of their state dict; torch tensors are copied with
    ``detach().to("cpu", copy=True)`` (a GPU tensor comes to host memory, a CPU tensor is cloned); numpy arrays
    with ``copy()``; dicts, lists and tuples are copied element by element; anything else with
    :func:`copy.deepcopy`. This copy is the whole stall of an asynchronous checkpoint.
    """
    if hasattr(value, "state_dict") and callable(value.state_dict):
        return snapshot_state(value.state_dict())
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        items = [(k, snapshot_state(v)) for k, v in value.items()]
        if type(value) is not dict:
            with contextlib.suppress(TypeError):  # OrderedDict keeps its type; a defaultdict becomes a dict
                return type(value)(items)
        return dict(items)
    if isinstance(value, list):
        return [snapshot_state(v) for v in value]
    if isinstance(value, tuple):
        items = [snapshot_state(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, str | bytes | int | float | bool | type(None)):
        return value
    torch = _torch_if_loaded()
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    return copy.deepcopy(value)


def _torch_if_loaded() -> Any:
    """torch if the job imported it (a numpy job never pays for importing it), else None."""
    import sys

    return sys.modules.get("torch")


def _deserialize(path: Path, fmt: str) -> dict[str, Any]:
    if fmt == "torch":
        import torch

        return dict(torch.load(path, map_location="cpu", weights_only=False))
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k].copy() for k in data.files}


class Checkpointer:
    """Checkpoint/restore for one job in ``ckpt_dir`` (design §2: interval Δ from P1, final checkpoint on notice).

    Concurrency: signal handlers only set flags; the training loop acts on them at a step boundary, so a
    checkpoint is always a consistent state.
    """

    def __init__(
        self,
        ckpt_dir: Path,
        job_id: str = "local",
        interval_s: float | None = None,
        next_sequence: int = 1,
        restore_sequence: int | None = None,
        control_file: Path | None = None,
        progress_file: Path | None = None,
        keep_last: int = 3,
        install_signals: bool = True,
        clock: Callable[[], float] = time.monotonic,
        async_snapshot: bool = False,
    ) -> None:
        self.ckpt_dir = Path(ckpt_dir)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.job_id = job_id
        self.interval_s = interval_s
        self.restore_sequence = restore_sequence
        self.control_file = control_file
        self.progress_file = progress_file
        self.keep_last = keep_last
        self._clock = clock
        existing = [m.sequence for m in list_manifests(self.ckpt_dir)]
        self._next_sequence = max([next_sequence, *(s + 1 for s in existing)])
        self._last_ckpt_at = clock()
        self._requested = False
        self._final_requested = False
        self._control_mtime_ns = 0
        self._last_progress_at = 0.0
        self.async_snapshot = async_snapshot  # design §2: periodic checkpoints stall only for the host copy
        self._writer: threading.Thread | None = None  # the background write in flight (at most one)
        self._writer_error: BaseException | None = None
        self.last_manifest: Manifest | None = None  # the newest checkpoint this process published
        self.deferred = 0  # checkpoints put off because the previous background write was still running
        if install_signals:
            signal.signal(signal.SIGUSR1, self._on_checkpoint_signal)
            signal.signal(signal.SIGUSR2, self._on_final_signal)

    @classmethod
    def from_env(cls, default_dir: str = "checkpoints", **kwargs: Any) -> Checkpointer:
        """Build from the agent's environment (RECLAIMNET_*); outside an agent, checkpoints go to ``default_dir``."""
        env = os.environ
        interval = env.get("RECLAIMNET_CKPT_INTERVAL_S")
        restore = env.get("RECLAIMNET_RESTORE_SEQ")
        control = env.get("RECLAIMNET_CONTROL_FILE")
        progress = env.get("RECLAIMNET_PROGRESS_FILE")
        return cls(
            Path(env.get("RECLAIMNET_CKPT_DIR", default_dir)),
            job_id=env.get("RECLAIMNET_JOB_ID", "local"),
            interval_s=float(interval) if interval else None,
            next_sequence=int(env.get("RECLAIMNET_CKPT_NEXT_SEQ", "1")),
            restore_sequence=int(restore) if restore else None,
            control_file=Path(control) if control else None,
            progress_file=Path(progress) if progress else None,
            **kwargs,
        )

    # --- signals (flags only) -------------------------------------------------------------------------------
    def _on_checkpoint_signal(self, signum: int, frame: object) -> None:
        self._requested = True

    def _on_final_signal(self, signum: int, frame: object) -> None:
        self._requested = True
        self._final_requested = True

    def request(self, final: bool = False) -> None:
        """Ask for a checkpoint at the next step boundary (what the signals do)."""
        self._requested = True
        self._final_requested = self._final_requested or final

    # --- restore --------------------------------------------------------------------------------------------
    def restore(self) -> tuple[int, dict[str, Any]] | None:
        """The (step, state) of the checkpoint to resume from, or None to start fresh.

        With ``restore_sequence`` pinned, only that checkpoint (if it verifies); otherwise the newest verified.
        Checkpoints that fail verification are skipped, never loaded.
        """
        manifests = list_manifests(self.ckpt_dir)
        if self.restore_sequence is not None:
            manifests = [m for m in manifests if m.sequence == self.restore_sequence]
        for manifest in reversed(manifests):
            if verify(self.ckpt_dir, manifest):
                return manifest.step, _deserialize(self.ckpt_dir / manifest.file, manifest.format)
        return None

    # --- checkpoint -----------------------------------------------------------------------------------------
    def _refresh_interval(self) -> None:
        """Pick up a new P1 interval the agent wrote into the control file (cheap: one stat per call)."""
        if self.control_file is None:
            return
        try:
            mtime = self.control_file.stat().st_mtime_ns
            if mtime == self._control_mtime_ns:
                return
            self._control_mtime_ns = mtime
            interval = json.loads(self.control_file.read_text()).get("interval_s")
            if interval:
                self.interval_s = float(interval)
        except (OSError, ValueError):
            return

    def due(self) -> bool:
        """Whether a checkpoint should be taken now (requested, or the P1 interval has elapsed)."""
        self._refresh_interval()
        if self._requested:
            return True
        return self.interval_s is not None and self._clock() - self._last_ckpt_at >= self.interval_s

    @property
    def final_requested(self) -> bool:
        return self._final_requested

    def checkpoint(self, step: int, state: Mapping[str, Any], final: bool = False) -> Manifest:
        """Write checkpoint ``step`` atomically and its manifest; prune old ones (synchronous: the loop waits).

        0. Wait for a background write still in flight (its checkpoint comes first).
        1. Serialise the state; write data to a temp file, fsync, rename to ``ckpt-<seq>.ckpt``.
        2. Write the manifest (sha256, size, step, compat) the same way; its presence publishes the checkpoint.
        3. Remove checkpoints older than ``keep_last``.
        """
        paused_at = time.perf_counter()
        self.wait()
        taken_at = time.time()
        sequence = self._next_sequence
        manifest = self._write(sequence, int(step), state, None, final, taken_at, mode="sync", stall_s=None,
                               started=time.perf_counter(), paused_at=paused_at)
        self._next_sequence = sequence + 1
        self._last_ckpt_at = self._clock()
        self._requested = False
        return manifest

    def checkpoint_async(self, step: int, state: Mapping[str, Any]) -> bool:
        """Snapshot ``state`` now and write it in the background (design §2 "Asynchronous snapshots").

        The loop pauses only for :func:`snapshot_state` (the stall); a background thread then serialises, writes
        atomically, hashes, publishes the manifest and prunes, exactly as :meth:`checkpoint`. If the previous
        background write is still running nothing is taken and False is returned: the checkpoint stays due
        and is taken at the first step boundary after that write ended (deferred, not waited for: the loop never
        blocks on the disk, and the effective interval is at least the write time). Raises the error of a
        failed earlier background write."""
        self._raise_writer_error()
        if self._writer is not None and self._writer.is_alive():
            self.deferred += 1
            return False
        self._writer = None
        started = time.perf_counter()
        taken_at = time.time()
        fmt = "torch" if _is_torch_state(state) else "numpy"
        copied = snapshot_state(dict(state))
        stall_s = time.perf_counter() - started
        sequence = self._next_sequence
        self._next_sequence = sequence + 1
        self._last_ckpt_at = self._clock()
        self._requested = False

        def run() -> None:
            try:
                self._write(sequence, int(step), copied, fmt, False, taken_at, mode="async", stall_s=stall_s,
                            started=time.perf_counter())
            except BaseException as exc:  # kept for the loop: the next checkpoint call raises it
                self._writer_error = exc

        self._writer = threading.Thread(target=run, name=f"jobkit-ckpt-{sequence}", daemon=False)
        self._writer.start()
        return True

    def writing(self) -> bool:
        """Whether a background write is in flight."""
        return self._writer is not None and self._writer.is_alive()

    def wait(self) -> None:
        """Block until the background write in flight (if any) has published its checkpoint; raise its error."""
        writer = self._writer
        if writer is not None:
            writer.join()
            self._writer = None
        self._raise_writer_error()

    def _raise_writer_error(self) -> None:
        if self._writer_error is not None:
            exc, self._writer_error = self._writer_error, None
            raise RuntimeError(f"background checkpoint write failed: {exc!r}") from exc

    def _write(self, sequence: int, step: int, state: Mapping[str, Any], fmt: str | None, final: bool,
               taken_at: float, *, mode: str, stall_s: float | None, started: float,
               paused_at: float | None = None) -> Manifest:
        """Serialise, write data then manifest atomically, prune: the body of both checkpoint kinds. A synchronous
        one (``stall_s`` None) stalled the loop from ``paused_at`` (including the wait for a write in flight)."""
        data, fmt = _serialize(state, fmt)
        stem = ckpt_stem(sequence)
        atomic_write_bytes(self.ckpt_dir / f"{stem}{DATA_SUFFIX}", data)
        digest = hashlib.sha256(data).hexdigest()
        write_s = time.perf_counter() - started
        manifest = Manifest(
            job_id=self.job_id,
            sequence=sequence,
            step=step,
            size_bytes=len(data),
            sha256=digest,
            file=f"{stem}{DATA_SUFFIX}",
            format=fmt,
            taken_at=taken_at,
            compat=compat_record(),
            final=final,
            mode=mode,
            stall_s=(time.perf_counter() - (paused_at or started)) if stall_s is None else stall_s,
            write_s=write_s,
        )
        atomic_write_bytes(self.ckpt_dir / f"{stem}{MANIFEST_SUFFIX}", manifest.to_json().encode())
        self.last_manifest = manifest
        self._prune()
        return manifest

    def _prune(self) -> None:
        manifests = list_manifests(self.ckpt_dir)
        for old in manifests[: max(0, len(manifests) - self.keep_last)]:
            remove_checkpoint(self.ckpt_dir, old.sequence)

    def maybe_checkpoint(self, step: int, get_state: Callable[[], Mapping[str, Any]],
                         asynchronous: bool | None = None) -> bool:
        """Checkpoint if due; return True if that was a final checkpoint (the caller should exit now).

        A final checkpoint is synchronous (after the write in flight); others are asynchronous snapshots when
        ``asynchronous`` (default: the checkpointer's ``async_snapshot``) is set — possibly deferred, see
        :meth:`checkpoint_async` — else synchronous."""
        if not self.due():
            return False
        final = self._final_requested
        if (self.async_snapshot if asynchronous is None else asynchronous) and not final:
            if not self.writing():  # deferred while a write is in flight: get_state() is not even called
                self.checkpoint_async(step, get_state())
            else:
                self.deferred += 1
            return False
        self.checkpoint(step, get_state(), final=final)
        return final

    def report_progress(self, step: int, min_period_s: float = 0.2) -> None:
        """Tell the agent how far the job is (atomic file write, at most every ``min_period_s``)."""
        now = self._clock()
        if self.progress_file is None or now - self._last_progress_at < min_period_s:
            return
        self._last_progress_at = now
        with contextlib.suppress(OSError):
            atomic_write_bytes(self.progress_file, json.dumps({"step": int(step), "t": time.time()}).encode())

    def report_gpu_load(self, pct: float) -> None:
        """Tell an agent whose GPUs are simulated how hard this job is using them, in percent (design §15: what
        its idle watchdog reads there; on real GPUs NVML measures it and this is ignored)."""
        path = os.environ.get("RECLAIMNET_GPU_LOAD_FILE")
        if path:
            with contextlib.suppress(OSError):
                atomic_write_bytes(Path(path), json.dumps({"pct": float(pct)}).encode())

    def exit_checkpointed(self) -> None:
        """Exit with :data:`EXIT_CHECKPOINTED` (after a final checkpoint)."""
        self.wait()
        raise SystemExit(EXIT_CHECKPOINTED)
