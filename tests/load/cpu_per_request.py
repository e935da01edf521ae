"""``make load-cpu``: CPU time per request, per endpoint, of the production setup ``make load`` drives
(``python -m tests.load.cpu_per_request --help``).

Latency on a shared 2-core machine says little; CPU time does: what ``make load`` can sustain on 2 cores is about
2 core-seconds per second divided by the CPU one request costs everywhere — the portal's server processes, the
PostgreSQL backends serving them and the load driver itself. This starts the deployment of ``run_load`` (the
README's processes, the demo campus with two days of history, simulated agents), then sends each read of
``loaddriver.READ_MIX`` ``--requests`` times from ``--clients`` closed-loop clients with no think time, and the
job submit too, and measures the CPU each took:

- ``portal``: the daphne processes (``/proc/<pid>/stat``, user + system);
- ``pg``: the PostgreSQL backends connected to the deployment's database (``pg_stat_activity`` pids);
- ``driver``: this process (``time.process_time``: the client threads, http.client);
- ``rest``: the Celery workers, beat and the agents in the same window; for the submit the window runs
  ``--settle`` seconds past the last answer (the placements the submits queued), and the line after it splits
  ``rest`` by process.

The background (agents heartbeating, the control tick) is measured in an idle window first and subtracted.
``--profile DIR`` also records each daphne with py-spy (``pip install py-spy``; collapsed stacks of the thread
holding the interpreter lock, one file per endpoint) for a look at where the time goes. The last line weighs
the reads as ``make load`` sends them: ``load-cpu: a read of the mix T ms (portal P, postgres G, driver D), a
submit S ms (+W ms in the workers)``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


class CpuMeter:
    """CPU seconds used so far by each group of processes of one deployment (see the module docstring)."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    def sample(self) -> dict[str, Any]:
        out: dict[str, Any] = {"portal": 0.0, "rest": 0.0}
        out["by_process"] = self.deployment.cpu_seconds()
        for name, cpu_s in out["by_process"].items():
            out["portal" if name.startswith(("daphne", "uvicorn")) else "rest"] += cpu_s
        out["pg_by_pid"] = postgres_backends_cpu_s()
        out["driver"] = time.process_time()
        return out

    @staticmethod
    def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
        """CPU seconds per group between two samples."""
        return {"portal": after["portal"] - before["portal"], "pg": cpu_used_s(before["pg_by_pid"], after["pg_by_pid"]),
                "driver": after["driver"] - before["driver"], "rest": after["rest"] - before["rest"]}


def _send(bases: list[str], clients: int, total: int, prepare: Callable[[loaddriver.Http, int], None],
          request: Callable[[loaddriver.Http, int], loaddriver.Answer], ok_status: int) -> tuple[int, int, float]:
    """``total`` requests from ``clients`` closed-loop threads (no think time): (sent, errors, wall seconds)."""
    counter = iter(range(total))
    lock = threading.Lock()
    errors = [0]
    sample: list[str] = []

    def work(i: int) -> None:
        http = loaddriver.Http(bases[i % len(bases)])
        prepare(http, i)
        try:
            while True:
                with lock:
                    n = next(counter, None)
                if n is None:
                    return
                ans = request(http, n)
                if ans.status != ok_status:
                    with lock:
                        errors[0] += 1
                        if not sample:
                            sample.append(f"{ans.status} {ans.error or ans.body[:200]!r}")
        finally:
            http.close()

    wall_s = loaddriver._run_threads([lambda i=i: work(i) for i in range(clients)])
    if sample:
        print(f"    first error: {sample[0]}", flush=True)
    return total, errors[0], wall_s


