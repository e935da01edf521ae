"""`make chaos`: a real system of its own, injected with faults in turn, checked with no human step.

1. A private PostgreSQL cluster (``initdb`` in a temporary directory, a spare port, trust auth) and a private
   ``redis-server`` (no persistence): restarting them disturbs nothing else on the machine.
2. Migrate, seed a six-node campus (tests/e2e/harness.py ``make_campus``) plus one node only a hostile client
   uses, start daphne, a prefork Celery worker (concurrency 2), beat and six agents (two simulated GPUs each),
   and keep four training jobs running (examples/train_numpy.py through tests/chaos/steplog.py, which records
   every step executed).
3. For each fault (tests/chaos/faults.py): snapshot the rows, inject it, wait (bounded) for the system to
   settle, count what is stuck, lost, duplicated or misrecorded (tests/chaos/system.py, tests/chaos/ledger.py).

The last line reads ``chaos: F of N faults survived, stuck S, lost L, duplicated D, misrecorded M``; the exit
status is 0 only when every fault was survived. ``--faults a,b`` runs a subset (``--bounded``: the three that
`make test` runs), ``--keep`` keeps the work directory (all logs, the ledger, the database files).

SIGTERM and SIGINT end a run as its normal end does: everything it started (the system's processes, its redis-server
and postmaster, each by its own PID) is stopped and the work directory removed, then it exits 128 + the signal.
``--services-only`` starts just the private PostgreSQL and Redis, prints one JSON line (work directory, their
PIDs) and waits for a signal: what tests/chaos/test_chaos_teardown.py checks.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import django  # noqa: E402  (django.setup() runs once the environment is set, in _configure)

from tests.e2e import harness  # noqa: E402  (after the path: scripts run from a checkout)

ALL = ("worker_sigkill", "redis_restart", "postgres_restart", "daphne_restart", "agent_sigkill", "agent_cut",
       "corrupt_transfer", "reclaim_5x", "submit_200", "hostile_agent")
BOUNDED = ("worker_sigkill", "redis_restart", "hostile_agent")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived: unwinds to the teardown (a BaseException, so no ``except Exception`` on the way,
    here or in tests/chaos, swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def _hold_signals(held: list[int]) -> None:
    """From here on a SIGTERM/SIGINT is noted in ``held``, not acted on: the teardown runs to its end. (A Python
    handler, not SIG_IGN: the commands the teardown runs get the default dispositions back at exec.)"""
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda sig, frame: held.append(sig))


PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Orphans of this process's children are re-parented to it, not to init, so they stay its descendants."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``ancestor`` is on ``pid``'s parent chain (a running, non-zombie process only)."""
    for _ in range(64):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state == "Z":
            return False
        pid = int(ppid)
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


