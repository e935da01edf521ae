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
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
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
    args = parser.parse_args(argv)
    names = list(BOUNDED) if args.bounded else [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = [n for n in names if n not in ALL]
    if unknown:
        parser.error(f"unknown faults {unknown}")

    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-chaos-"))
    print(f"chaos: work directory {workdir}", flush=True)
    pg = harness.PrivatePostgres(workdir / "pg")
    redis = harness.PrivateRedis(workdir / "redis")
    results: list[Any] = []
    system = None
    try:
        pg.init()
        redis.start()
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
    except Exception:
        traceback.print_exc()
        print("chaos: the harness itself failed (above); counts below cover the faults that ran", flush=True)
    finally:
        if system is not None:
            system.stop()
        redis.stop()
        try:
            pg.stop()
        except Exception as exc:
            print(f"chaos: stopping postgres: {exc}", flush=True)
        if args.keep or os.environ.get("RECLAIMNET_CHAOS_KEEP"):
            print(f"chaos: logs kept in {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
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
