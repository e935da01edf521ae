"""``make bench-tick``: the whole control tick against PostgreSQL at 54, 500 and 5,000 nodes.

Each size gets a fresh database (``<name>_bench_tick``) filled by ``scripts/tickcampus.py``: jobs on ~80 % of the
lendable GPUs, a week of departures, a day of bandwidth samples at one a minute per access link (COPY). Then
``portal.control.loop.ticks.control_tick`` runs as the portal runs it — estimators, lost heartbeats, deadlines,
expired transfers, P1 for every running job, expired starts, placement of the queue, releases — 3 times to
warm up and 20 times measured, 10 s apart on an injected clock (the default control period), with the agents'
heartbeats and one bandwidth sample per link written between ticks (not timed). Printed first: the host's speed as
the best of three runs of a fixed pure-Python loop (``host_reference_s``), so figures from two machines can be
compared. Printed per size: the median and spread of the tick and its SQL statement count; the last
line is ``bench-tick: 500 nodes X ms, 5000 nodes Y ms, queries at 500 Q1, queries at 5000 Q2``.

    python scripts/bench_tick.py [--sizes 54,500,5000] [--ticks 20] [--samples-per-link 1440]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parents[1]
DEFAULT_URL = "postgres://reclaimnet@127.0.0.1:5432/reclaimnet"
CONTROL_PERIOD_S = 10.0  # the portal's default RECLAIMNET_CONTROL_PERIOD_S


def host_reference_s(steps: int = 10**7) -> float:
    """Seconds for ``steps`` additions in a pure-Python loop, best of three: the host's speed, printed beside the
    tick's figures (the tick is mostly Python and PostgreSQL's executor on the same cores)."""
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        total = 0
        for k in range(steps):
            total += k
        best = min(best, time.perf_counter() - started)
    return best


def _admin(url: str, sql: str) -> None:
    import psycopg

    parts = urlsplit(url)
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(sql)


def _bench_url(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    name = (parts.path.lstrip("/") or "reclaimnet") + "_bench_tick"
    return urlunsplit(parts._replace(path=f"/{name}")), name


def measure(size: int, ticks: int, samples_per_link: int, profile: bool = False) -> dict[str, object]:
    """Child process: build the campus in the database DATABASE_URL names, time the ticks."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "scripts"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    import random

    import tickcampus
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from portal.control.loop import ticks as control_ticks

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    built = tickcampus.build(size, samples_per_link=samples_per_link)
    build_s = time.perf_counter() - started
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")  # as autovacuum keeps a live campus's tables (hint bits, visibility map)
    rng = random.Random(1)
    times_ms: list[float] = []
    queries: list[int] = []
    counted = [0]

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        counted[0] += 1
        return execute(sql, params, many, context)

    start = timezone.now()
    context = control_ticks.TickContext(started_monotonic=-math.inf)  # a worker long past its start-up
    for k in range(3 + ticks):
        # The default control period on an injected clock: each tick sees 10 s of heartbeats and samples, and
        # every sixth writes the hazard profiles and stores the estimators' snapshot, as the portal would.
        now = start + dt.timedelta(seconds=CONTROL_PERIOD_S * k)
        tickcampus.agents_report(now, rng)
        counted[0] = 0
        with connection.execute_wrapper(count):
            t0 = time.perf_counter()
            control_ticks.control_tick(now, context)
            elapsed_ms = 1000 * (time.perf_counter() - t0)
        if k >= 3:
            times_ms.append(elapsed_ms)
            queries.append(counted[0])
    if profile:
        import cProfile
        import pstats

        now = start + dt.timedelta(seconds=CONTROL_PERIOD_S * (3 + ticks))
        tickcampus.agents_report(now, rng)
        profiler = cProfile.Profile()
        profiler.runcall(control_ticks.control_tick, now, context)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats(os.environ.get("BENCH_SORT", "cumulative")).print_stats(int(os.environ.get("BENCH_TOP", "35")))
        # Then one more tick with each SQL statement timed: the slowest first, with where it came from.
        timed: list[tuple[float, str]] = []

        def time_statement(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                timed.append((1000 * (time.perf_counter() - t0), sql))

        # Six ticks: one control period of the estimators' snapshot, averaged per tick.
        for _ in range(6):
            now += dt.timedelta(seconds=CONTROL_PERIOD_S)
            tickcampus.agents_report(now, rng)
            with connection.execute_wrapper(time_statement):
                control_ticks.control_tick(now, context)
        by_statement: dict[str, float] = {}
        for ms, sql in timed:
            by_statement[sql[:200]] = by_statement.get(sql[:200], 0.0) + ms / 6
        sys.stderr.write(f"SQL per tick over 6: {len(timed) / 6:.1f} statements, "
                         f"{sum(by_statement.values()):.1f} ms\n")
        for sql, ms in sorted(by_statement.items(), key=lambda item: -item[1])[:15]:
            sys.stderr.write(f"{ms:7.2f} ms  {sql}\n")
    return {"size": size, "build_s": build_s, "built": built.__dict__, "median_ms": statistics.median(times_ms),
            "min_ms": min(times_ms), "max_ms": max(times_ms), "queries": int(statistics.median(queries)),
            "queries_max": max(queries)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="54,500,5000")
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--samples-per-link", type=int, default=1440)
    parser.add_argument("--profile", action="store_true", help="print where one more tick spends its time")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.ticks, args.samples_per_link, args.profile)))
        return 0
    url, name = _bench_url(os.environ.get("DATABASE_URL", DEFAULT_URL))
    print(f"host reference: a 10^7-step Python loop in {host_reference_s():.2f} s", flush=True)
    results: dict[int, dict[str, object]] = {}
    for size in [int(s) for s in args.sizes.split(",")]:
        _admin(url, f'DROP DATABASE IF EXISTS "{name}"')
        _admin(url, f'CREATE DATABASE "{name}"')
        try:
            env = {**os.environ, "DATABASE_URL": url, "RECLAIMNET_TESTING": "1", "RECLAIMNET_NO_LOOP": "1", "RECLAIMNET_OUTBOX_RELAY": "celery"}
            out = subprocess.run([sys.executable, __file__, "--child", str(size), "--ticks", str(args.ticks),
                                  "--samples-per-link", str(args.samples_per_link),
                                  *(["--profile"] if args.profile else [])], env=env, check=True,
                                 capture_output=True, text=True, cwd=REPO)
        except subprocess.CalledProcessError as failed:
            sys.stderr.write(failed.stdout + failed.stderr)
            return 1
        finally:
            _admin(url, f'DROP DATABASE IF EXISTS "{name}"')
        if args.profile:
            sys.stderr.write(out.stderr)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        results[size] = result
        built = result["built"]
        print(f"{size:>5} nodes ({built['gpus']} GPUs, {built['running_jobs']} running jobs, {built['queued_jobs']} "
              f"queued, {built['departures']} departures, {built['samples']} samples; built in "
              f"{result['build_s']:.0f} s): tick median {result['median_ms']:.1f} ms "
              f"[{result['min_ms']:.1f}–{result['max_ms']:.1f}], {result['queries']} queries "
              f"(max {result['queries_max']})", flush=True)
    small, large = results.get(500), results.get(5000)
    if small and large:
        print(f"bench-tick: 500 nodes {small['median_ms']:.0f} ms, 5000 nodes {large['median_ms']:.0f} ms, "
              f"queries at 500 {small['queries']}, queries at 5000 {large['queries']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
