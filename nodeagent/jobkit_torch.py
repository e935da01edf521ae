"""PyTorch and Hugging Face jobs on top of :mod:`nodeagent.jobkit` (design §17). No Django, no agent imports.

torch and transformers are imported lazily: this module imports (and ``nodeagent.jobkit`` works) without them.
Everything goes through jobkit's :class:`~nodeagent.jobkit.Checkpointer`, so a checkpoint is the usual one file
``ckpt-<seq>.ckpt`` (torch.save) plus its manifest (sha256, step, compat): the agent verifies, transfers and
restores it as any other.

A PyTorch loop::

    ck = jobkit.Checkpointer.from_env()
    sampler = ResumableSampler(len(dataset), seed=seed)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, generator=torch.Generator().manual_seed(seed))
    ts = TrainingState(model, optimizer, scheduler, scaler, sampler)
    step = ts.restore(ck)                         # 0, or the step of the newest verified checkpoint
    for epoch in range(sampler.epoch, epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:                       # a restored run starts at the batch after the checkpoint
            ...; step += 1
            sampler.advance(len(x))               # the loader's position: samples consumed this epoch
            if ts.maybe_checkpoint(ck, step):     # True: final checkpoint written (SIGUSR2), exit now
                ck.exit_checkpointed()

A Hugging Face ``Trainer``: ``ReclaimNetCallback(ck)`` in ``callbacks``, then
``trainer.train(resume_from_checkpoint=callback.restore_dir(output_dir))`` (see :class:`ReclaimNetCallback`).
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from nodeagent import jobkit

STATE_KEY = "training"  # the one top-level key a TrainingState checkpoint holds
HF_STATE_KEY = "hf_trainer_checkpoint"  # ... and a Trainer checkpoint (its directory, file by file)
HF_RESTORE_DIRNAME = "reclaimnet-restore"


# --- determinism and RNG ------------------------------------------------------------------------------------------
def seed_everything(seed: int) -> None:
    """Seed Python ``random``, numpy's global generator, torch (CPU and every CUDA device)."""
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # seeds CUDA devices too


def make_deterministic(threads: int = 1) -> None:
    """Deterministic kernels and a fixed thread count: the same inputs give the same bits, run after run."""
    import os

    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by deterministic cuBLAS
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    if torch.backends.cudnn.is_available():
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True


