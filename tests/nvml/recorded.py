"""Recorded NVML inventories (the JSON files here) and real processes to stand for the PIDs they name.

A recording names the PIDs NVML listed on the machine it came from; :func:`rebind` points them at processes of
this machine (a job started the way the runner starts one, the lab's own processes), so that the agent's split
into its jobs' processes and foreign ones runs on a real ``/proc``."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def load(name: str) -> dict[str, Any]:
    return json.loads((HERE / name).read_text())


def rebind(record: dict[str, Any], pids: dict[int, int]) -> dict[str, Any]:
    """A copy of ``record`` whose process PIDs are mapped through ``pids`` (recorded PID → PID here)."""
    out = copy.deepcopy(record)
    for dev in out["devices"]:
        for p in dev.get("processes", []):
            p["pid"] = pids.get(p["pid"], p["pid"])
    return out


# A job as the runner starts it (its own session), with a worker that leaves the session (setsid), as a
# launcher's worker might: still the job's, through its parent.
_JOB = ("import subprocess, sys, time\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(60)'])\n"
        "print(w.pid, flush=True)\n"
        "time.sleep(60)\n")


@dataclass
class Processes:
    job: int  # the job's session leader (what the agent knows: RunningJob.proc.pid)
    worker: int  # the job's worker, in a session of its own
    lab: list[int]  # the lab's own processes
    gone: int  # a PID that no longer exists (NVML listed it, it exited)


@contextlib.contextmanager
def processes(lab: int = 2) -> Iterator[Processes]:
    """Start a job (leader + setsid worker) and ``lab`` unrelated processes; kill exactly these at the end."""
    started: list[subprocess.Popen[bytes]] = []
    extra: list[int] = []
    try:
        job = subprocess.Popen([sys.executable, "-c", _JOB], stdout=subprocess.PIPE, start_new_session=True)
        started.append(job)
        assert job.stdout is not None
        worker = int(job.stdout.readline())
        extra.append(worker)
        for _ in range(lab):
            started.append(subprocess.Popen(["sleep", "60"]))
        done = subprocess.Popen(["true"])
        done.wait()
        yield Processes(job.pid, worker, [p.pid for p in started[1:]], done.pid)
    finally:
        for pid in extra:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in started:
            p.kill()
            p.wait()