def _py_spy(pids: list[int], out: Path, duration_s: int) -> list[subprocess.Popen[bytes]]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return [subprocess.Popen([spy, "record", "-p", str(pid), "-d", str(duration_s), "-r", "200", "-f", "raw", "--gil",
                              "-o", str(out.with_suffix(f".{pid}.txt")), "--nonblocking"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in pids]


def run(requests: int, clients: int, daphnes: int, agents: int, workdir: Path, only: str | None,
        profile: Path | None, settings: dict[str, str], settle_s: float = 10.0) -> int:
    rows: list[tuple[str, int, int, float, dict[str, float]]] = []
    with own_postgres() as database_url, own_redis() as redis_url:
        deployment = Deployment(workdir, {**production_env(database_url, redis_url), **settings})
        try:
            deployment.prepare()
            deployment.manage("seed_history", "--past-only")
            deployment.start_production(daphne_processes=daphnes)
            if agents:
                deployment.start_agents(agents)
            meter = CpuMeter(deployment)
            sessions = loaddriver.read_sessions(deployment.base_url, CREDENTIALS)
            tokens = loaddriver.submit_tokens(deployment.base_url, CREDENTIALS)
            bases = deployment.base_urls
            daphne_pids = [p.popen.pid for p in deployment.procs if p.name.startswith("daphne")]
            # Warm every read once (imports, templates, the dashboard's shared snapshot).
            for listed in sessions.values():
                for _kind, template in listed[0].paths():
                    http = loaddriver.Http(bases[0])
                    http.headers.update(listed[0].api_headers)
                    http.cookies.update(listed[0].web_cookies)
                    http.get(template.format(job=(listed[0].job_ids or [0])[0], node=(listed[0].node_ids or [0])[0]))
                    http.close()
            idle_s = 8.0
            before = meter.sample()
            time.sleep(idle_s)
            background = {k: v / idle_s for k, v in meter.delta(before, meter.sample()).items()}
            background["driver"] = 0.0
            print("background (cores): " + ", ".join(f"{k} {v:.3f}" for k, v in background.items()), flush=True)
            print(f"{'read':58s} {'n':>5s} {'err':>4s} {'req/s':>6s} | CPU ms per request: {'portal':>7s} "
                  f"{'pg':>6s} {'driver':>7s} {'rest':>6s} {'total':>7s}", flush=True)

            def measure(label: str, prepare: Callable[[loaddriver.Http, int], None],
                        request: Callable[[loaddriver.Http, int], loaddriver.Answer], ok_status: int = 200,
                        settle_s: float = 0.0) -> None:
                if only and only not in label:
                    return
                spies = _py_spy(daphne_pids, profile / label.replace("/", "_").replace(" ", "_"), 3600) \
                    if profile else []
                before = meter.sample()
                sent, errors, send_s = _send(bases, clients, requests, prepare, request, ok_status)
                time.sleep(settle_s)  # the work the requests queued (placements) is done in this window too
                used = meter.delta(before, meter.sample())
                wall_s = send_s + settle_s
                for spy in spies:
                    spy.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
                for spy in spies:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        spy.wait(10)
                per_ms = {k: max(0.0, used[k] - background[k] * wall_s) / sent * 1000.0 for k in used}
                if ok_status == 201:  # a write: where "rest" went (the workers it queued work for, the agents)
                    after = meter.sample()["by_process"]
                    print("    rest by process (ms per request, background included): " + ", ".join(
                        f"{name} {1000 * (cpu_s - before['by_process'].get(name, 0.0)) / sent:.1f}"
                        for name, cpu_s in sorted(after.items()) if not name.startswith(("daphne", "uvicorn"))),
                        flush=True)
                per_ms["total"] = per_ms["portal"] + per_ms["pg"] + per_ms["driver"]
                rows.append((label, sent, errors, sent / send_s, per_ms))
                print(f"{label:58s} {sent:5d} {errors:4d} {sent / send_s:6.1f} | {'':20s}{per_ms['portal']:7.1f} "
                      f"{per_ms['pg']:6.1f} {per_ms['driver']:7.1f} {per_ms['rest']:6.1f} {per_ms['total']:7.1f}",
                      flush=True)

            for role, listed in sessions.items():
                session = listed[0]
                for kind, template in session.paths():
                    def prepare(http: loaddriver.Http, i: int, s: loaddriver._Session = session) -> None:
                        http.headers.update(s.api_headers)
                        http.cookies.update(s.web_cookies)

                    def request(http: loaddriver.Http, n: int, s: loaddriver._Session = session,
                                t: str = template) -> loaddriver.Answer:
                        ids_job, ids_node = s.job_ids or [0], s.node_ids or [0]
                        path = t.format(job=ids_job[n % len(ids_job)], node=ids_node[n % len(ids_node)])
                        return http.get(path)

                    measure(f"{role} {kind} {template}", prepare, request)
            run_tag = uuid.uuid4().hex[:6]

            def prepare_submit(http: loaddriver.Http, i: int) -> None:
                http.headers.update(tokens[i % len(tokens)])

            def submit(http: loaddriver.Http, n: int) -> loaddriver.Answer:
                payload = {"name": f"cpu-{run_tag}-{n}", "gpu_count": 1, "expected_runtime_s": 60.0,
                           "ckpt_bytes_estimate": 4096, "command": loaddriver.JOB_COMMAND, "loss_budget_s": 10.0,
                           "restart_s": 1.0}
                return http.post_json("/api/jobs/", payload, {"Idempotency-Key": str(uuid.uuid4())})

            measure("researcher POST /api/jobs/", prepare_submit, submit, ok_status=201, settle_s=settle_s)
            deployment.check_alive()
        finally:
            deployment.stop_all()
    reads = [r for r in rows if "POST" not in r[0]]
    if reads:
        keys = ("portal", "pg", "driver", "total")
        mean = {k: sum(r[4][k] for r in reads) / len(reads) for k in keys}
        print(f"mean over the {len(reads)} reads (each read weighted alike): portal {mean['portal']:.1f} ms, pg "
              f"{mean['pg']:.1f} ms, driver {mean['driver']:.1f} ms, total {mean['total']:.1f} ms per request")
        # As make load sends them: a third of the clients per role, each read of a role equally likely.
        by_role: dict[str, list[dict[str, float]]] = {}
        for label, *_, per_ms in reads:
            by_role.setdefault(label.split()[0], []).append(per_ms)
        mix = {k: sum(sum(r[k] for r in v) / len(v) for v in by_role.values()) / len(by_role) for k in keys}
        submit = next((r[4] for r in rows if "POST" in r[0]), None)
        print(f"load-cpu: a read of the mix {mix['total']:.1f} ms (portal {mix['portal']:.1f}, postgres "
              f"{mix['pg']:.1f}, driver {mix['driver']:.1f})"
              + (f", a submit {submit['total']:.1f} ms (+{submit['rest']:.1f} ms in the workers)" if submit else ""))
    errors = deployment.errors()
    if errors:
        print(errors)
    return 1 if any(r[2] for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per endpoint")
    parser.add_argument("--clients", type=int, default=4, help="concurrent closed-loop clients, no think time")
    parser.add_argument("--daphnes", type=int, default=1)
    parser.add_argument("--agents", type=int, default=6)
    parser.add_argument("--only", default=None, help="only the endpoints whose label contains this")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy raw stacks of daphne into this folder")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment setting of the portal's processes")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds after the last submit counted with it (the placements it queued)")
    parser.add_argument("--keep", action="store_true", help="keep the logs' directory")
    args = parser.parse_args(argv)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-cpu-"))
    try:
        return run(args.requests, args.clients, args.daphnes, args.agents, workdir, args.only, args.profile,
                   dict(item.split("=", 1) for item in args.set), args.settle)
    finally:
        if args.keep:
            print(f"logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