def capture_rng_state() -> dict[str, Any]:
    """The state of every global generator a training step may draw from: Python ``random``, numpy's legacy
    global generator, torch CPU and, when CUDA is available, every CUDA device."""
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put back what :func:`capture_rng_state` captured (CUDA only where it was captured and is available)."""
    import torch

    random.setstate(_as_python_random_state(state["python"]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])


def _as_python_random_state(raw: Any) -> tuple[Any, ...]:
    """random.setstate wants tuples all the way down (a round trip may have turned the inner one into a list)."""
    version, internal, gauss = raw
    return (version, tuple(internal), gauss)


# --- the data loader's position -----------------------------------------------------------------------------------
class ResumableSampler:
    """A shuffling sampler whose position can be checkpointed: epoch ``e`` visits a permutation drawn from a
    generator seeded by ``(seed, e)`` (never the global RNG), starting after the samples already consumed.

    The training loop calls :meth:`advance` with the number of samples it has finished (not when the loader
    fetched them: with worker processes the loader reads ahead), so the saved position is exactly the next
    batch to train on, whatever ``num_workers`` is. Give the DataLoader its own ``generator``: each new iterator
    draws a seed from it, else from the global torch RNG, which a resumed run (one iterator more, mid-epoch)
    would then leave in another state than the uninterrupted run.
    """

    def __init__(self, num_samples: int, seed: int = 0, shuffle: bool = True) -> None:
        if num_samples <= 0:
            raise ValueError("num_samples must be positive")
        self.num_samples = int(num_samples)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.epoch = 0
        self.consumed = 0  # samples of this epoch already trained on

    def permutation(self, epoch: int) -> list[int]:
        """The order of epoch ``epoch``."""
        if not self.shuffle:
            return list(range(self.num_samples))
        import torch

        gen = torch.Generator()
        gen.manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=gen).tolist()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``; the same epoch again (a restored run) keeps its position."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self.consumed = 0

    def advance(self, num_samples: int) -> None:
        """``num_samples`` more samples of this epoch have been trained on."""
        self.consumed = min(self.num_samples, self.consumed + int(num_samples))

    def __iter__(self) -> Iterator[int]:
        return iter(self.permutation(self.epoch)[self.consumed:])

    def __len__(self) -> int:
        return self.num_samples - self.consumed

    def state_dict(self) -> dict[str, int | bool]:
        return {"epoch": self.epoch, "consumed": self.consumed, "seed": self.seed,
                "num_samples": self.num_samples, "shuffle": self.shuffle}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state["num_samples"]) != self.num_samples or int(state["seed"]) != self.seed:
            raise ValueError("checkpoint was taken with another data set size or sampler seed")
        self.epoch = int(state["epoch"])
        self.consumed = int(state["consumed"])
        self.shuffle = bool(state["shuffle"])


# --- a whole PyTorch training loop --------------------------------------------------------------------------------
class TrainingState:
    """Everything a PyTorch loop needs to continue bit for bit (design §17): model, optimizer, LR scheduler, AMP
    grad scaler, the data loader's position (a :class:`ResumableSampler` or anything with ``state_dict``), RNG
    states and small ``extra`` values (a dict the loop owns: best loss, counters...).

    Any component may be None. A disabled GradScaler still round-trips (its state is then empty).

    ``async_snapshot`` (default True, design §17.6): a periodic checkpoint pauses the loop only while every
    tensor is copied to host memory (``detach().to("cpu", copy=True)``); torch.save, the write and the sha256
    run in the background while training continues. The final checkpoint on notice stays synchronous. Pass
    False for the synchronous checkpoint of design §2 (e.g. when host memory cannot hold a second copy).
    """

    def __init__(self, model: Any, optimizer: Any = None, scheduler: Any = None, scaler: Any = None,
                 sampler: Any = None, extra: dict[str, Any] | None = None, async_snapshot: bool = True) -> None:
        self.async_snapshot = async_snapshot
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.sampler = sampler
        self.extra: dict[str, Any] = extra if extra is not None else {}

    def _components(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler,
                "scaler": self.scaler, "sampler": self.sampler}

    def state_dict(self) -> dict[str, Any]:
        """One picklable dict: each component's state_dict, ``rng`` and ``extra``."""
        state: dict[str, Any] = {name: part.state_dict() for name, part in self._components().items() if part is not None}
        state["rng"] = capture_rng_state()
        state["extra"] = dict(self.extra)
        state["format_version"] = 1
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore every component present here and in ``state``; a component here but missing there is an
        error (resuming without, say, the optimizer would silently change the run)."""
        for name, part in self._components().items():
            if part is None:
                continue
            if name not in state:
                raise KeyError(f"checkpoint has no {name!r} state")
            part.load_state_dict(state[name])
        self.extra.clear()
        self.extra.update(state.get("extra", {}))
        restore_rng_state(state["rng"])  # last: loading the others must not draw from the restored generators

    def restore(self, ck: jobkit.Checkpointer) -> int:
        """Load the newest verified checkpoint of ``ck`` (or the one the agent pinned); its step, 0 if none."""
        restored = ck.restore()
        if restored is None:
            return 0
        step, state = restored
        if STATE_KEY not in state:
            raise ValueError(f"checkpoint holds no {STATE_KEY!r} (written by another kind of job?)")
        self.load_state_dict(state[STATE_KEY])
        return step

    def checkpoint(self, ck: jobkit.Checkpointer, step: int, final: bool = False) -> jobkit.Manifest:
        """Write a checkpoint now (jobkit's atomic write + manifest, torch.save format)."""
        return ck.checkpoint(step, {STATE_KEY: self}, final=final)

    def maybe_checkpoint(self, ck: jobkit.Checkpointer, step: int) -> bool:
        """Checkpoint if the agent asked or the interval elapsed; True if it was the final one (exit now).
        Asynchronous snapshot unless ``async_snapshot`` is False or it is the final one (synchronous)."""
        return ck.maybe_checkpoint(step, lambda: {STATE_KEY: self}, asynchronous=self.async_snapshot)


# --- Hugging Face Trainer -----------------------------------------------------------------------------------------
class _FilesState:
    """A directory's files as one state_dict value (so jobkit saves it with torch.save, in one checkpoint file)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def state_dict(self) -> dict[str, Any]:
        return {"files": self.files, "format_version": 1}


def pack_dir(path: Path) -> dict[str, bytes]:
    """Every regular file under ``path``, by relative POSIX path."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def unpack_dir(files: Mapping[str, bytes], dest: Path) -> None:
    """Write ``files`` (from :func:`pack_dir`) under ``dest``; a name that would leave ``dest`` is refused."""
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    for rel, data in files.items():
        target = (dest / rel).resolve()
        if root not in target.parents:
            raise ValueError(f"checkpoint file name leaves the restore directory: {rel[:80]!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


class _ReclaimNetCallbackLogic:
    """A ``transformers.TrainerCallback`` that checkpoints a ``Trainer`` when the agent asks and at P1's interval,
    through jobkit (design §17). Import it as ``ReclaimNetCallback`` (built on first use, so importing this module
    never imports transformers).

    - At a step end where ``ck.due()`` (SIGUSR1, SIGUSR2 or the interval) it asks the Trainer to save. The
      Trainer's own checkpoint directory (model or PEFT adapter via ``save_pretrained``, optimizer, scheduler,
      grad scaler, ``trainer_state.json``, RNG states of every device) is then packed, file by file, into one
      jobkit checkpoint, and the directory is removed.
    - After a final checkpoint (SIGUSR2) it exits with ``EXIT_CHECKPOINTED``.
    - :meth:`restore_dir` unpacks the newest verified checkpoint into ``<output_dir>/reclaimnet-restore`` and
      returns it for ``trainer.train(resume_from_checkpoint=...)``: the Trainer reloads everything, skips the
      batches it already trained on and puts back the RNG states, so the run continues as if uninterrupted.
    """

    def __init__(self, ck: jobkit.Checkpointer, exit_on_final: bool = True) -> None:
        self.ck = ck
        self.exit_on_final = exit_on_final
        self._pending = False
        self._pending_final = False
        self.final_written = False
        self.last_manifest: jobkit.Manifest | None = None

    def restore_dir(self, output_dir: str | Path) -> str | None:
        """The directory to resume from (unpacked from the newest verified checkpoint), or None to start fresh."""
        restored = self.ck.restore()
        if restored is None:
            return None
        _, state = restored
        if HF_STATE_KEY not in state:
            raise ValueError(f"checkpoint holds no {HF_STATE_KEY!r} (written by another kind of job?)")
        dest = Path(output_dir) / HF_RESTORE_DIRNAME
        shutil.rmtree(dest, ignore_errors=True)
        unpack_dir(state[HF_STATE_KEY]["files"], dest)
        return str(dest)

    # TrainerCallback hooks ------------------------------------------------------------------------------------
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.ck.report_progress(state.global_step)
        if self.ck.due():
            self._pending = True
            self._pending_final = self.ck.final_requested
            control.should_save = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if not self._pending:
            return control  # a save the user's own save_strategy asked for: left to the Trainer
        ckpt_dir = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        final = self._pending_final
        self.last_manifest = self.ck.checkpoint(state.global_step, {HF_STATE_KEY: _FilesState(pack_dir(ckpt_dir))},
                                                final=final)
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        self._pending = self._pending_final = False
        if final:
            self.final_written = True
            control.should_training_stop = True
            if self.exit_on_final:
                self.ck.exit_checkpointed()
        return control


_CALLBACK_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    """``ReclaimNetCallback``: a real ``TrainerCallback`` subclass, built when first asked for (needs transformers)."""
    global _CALLBACK_CLASS
    if name != "ReclaimNetCallback":
        raise AttributeError(name)
    if _CALLBACK_CLASS is None:
        from transformers import TrainerCallback

        _CALLBACK_CLASS = type("ReclaimNetCallback", (_ReclaimNetCallbackLogic, TrainerCallback),
                               {"__module__": __name__, "__doc__": _ReclaimNetCallbackLogic.__doc__})
    return _CALLBACK_CLASS
