"""The runs an agent's predecessor left behind, and how far each got (design §9.9 "work lost is measured").

An agent that dies (SIGKILL, a crash) takes its jobs with it (``PR_SET_PDEATHSIG``) and never reports the steps
they made after the last heartbeat the portal recorded: up to a heartbeat interval, or a whole outage when the
portal could not be reached meanwhile. Those steps are lost, and without this the portal would not know them.
Each job wrote its progress to ``progress.json`` in its work directory (``{"step", "t"}``, at most 0.2 s apart,
``nodeagent.jobkit.Checkpointer.report_progress``) until it died; the files outlive it. The next agent lists them
in its first hello (``ended_jobs``), and the portal takes each as the last step of the run it knows was on this
node — or of no run at all, when the file is older than that run (an earlier run's file).

The job writes the file: whatever it holds must not break the agent. A malformed, oversized or unreadable file is
left out.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

MAX_ENDED = 64  # the newest runs listed; older ones were reported long ago or are not the portal's concern
MAX_AGE_S = 86400.0  # a run whose progress is older than a day is history, not evidence
MAX_FILE_BYTES = 4096
MAX_STEP = 2**63 - 1


def last_progress(work_dir: Path) -> tuple[int, float] | None:
    """(step, unix time) of the job's last progress record in ``work_dir``, or None if absent or malformed."""
    path = work_dir / "progress.json"
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    step, t = data.get("step"), data.get("t")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        return None
    if not isinstance(t, int | float) or isinstance(t, bool) or not math.isfinite(t) or t <= 0:
        return None
    return step, float(t)


def ended_runs(data_dir: Path, running: Collection[str], now: float | None = None) -> list[dict[str, Any]]:
    """``[{"job_id", "step", "t"}]`` for the jobs with a work directory under ``data_dir`` that this agent does
    not run (``running``: job ids), newest first, at most :data:`MAX_ENDED`, none older than :data:`MAX_AGE_S`."""
    now = time.time() if now is None else now
    try:
        job_dirs = [d for d in (data_dir / "jobs").iterdir() if d.name.isdigit() and d.name not in running]
    except OSError:
        return []
    out = []
    for job_dir in job_dirs:
        job_id = int(job_dir.name)
        progress = last_progress(job_dir / "work")
        if progress is None or not 0 < job_id <= MAX_STEP or now - progress[1] > MAX_AGE_S:
            continue
        out.append({"job_id": job_id, "step": progress[0], "t": progress[1]})
    out.sort(key=lambda e: (-e["t"], e["job_id"]))
    return out[:MAX_ENDED]
