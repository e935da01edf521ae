"""scripts/chaos.py ended by SIGTERM or SIGINT stops what it started (its private PostgreSQL and redis-server, by
their PIDs) and removes its work directory, as a normal end does. Only the service layer is started
(``--services-only``): the teardown is the same code whatever else a run had started."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 25.0

pytestmark = pytest.mark.timeout(60)


def _missing() -> str | None:
    if not Path("/usr/lib/postgresql/15/bin/initdb").exists():
        return "needs PostgreSQL 15's initdb (/usr/lib/postgresql/15/bin)"
    if not shutil.which("redis-server") and not Path("/usr/bin/redis-server").exists():
        return "needs redis-server"
    return None


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (one nobody reaped yet has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _first_json_line(proc: subprocess.Popen[str]) -> dict[str, object]:
    assert proc.stdout is not None
    seen: list[str] = []
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if not sel.select(timeout=0.2):
                continue
            line = proc.stdout.readline()
            seen.append(line)
            if line.startswith("{"):
                return dict(json.loads(line))
    raise AssertionError(f"no services line within {START_TIMEOUT_S} s: {''.join(seen)}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_stops_postgres_and_redis_and_removes_the_work_directory(signum: int) -> None:
    missing = _missing()
    if missing:
        pytest.skip(missing)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    proc = subprocess.Popen([sys.executable, "scripts/chaos.py", "--services-only"], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        started = _first_json_line(proc)
        workdir, pids = Path(str(started["workdir"])), [int(str(started["postgres"])), int(str(started["redis"]))]
        assert workdir.is_dir() and all(_running(pid) for pid in pids), started
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # only the chaos process this test started
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, out
    assert f"chaos: {signal.Signals(signum).name}: stopped everything it started" in out
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _running(pid)], out
    assert not workdir.exists(), out
