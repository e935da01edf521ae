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
  the same way. A checkpoint exists iff its manifest exists.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

EXIT_CHECKPOINTED = 75  # the job stopped after a final checkpoint (it will resume elsewhere)
MANIFEST_SUFFIX = ".json"
DATA_SUFFIX = ".ckpt"


def ckpt_stem(sequence: int) -> str:
    """File stem of checkpoint ``sequence`` (zero-padded so names sort by sequence)."""
    return f"ckpt-{sequence:08d}"


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hex sha256 of a file's contents."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
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


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: temp file in the same directory, fsync, rename, fsync dir."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
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

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_path(cls, path: Path) -> Manifest:
        """Read a manifest; ValueError unless it names its own data file (``ckpt-<seq>.ckpt`` beside it).

        The file name is never taken on trust: a manifest written by a job or received from another agent
        could otherwise point the agent at ``../../anything`` when it verifies, sends or deletes a checkpoint.
        """
        raw = json.loads(path.read_text())
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


def _serialize(state: Mapping[str, Any]) -> tuple[bytes, str]:
    """Bytes of ``state`` and the format name (torch.save when torch tensors are present, else numpy)."""
    import io

    buf = io.BytesIO()
    if _is_torch_state(state):
        import torch

        torch.save({k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in state.items()}, buf)
        return buf.getvalue(), "torch"
    np.savez(buf, **{k: np.asarray(v) for k, v in state.items()})
    return buf.getvalue(), "numpy"


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
        """Write checkpoint ``step`` atomically and its manifest; prune old ones.

        1. Serialise the state; write data to a temp file, fsync, rename to ``ckpt-<seq>.ckpt``.
        2. Write the manifest (sha256, size, step, compat) the same way; its presence publishes the checkpoint.
        3. Remove checkpoints older than ``keep_last``.
        """
        taken_at = time.time()
        data, fmt = _serialize(state)
        sequence = self._next_sequence
        stem = ckpt_stem(sequence)
        atomic_write_bytes(self.ckpt_dir / f"{stem}{DATA_SUFFIX}", data)
        manifest = Manifest(
            job_id=self.job_id,
            sequence=sequence,
            step=int(step),
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            file=f"{stem}{DATA_SUFFIX}",
            format=fmt,
            taken_at=taken_at,
            compat=compat_record(),
            final=final,
        )
        atomic_write_bytes(self.ckpt_dir / f"{stem}{MANIFEST_SUFFIX}", manifest.to_json().encode())
        self._next_sequence = sequence + 1
        self._last_ckpt_at = self._clock()
        self._requested = False
        self._prune()
        return manifest

    def _prune(self) -> None:
        manifests = list_manifests(self.ckpt_dir)
        for old in manifests[: max(0, len(manifests) - self.keep_last)]:
            remove_checkpoint(self.ckpt_dir, old.sequence)

    def maybe_checkpoint(self, step: int, get_state: Callable[[], Mapping[str, Any]]) -> bool:
        """Checkpoint if due; return True if that was a final checkpoint (the caller should exit now)."""
        if not self.due():
            return False
        final = self._final_requested
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
        raise SystemExit(EXIT_CHECKPOINTED)