class Services:
    """The run's private PostgreSQL cluster and redis-server in a temporary work directory of its own. Stopped by
    their own PIDs only (``pg_ctl -D`` of its data directory, then the postmaster PID it recorded; the
    redis-server this object started), never by name; :meth:`stop` may be called at any point of :meth:`start`."""

    def __init__(self) -> None:
        _become_subreaper()  # an orphan of ours (an initdb whose runuser died) stays our descendant
        self.workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-chaos-"))
        self.pg = harness.PrivatePostgres(self.workdir / "pg")
        self.redis = harness.PrivateRedis(self.workdir / "redis")

    def start(self) -> None:
        self.pg.init()
        self.redis.start()

    def postmaster_pid(self) -> int | None:
        """The PID in the cluster's ``postmaster.pid`` (None: not running, or not started yet)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.pg.data_dir / "postmaster.pid").read_text().splitlines()[0])
        return None

    def pids(self) -> dict[str, int | None]:
        redis = self.redis.proc
        return {"postgres": self.postmaster_pid(), "redis": redis.pid if redis is not None else None}

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` is still this cluster's postmaster (its command line names our data directory)."""
        with contextlib.suppress(OSError):
            return str(self.pg.data_dir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        return False

    def _started_here(self) -> list[int]:
        """PIDs of this process's descendants still running with this run's (unique, mkdtemp) work directory in
        their command line (an interrupted ``initdb`` or ``pg_ctl``). Only descendants: a person's ``tail -f`` on
        the kept logs names the directory too, and is not ours to end."""
        mark, me, out = str(self.workdir).encode(), os.getpid(), []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != me:
                with contextlib.suppress(OSError):
                    if mark in (entry / "cmdline").read_bytes() and _descends_from(int(entry.name), me):
                        out.append(int(entry.name))
        return out

    def stop(self, keep: bool = False) -> None:
        """Stop Redis and PostgreSQL, then remove the work directory (kept with ``keep``)."""
        redis = self.redis.proc
        try:
            self.redis.stop()
        except Exception as exc:  # did not exit in time: its own PID, killed
            print(f"chaos: stopping redis: {exc}", flush=True)
            if redis is not None:
                with contextlib.suppress(OSError):
                    redis.kill()
                    redis.wait(10)
        pid = self.postmaster_pid()
        try:
            self.pg.stop()
        except Exception as exc:
            print(f"chaos: stopping postgres: {exc}", flush=True)
        if pid is not None and self._ours(pid):  # pg_ctl failed, or the start was cut short: that PID, killed
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGQUIT)  # immediate shutdown: the postmaster takes its children along
            deadline = time.monotonic() + 10
            while self._ours(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        left = self._started_here()  # e.g. an initdb whose runuser was killed under it: by its own PID
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [pid for pid in left if _descends_from(pid, os.getpid())]
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if keep:
            print(f"chaos: logs kept in {self.workdir}", flush=True)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _configure(pg: harness.PrivatePostgres, redis: harness.PrivateRedis) -> Any:
    """Point this process (and, through the environment, every process it starts) at the private services,
    migrate, and only then import the modules that need Django's models (tests/chaos/faults.py)."""
    drop = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "RECLAIMNET_", "PYTEST")
    for key in [k for k in os.environ if k.startswith(drop)]:
        del os.environ[key]
    os.environ.update(DATABASE_URL=pg.url, REDIS_URL=redis.url, RECLAIMNET_TESTING="1",
                      DJANGO_SETTINGS_MODULE="portal.settings", LOG_LEVEL="INFO", PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=REPO, check=True,
                   env={**os.environ, "LOG_LEVEL": "WARNING"}, stdin=subprocess.DEVNULL)
    django.setup()
    return importlib.import_module("tests.chaos.faults")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", default=",".join(ALL), help=f"comma-separated, in order; from {', '.join(ALL)}")
    parser.add_argument("--bounded", action="store_true", help=f"only {', '.join(BOUNDED)} (as in make test)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, ledger, database)")
    parser.add_argument("--services-only", action="store_true",
                        help="start only the private PostgreSQL and Redis, print their PIDs, wait for a signal")
    args = parser.parse_args(argv)
    names = list(BOUNDED) if args.bounded else [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [n for n in names if n not in ALL]
    if unknown:
        parser.error(f"unknown faults {unknown}")

    for signum in STOP_SIGNALS:  # before anything starts: a signal at any point unwinds to the teardown below
        signal.signal(signum, _interrupt)
    services = Services()
    workdir, pg, redis = services.workdir, services.pg, services.redis
    print(f"chaos: work directory {workdir}", flush=True)
    results: list[Any] = []
    system = None
    interrupted: int | None = None
    held: list[int] = []
    try:
        services.start()
        if args.services_only:
            print(json.dumps({"workdir": str(workdir), **services.pids()}), flush=True)
            while True:
                signal.pause()
        faults = _configure(pg, redis)
        system = faults.ChaosSystem(workdir, pg, redis)
        t0 = time.monotonic()
        system.boot()
        system.top_up()
        print(f"chaos: system up in {time.monotonic() - t0:.0f} s (postgres :{pg.port}, redis :{redis.port}, "
              f"daphne :{system.stack.port}, {len(faults.NODES)} agents)", flush=True)
        for name in names:
            results.append(_run_fault(faults, system, name))
            for line in results[-1].lines():
                print(line, flush=True)
    except Interrupted as exc:
        interrupted = exc.signum
    except Exception:
        traceback.print_exc()
        print("chaos: the harness itself failed (above); counts below cover the faults that ran", flush=True)
    finally:
        _hold_signals(held)
        try:
            if system is not None:
                system.stop()
        except Exception:
            traceback.print_exc()
        services.stop(keep=bool(args.keep or os.environ.get("RECLAIMNET_CHAOS_KEEP")))
    if interrupted is not None:
        print(f"chaos: {signal.Signals(interrupted).name}: stopped everything it started", flush=True)
        return 128 + interrupted
    survived = sum(1 for r in results if r.survived)
    counts = [sum(len(getattr(r, k)) for r in results) for k in ("stuck", "lost", "duplicated", "misrecorded")]
    print(f"chaos: {survived} of {len(names)} faults survived, stuck {counts[0]}, lost {counts[1]}, "
          f"duplicated {counts[2]}, misrecorded {counts[3]}", flush=True)
    return 0 if survived == len(names) and not any(counts) else 1


def _run_fault(faults: Any, system: Any, name: str) -> Any:
    """Inject one fault and check the system after it; a harness error counts as a failed check."""
    result = faults.FaultResult(name)
    print(f"chaos: --- {name} ---", flush=True)
    try:
        system.top_up()
        before = system.snapshot()
        started = time.time()
        faults.FAULTS[name](system, result, before)
        system.settle(result, started)
        system.evaluate(result, before)
    except Exception as exc:
        result.failures.append(f"harness error: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")
    try:
        system.restart_dead(result)
    except Exception as exc:
        result.failures.append(f"restarting dead processes: {exc}")
    return result


if __name__ == "__main__":
    raise SystemExit(main())
