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
import logging
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent import jobkit
from nodeagent.confine import Confiner, JobConfinement
from nodeagent.output import OutputTail
from nodeagent.transfer import store_dir

PR_SET_PDEATHSIG = 1
PR_CAP_AMBIENT = 47  # prctl(2) option and its CLEAR_ALL argument (linux/prctl.h)
PR_CAP_AMBIENT_CLEAR_ALL = 4
MAX_STEP = 2**63 - 1
MAX_RESULT_BYTES = 8 * 1024
AGENT_SECRETS = frozenset({"RECLAIMNET_AGENT_TOKEN"})  # never passed on to a job's environment
PORTAL_ENV_PREFIX = "RECLAIMNET_ARRAY_"  # the only variables a start_job's ``env`` may set (design §16.6)


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the agent dies (a vanished node takes its jobs with it)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _drop_ambient_capabilities() -> None:
    """In the child: clear the ambient capabilities the agent's unit grants it for tc and BPF (design §18), so a
    job never inherits CAP_NET_ADMIN, CAP_BPF or CAP_SYS_ADMIN across its exec. Fails closed: if the set cannot
    be cleared the start fails (the exec never happens) rather than run a job with the agent's capabilities."""
    if ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not clear the ambient capabilities")


def _child_setup(kill_with_agent: bool, confinement: JobConfinement | None = None) -> Callable[[], None]:
    def setup() -> None:
        _drop_ambient_capabilities()
        if confinement is not None:  # design §19: into the job's cgroup, then its user, before the exec
            confinement.child_setup()
        if kill_with_agent:  # after the user change, which clears the parent-death signal
            _die_with_parent()
    return setup


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
    output_dir: str = ""  # design §14: uploaded to the portal (relative to work_dir; "" for none)
    upload_with_checkpoints: bool = False  # ... also after each checkpoint, not only when the job ends
    confinement: JobConfinement | None = None  # its cgroup and user (design §19; None: unconfined)

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
            return min(max(0, int(json.loads(jobkit.read_small(self.progress_file, MAX_RESULT_BYTES))
                                  .get("step", 0))), MAX_STEP)
        return 0

    @property
    def gpu_load_file(self) -> Path:
        return self.work_dir / "gpu_load.json"

    def simulated_load(self) -> float:
        """The GPU load (percent) the job says it puts on its simulated GPUs (``jobkit.report_gpu_load``; design
        §15): 100 while it has said nothing, as any job holding a simulated GPU counted before."""
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            pct = float(json.loads(jobkit.read_small(self.gpu_load_file, MAX_RESULT_BYTES)).get("pct", 100.0))
            if pct == pct:  # not NaN
                return min(100.0, max(0.0, pct))
        return 100.0

    def result(self) -> dict[str, Any]:
        with contextlib.suppress(OSError, ValueError, TypeError):
            return dict(json.loads(jobkit.read_small(self.result_file, MAX_RESULT_BYTES)))
        return {}

    def member_pids(self) -> set[int]:
        """Every process that is this job's: its session leader, and with a cgroup every process in it (design
        §1 "Owner activity and MIG": a daemonised GPU process that left the session and the process tree is
        still in the job's cgroup, so it is the job's use, not the owner's)."""
        pids = {self.proc.pid}
        cgroup = self.confinement.cgroup if self.confinement is not None else None
        if cgroup is not None:
            with contextlib.suppress(OSError, ValueError):
                pids.update(cgroup.pids())
        return pids

    def signal(self, signum: int) -> None:
        """Signal the job's process group; SIGKILL kills its whole cgroup and SIGSTOP/SIGCONT reach every process
        in it (a fork that left the group with ``setsid`` included, design §19)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)
        if self.confinement is not None:
            if signum == signal.SIGKILL:
                self.confinement.kill_all()
            elif signum in (signal.SIGSTOP, signal.SIGCONT):
                self.confinement.signal_all(signum)

    def finish(self) -> str | None:
        """The job's process ended: kill what is left of it, remove its cgroup, give its directories back to the
        agent, remove the checkpoint temporaries its death cut short. Returns the reason when the kernel killed it
        for its memory limit (design §19). Never raises: the job's exit must still be reported."""
        reason = None
        if self.confinement is not None:
            try:
                reason = self.confinement.end()
            except Exception:
                logging.getLogger("nodeagent").exception("job %s: its confinement was not cleaned up", self.job_id)
        with contextlib.suppress(Exception):  # a write its death cut short leaves a temporary: not kept forever
            jobkit.remove_orphan_temporaries(self.ckpt_dir)
        return reason

    def set_interval(self, interval_s: float) -> None:
        jobkit.atomic_write_bytes(self.control_file, json.dumps({"interval_s": interval_s}).encode(), mode=0o644)


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
    output_dir: str = "",
    upload_with_checkpoints: bool = False,
    extra_env: dict[str, str] | None = None,
    confiner: Confiner | None = None,
    memory_bytes: Any = None,
    cpu_cores: Any = None,
) -> RunningJob:
    """Start a job process in ``<data>/jobs/<id>/work`` with its checkpoints in ``<data>/ckpt/<id>``.

    With a ``confiner`` (design §19) the job runs in its own cgroup, limited to ``memory_bytes`` and ``cpu_cores``
    (from its start command; else the agent's per-GPU defaults), as the job's user, its two directories its own."""
    ckpt_dir = store_dir(data_dir, job_id)  # checks job_id is one safe path component
    work_dir = data_dir / "jobs" / str(job_id) / "work"
    work_dir.mkdir(parents=True, exist_ok=True)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    prepare_restore(ckpt_dir, restore_sequence)
    jobkit.remove_orphan_temporaries(ckpt_dir)  # a previous run killed mid-write (its writer is gone)
    (work_dir / "result.json").unlink(missing_ok=True)
    (work_dir / "gpu_load.json").unlink(missing_ok=True)  # a new run says its own load
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
        "RECLAIMNET_GPU_LOAD_FILE": str(work_dir / "gpu_load.json"),
        "RECLAIMNET_COMPAT": json.dumps(compat),
        "PYTHONUNBUFFERED": "1",
    }
    # What the portal adds about the job (design §16.6: RECLAIMNET_ARRAY_ID, RECLAIMNET_ARRAY_INDEX); only its
    # own RECLAIMNET_ARRAY_* names, so a command cannot change the variables above or the job's PATH.
    env.update({str(k): str(v) for k, v in (extra_env or {}).items() if str(k).startswith(PORTAL_ENV_PREFIX)})
    if interval_s:
        env["RECLAIMNET_CKPT_INTERVAL_S"] = str(interval_s)
        jobkit.atomic_write_bytes(work_dir / "control.json", json.dumps({"interval_s": interval_s}).encode(),
                                  mode=0o644)
    if restore_sequence is not None:
        env["RECLAIMNET_RESTORE_SEQ"] = str(restore_sequence)
    else:
        env.pop("RECLAIMNET_RESTORE_SEQ", None)
    # Never through a symlink a job left in its work directory (design §19: the agent may be root).
    log_fd = os.open(work_dir / "job.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    log_file = os.fdopen(log_fd, "ab")  # owned by the child; closed below
    output = OutputTail(work_dir / "job.log", os.fstat(log_file.fileno()).st_size)  # this run's part only
    confinement: JobConfinement | None = None
    try:
        if confiner is not None:
            confinement = confiner.begin(str(job_id), confiner.limits_for(list(gpus), memory_bytes, cpu_cores),
                                         [work_dir, ckpt_dir])
            env.update(confinement.env)
        proc = subprocess.Popen(
            resolve_command(command, base_dir),
            cwd=work_dir,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: signals reach a gang job's workers too
            preexec_fn=_child_setup(kill_with_agent, confinement),
        )
    except BaseException:
        output.close()
        if confinement is not None:
            confinement.end()
        raise
    finally:
        log_file.close()
    reported = {m.sequence for m in jobkit.list_manifests(ckpt_dir)}
    return RunningJob(job_id=str(job_id), gpus=list(gpus), proc=proc, work_dir=work_dir, ckpt_dir=ckpt_dir,
                      reported_sequences=reported, output=output, output_dir=output_dir,
                      upload_with_checkpoints=upload_with_checkpoints, confinement=confinement)
