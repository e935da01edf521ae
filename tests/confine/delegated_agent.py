"""The agent's side of tests/confine/test_delegated.py, run as a non-root user with the shipped unit's ambient
capabilities inside a cgroup delegated to it (design §19.6): start one confined job, look at it, end it; print
what was seen as JSON. Usage: ``delegated_agent.py SPACE JOB_COMMAND``."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nodeagent.confine import Confiner, can_switch_users
from nodeagent.runner import start_job


def _stat_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def main() -> None:
    space, command = Path(sys.argv[1]), sys.argv[2]
    confiner = Confiner(data_dir=space / "data", job_user="nobody")
    seen: dict[str, object] = {"uid": os.getuid(), "can_switch": can_switch_users(), "users": confiner.users.enabled,
                               "backend": confiner.backend.name if confiner.backend else None,
                               "parents": [str(p) for p in confiner.backend.parent_dirs()] if confiner.backend else []}
    run = start_job(data_dir=space / "data", base_dir=space, job_id="1", command=command, gpus=[], interval_s=None,
                    next_sequence=1, restore_sequence=None, compat={}, kill_with_agent=True, confiner=confiner,
                    memory_bytes=64 << 20)
    deadline = time.monotonic() + 20
    while run.step() == 0 and time.monotonic() < deadline:  # the job writes its uid as its step
        time.sleep(0.05)
    status = Path(f"/proc/{run.proc.pid}/status").read_text().splitlines()
    seen |= {"job_uid_read_by_agent": run.step(),
             "job_cgroups": sorted({line.split(":", 2)[2] for line in
                                    Path(f"/proc/{run.proc.pid}/cgroup").read_text().splitlines()} - {"/"}),
             "job_caps": sorted({line.split()[1] for line in status if line.startswith(("CapEff:", "CapPrm:",
                                                                                         "CapAmb:"))}),
             "ckpt_owner_while_running": run.ckpt_dir.stat().st_uid,
             "temporaries_while_running": sorted(p.name for p in run.ckpt_dir.iterdir())}
    run.signal(signal.SIGSTOP)
    time.sleep(0.2)
    seen["state_after_sigstop"] = _stat_state(run.proc.pid)
    run.signal(signal.SIGCONT)
    run.signal(signal.SIGKILL)
    run.proc.wait(10)
    run.finish()
    seen |= {"left_in_ckpt_dir": sorted(p.name for p in run.ckpt_dir.iterdir()),
             "ckpt_owner_after": run.ckpt_dir.stat().st_uid}
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
