"""Run examples/train_numpy.py unchanged, appending every step it executes to a ledger (the chaos suite's
ground truth of work done and redone).

    python tests/chaos/steplog.py --ledger /tmp/ledger.jsonl -- --steps 300 --step-sleep 0.05

One JSON line per executed step: {"job", "run", "node", "step", "t"} (``step``: the 0-based index handed to
``train_step``, ``t``: wall time after it), plus a ``"start"`` line when the process starts, an ``"exit"``
line when it returns and a ``"continued"`` line whenever it gets SIGCONT (an agent that could not hear the
portal pauses its jobs with SIGSTOP and resumes them with SIGCONT, design §9.10: the time between is not work). ``run`` is unique per process, ``node`` is read from the agent's work directory
(``<data dir>/jobs/<job>/work``, the data dir named after the node). Each line is one ``write`` on an
``O_APPEND`` descriptor, so concurrent jobs never interleave lines.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

TRAINER = Path(__file__).resolve().parents[2] / "examples" / "train_numpy.py"


def _node_name() -> str:
    work_dir = os.environ.get("RECLAIMNET_WORK_DIR", "")
    return Path(work_dir).parents[2].name if work_dir else ""


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--ledger" or argv[2] != "--":
        print("usage: steplog.py --ledger PATH -- TRAINER-ARGS", file=sys.stderr)
        return 2
    fd = os.open(argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    common = {"job": os.environ.get("RECLAIMNET_JOB_ID", ""), "run": uuid.uuid4().hex, "node": _node_name()}

    def record(**fields: Any) -> None:
        os.write(fd, (json.dumps({**common, **fields, "t": time.time()}) + "\n").encode())

    spec = importlib.util.spec_from_file_location("train_numpy", TRAINER)
    assert spec is not None and spec.loader is not None
    trainer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trainer)
    train_step = trainer.train_step

    def recorded_step(state: Any, step: int, *args: Any) -> None:
        train_step(state, step, *args)
        record(step=int(step))

    trainer.train_step = recorded_step
    signal.signal(signal.SIGCONT, lambda *_: record(event="continued"))
    record(event="start")
    code = int(trainer.main(argv[3:]))
    record(event="exit", code=code)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
