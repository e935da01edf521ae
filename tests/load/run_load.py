"""``make load``: reads from 100 concurrent clients for 60 s, and a burst of 200 concurrent job submits in the
middle of them, against the production setup (``python -m tests.load.run_load --help``).

The production setup is the README's: DEBUG off and no test settings (PBKDF2 passwords, the login lockout on),
PostgreSQL (a database of its own on the suite's server), Redis (a database number of its own), one Celery
worker per queue group (``conftest.PRODUCTION_WORKERS``), beat, two daphne processes (``--daphnes``; in
production the TLS reverse proxy balances over them, here the driver spreads its clients over them in turn, a
proxy's round robin), and six simulated agents heartbeating at the production period, on the demo campus
(``seed_campus``) with two days of history (``seed_history``) so the dashboard has numbers to compute. Plain HTTP
on loopback (``RECLAIMNET_INSECURE_HTTP=1``: no TLS proxy here). Before the clock starts each server process
answers every read of the mix twice, one request at a time (``loaddriver.warm_up``, a deployment's smoke check):
the 60 s measure processes as warm as a deployment's, not their first templates, imports and pool connections.

Client model (``scripts/loaddriver.py run_reads``): each client is a closed loop — one request, wait for the
answer, think, repeat — as a person's browser tab or a polling script is. A third are admins (dashboard page, its
summary fragment and chart data, the API lists and details), a third researchers (job pages, job API), a third
providers (provider pages, their nodes, reclaims). Think time is uniform in [0.5, 1.5] × ``--think`` (default
1 s): each client asks about once a second, faster than anything the portal's pages do by themselves (the
dashboard refetches its charts at most every 3 s, on live events only) and as often as an eager polling script.
So 100 clients offer up to ~100 requests/s. ``--think 0`` removes the pause (each client fires its next request
as soon as it has the answer): that measures saturation, where latency is clients ÷ throughput whatever the code.
The 200 submits are sent at the same instant, ``--burst-at`` seconds into the reads, from researchers' tokens.

Last line: ``load: N requests, E errors, p50 A ms, p99 B ms`` — N and E count every request (reads and submits),
the percentiles are the reads'. An error is any answer but 200 (reads) or 201 (submits), or no answer. The
submits' own latencies are reported on the line before. Exit status 1 on any error.
Timings on a 2-core machine shared with the load driver itself (~300 client threads) are noisy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.load.conftest import (
    CREDENTIALS,
    Deployment,
    cpu_used_s,
    loaddriver,
    own_postgres,
    own_redis,
    postgres_backends_cpu_s,
    production_env,
)


def run(clients: int, duration_s: float, submits: int, think_s: float, burst_at_s: float, agents: int,
        daphnes: int, workdir: Path, server: str = "daphne", settings: dict[str, str] | None = None) -> int:
    with own_postgres() as database_url, own_redis() as redis_url:
        deployment = Deployment(workdir, {**production_env(database_url, redis_url), **(settings or {})})
        try:
            t0 = time.monotonic()
            deployment.prepare()
            deployment.manage("seed_history", "--past-only")
            deployment.start_production(daphne_processes=daphnes, server=server)
            if agents:
                deployment.start_agents(agents)
            print(f"setup {time.monotonic() - t0:.1f} s; load average {os.getloadavg()[0]:.1f}", flush=True)
            burst: list[loaddriver.ReadResult] = []
            tokens = loaddriver.submit_tokens(deployment.base_url, CREDENTIALS)
            sessions = loaddriver.read_sessions(deployment.base_url, CREDENTIALS)
            warm = loaddriver.warm_up(deployment.base_urls, sessions)
            print(f"warm-up (not counted): {warm.requests} requests, one at a time, {warm.errors} errors, "
                  f"p50 {warm.p50_ms:.0f} ms, max {warm.percentile(100):.0f} ms", flush=True)

            def fire_burst() -> None:
                time.sleep(burst_at_s)
                burst.append(loaddriver.run_submit_burst(deployment.base_urls, submits, tokens))

            cpu_before, wall_before = deployment.cpu_seconds(), time.monotonic()
            pg_before, driver_before = postgres_backends_cpu_s(), time.process_time()
            burster = threading.Thread(target=fire_burst, name="burst", daemon=True)
            if submits:
                burster.start()
            reads_started = time.monotonic()
            reads = loaddriver.run_reads(deployment.base_urls, clients, duration_s, CREDENTIALS, think_s=think_s,
                                         seed=1, sessions=sessions)
            if submits:
                burster.join()
            load_avg = os.getloadavg()[0]
            wall_s = time.monotonic() - wall_before
            cpu_used = {name: cpu_s - cpu_before.get(name, 0.0) for name, cpu_s in deployment.cpu_seconds().items()}
            cpu_used["postgres"] = cpu_used_s(pg_before, postgres_backends_cpu_s())
            cpu_used["driver (this process)"] = time.process_time() - driver_before
            deployment.check_alive()
        finally:
            deployment.stop_all()
    print(reads.report())
    print(reads.by_window(reads_started))
    submitted = burst[0] if burst else loaddriver.ReadResult(what="submits")
    if submits:
        print(submitted.report())
        print(f"  the submits went out {burst_at_s:g} s into the reads and the last was answered "
              f"{burst_at_s + submitted.elapsed_s:.0f} s in")
    print(f"clients {clients}, think {think_s:g} s, {duration_s:g} s, {daphnes} daphne process(es); load average "
          f"at the end {load_avg:.1f}")
    print(f"CPU used in the {wall_s:.0f} s of load (cores): " + ", ".join(
        f"{name} {cpu_s / wall_s:.2f}" for name, cpu_s in sorted(cpu_used.items(), key=lambda kv: -kv[1])))
    portal_s = sum(cpu_s for name, cpu_s in cpu_used.items() if name.startswith(("daphne", "uvicorn")))
    answered = reads.requests + submitted.requests
    if answered:
        print(f"CPU per request, reads and submits (ms): portal {1000 * portal_s / answered:.1f}, postgres "
              f"{1000 * cpu_used['postgres'] / answered:.1f}, driver "
              f"{1000 * cpu_used['driver (this process)'] / answered:.1f}, everything measured "
              f"{1000 * sum(cpu_used.values()) / answered:.1f}")
    errors = deployment.errors()
    if errors:
        print(errors)
    if submits:
        print(f"submits: {submitted.requests} requests, {submitted.errors} errors, p50 {submitted.p50_ms:.0f} ms, "
              f"p99 {submitted.p99_ms:.0f} ms")
    total, failed = reads.requests + submitted.requests, reads.errors + submitted.errors
    print(f"load: {total} requests, {failed} errors, p50 {reads.p50_ms:.0f} ms, p99 {reads.p99_ms:.0f} ms")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of reads")
    parser.add_argument("--submits", type=int, default=200, help="concurrent job submits (0: none)")
    parser.add_argument("--think", type=float, default=1.0, help="mean think time between a client's requests (s)")
    parser.add_argument("--burst-at", type=float, default=20.0, help="seconds into the reads the submits go out")
    parser.add_argument("--agents", type=int, default=6)
    parser.add_argument("--daphnes", type=int, default=2,
                        help="daphne processes, as behind the reverse proxy (clients spread over them in turn)")
    parser.add_argument("--server", choices=["daphne", "uvicorn"], default="daphne",
                        help="the HTTP server of the portal processes (uvicorn: to compare)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment setting of the portal's processes (e.g. RECLAIMNET_HTTP_CONCURRENCY=4)")
    parser.add_argument("--keep", action="store_true", help="keep the logs' directory")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-load-"))
    try:
        return run(args.clients, args.duration, args.submits, args.think, args.burst_at, args.agents, args.daphnes,
                   workdir, args.server, dict(item.split("=", 1) for item in args.set))
    finally:
        if args.keep:
            print(f"logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
