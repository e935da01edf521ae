"""Job runner: one subprocess per job, its own work directory, ``CUDA_VISIBLE_DEVICES`` = its GPUs (design §1).

A gang job holds all its GPUs on this node and is started, checkpointed and stopped as one process (group).
The plain-process runtime is what every test uses; containers are left to a later runtime. The job's stdout and
stderr go to ``<work>/job.log`` (appended, run after run); its :class:`~nodeagent.output.OutputTail` reads this
run's part for the portal (design §9.11).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent import jobkit
from nodeagent.output import OutputTail
from nodeagent.transfer import store_dir

PR_SET_PDEATHSIG = 1
MAX_STEP = 2**63 - 1
MAX_RESULT_BYTES = 8 * 1024
AGENT_SECRETS = frozenset({"RECLAIMNET_AGENT_TOKEN"})  # never passed on to a job's environment


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the agent dies (a vanished node takes its jobs with it)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def resolve_command(command: str, base_dir: Path) -> list[str]:
    """Split the job command; ``python``/``python3`` become this interpreter, and a relative ``*.py`` argument
    that exists under ``base_dir`` becomes absolute (the job runs in its own work directory)."""
    argv = shlex.split(command)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    for i, arg in enumerate(argv):
        if arg.endswith(".py") and not os.path.isabs(arg) and (base_dir / arg).is_file():
            argv[i] = str((base_dir / arg).resolve())
    return argv


@dataclass
class RunningJob:
    job_id: str
    gpus: list[int]
    proc: subprocess.Popen[bytes]
    work_dir: Path
    ckpt_dir: Path
    reported_sequences: set[int] = field(default_factory=set)
    stop_reason: str = ""
    output: OutputTail | None = None  # this run's stdout+stderr, read from job.log (None: not captured)

    @property
    def progress_file(self) -> Path:
        return self.work_dir / "progress.json"

    @property
    def control_file(self) -> Path:
        return self.work_dir / "control.json"

    @property
    def result_file(self) -> Path:
        return self.work_dir / "result.json"

    # The job writes these files: whatever they hold must not break the agent's loops or make the portal
    # refuse the heartbeat / job_exited that carries them (bigint steps, messages under 64 KiB).
    def step(self) -> int:
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError, OverflowError):
            return min(max(0, int(json.loads(self.progress_file.read_text()).get("step", 0))), MAX_STEP)
        return 0

    def result(self) -> dict[str, Any]:
        with contextlib.suppress(OSError, ValueError, TypeError):
            if self.result_file.stat().st_size <= MAX_RESULT_BYTES:
                return dict(json.loads(self.result_file.read_text()))
        return {}

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)

    def set_interval(self, interval_s: float) -> None:
        jobkit.atomic_write_bytes(self.control_file, json.dumps({"interval_s": interval_s}).encode())


def prepare_restore(ckpt_dir: Path, restore_sequence: int | None) -> None:
    """Drop local checkpoints newer than the one to restore: they belong to a timeline the portal abandoned."""
    if restore_sequence is None:
        return
    for manifest in jobkit.list_manifests(ckpt_dir):
        if manifest.sequence > restore_sequence:
            jobkit.remove_checkpoint(ckpt_dir, manifest.sequence)


def start_job(
    *,
    data_dir: Path,
    base_dir: Path,
    job_id: str,
    command: str,
    gpus: list[int],
    interval_s: float | None,
    next_sequence: int,
    restore_sequence: int | None,
    compat: dict[str, str],
    kill_with_agent: bool,
) -> RunningJob:
    """Start a job process in ``<data>/jobs/<id>/work`` with its checkpoints in ``<data>/ckpt/<id>``."""
    ckpt_dir = store_dir(data_dir, job_id)  # checks job_id is one safe path component
    work_dir = data_dir / "jobs" / str(job_id) / "work"
    work_dir.mkdir(parents=True, exist_ok=True)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    prepare_restore(ckpt_dir, restore_sequence)
    (work_dir / "result.json").unlink(missing_ok=True)
    env = {
        **{k: v for k, v in os.environ.items() if k not in AGENT_SECRETS},  # the job must not learn the node token
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
        "RECLAIMNET_JOB_ID": str(job_id),
        "RECLAIMNET_CKPT_DIR": str(ckpt_dir),
        "RECLAIMNET_WORK_DIR": str(work_dir),
        "RECLAIMNET_CKPT_NEXT_SEQ": str(next_sequence),
        "RECLAIMNET_CONTROL_FILE": str(work_dir / "control.json"),
        "RECLAIMNET_PROGRESS_FILE": str(work_dir / "progress.json"),
        "RECLAIMNET_RESULT_FILE": str(work_dir / "result.json"),
        "RECLAIMNET_COMPAT": json.dumps(compat),
        "PYTHONUNBUFFERED": "1",
    }
    if interval_s:
        env["RECLAIMNET_CKPT_INTERVAL_S"] = str(interval_s)
        jobkit.atomic_write_bytes(work_dir / "control.json", json.dumps({"interval_s": interval_s}).encode())
    if restore_sequence is not None:
        env["RECLAIMNET_RESTORE_SEQ"] = str(restore_sequence)
    else:
        env.pop("RECLAIMNET_RESTORE_SEQ", None)
    log_file = open(work_dir / "job.log", "ab")  # noqa: SIM115  (owned by the child; closed below)
    output = OutputTail(work_dir / "job.log", os.fstat(log_file.fileno()).st_size)  # this run's part only
    try:
        proc = subprocess.Popen(
            resolve_command(command, base_dir),
            cwd=work_dir,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: signals reach a gang job's workers too
            preexec_fn=_die_with_parent if kill_with_agent else None,
        )
    except BaseException:
        output.close()
        raise
    finally:
        log_file.close()
    reported = {m.sequence for m in jobkit.list_manifests(ckpt_dir)}
    return RunningJob(job_id=str(job_id), gpus=list(gpus), proc=proc, work_dir=work_dir, ckpt_dir=ckpt_dir,
                      reported_sequences=reported, output=output)
