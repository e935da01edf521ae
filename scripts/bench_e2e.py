"""End-to-end benchmark on loopback (design §1, §6 downtime and coordinator latency).

1. Downtime of scheduled and emergency reclaims, split into decision (request → P2/P3 decided), checkpoint
   (→ final checkpoint written; 0 for emergency), transfer (→ checkpoint verified on the destination) and
   restart (→ the destination agent started the job), with three agents and the numpy trainer.
2. Control-plane latency from a reclaim request to the agent acting on it (it receives the kill-switch), p50
   and p99, with 500 simulated agents connected from one asyncio process of their own (heartbeating and acknowledging every
   command meanwhile, as the agent does: tests/e2e/simagents.py), in 3 runs: each run's p50/p99 and the hops
   of its path (request, outbox relay, worker, delivery), the spread, and the worst p99 in the last line.

Runs on its own database (``reclaimnet_bench``, recreated) and Redis database 4. The last line combines the
end-to-end test outcomes (``reports/e2e_results.json``, written by tests/e2e) with these measurements:
``e2e: scheduled PASS|FAIL, emergency PASS|FAIL, sigkill PASS|FAIL, control p99 X ms, multiportal PASS|FAIL``
(X: the worst run's; multiportal: tests/e2e/test_multiportal.py, two daphnes and two workers, design §18), after
a line listing the three runs' p99.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "e2e"))

import harness  # noqa: E402
from simagents import RecordingAgents  # noqa: E402

BENCH_DB = "reclaimnet_bench"
ACT_TIMEOUT_S = 10.0


def _setup_django(database_url: str, redis_url: str) -> None:
    import psycopg

    admin = database_url.rsplit("/", 1)[0].replace("postgres://", "postgresql://") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {BENCH_DB}")
    os.environ.update(DATABASE_URL=database_url, REDIS_URL=redis_url, RECLAIMNET_TESTING="1",
                      DJANGO_SETTINGS_MODULE="portal.settings", LOG_LEVEL="WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _breakdown(job_id: int) -> dict[str, float] | None:
    from portal.control.models import MigrationWork

    work = MigrationWork.objects.filter(migration__job_id=job_id, phase="done").order_by("-resumed_at").first()
    if work is None or work.resumed_at is None or work.decided_at is None or work.transferred_at is None:
        return None
    ckpt_end = work.checkpointed_at or work.decided_at
    return {
        "decision_s": (work.decided_at - work.requested_at).total_seconds(),
        "checkpoint_s": (ckpt_end - work.decided_at).total_seconds(),
        "transfer_s": (work.transferred_at - ckpt_end).total_seconds(),
        "restart_s": (work.resumed_at - work.transferred_at).total_seconds(),
        "total_s": (work.resumed_at - work.requested_at).total_seconds(),
    }


def downtime_trials(st: harness.Stack, trials: int) -> dict[str, list[dict[str, float]]]:
    """Scheduled (20 s notice) and emergency reclaims of a running trainer; each trial lends the node again."""
    from portal.core.models import Checkpoint, Job, Node
    from portal.core.services.jobs import cancel_job
    from portal.core.services.nodes import lend_again
    from portal.core.services.reclaims import request_reclaim

    out: dict[str, list[dict[str, float]]] = {"scheduled": [], "emergency": []}
    for kind in ("scheduled", "emergency"):
        for k in range(trials):
            job_id = harness.submit_training_job(f"bench-{kind}-{k}", 2000, 0.03, 1_000_000)
            harness.wait_for(lambda j=job_id: Job.objects.get(pk=j).state == "running", 30, what="running")
            job = Job.objects.get(pk=job_id)
            node = job.placements.get(ended_at__isnull=True).node
            harness.wait_for(lambda j=job: Checkpoint.objects.filter(job=j).exclude(replica_nodes=None).exists(), 30,
                             what="pre-synced checkpoint")
            request_reclaim(node, None, 20.0 if kind == "scheduled" else 0.0)
            try:
                result = harness.wait_for(lambda j=job_id: _breakdown(j), 40, what=f"{kind} resume")
                out[kind].append(result)
            except TimeoutError as exc:
                print(f"  {kind} trial {k}: {exc}", flush=True)
            cancel_job(Job.objects.get(pk=job_id), None)
            harness.wait_for(lambda n=node.pk: Node.objects.get(pk=n).state in ("reclaimed", "offline", "online"), 30)
            if Node.objects.get(pk=node.pk).state == "reclaimed":
                lend_again(Node.objects.get(pk=node.pk), None)
            harness.wait_for(lambda: Node.objects.filter(state="online").count() == 3, 30, what="nodes online")
            time.sleep(0.5)
    return out


@dataclass
class LatencyRun:
    """One run of reclaim requests: end-to-end latency per sample and its hops (ms)."""

    latencies_ms: list[float] = field(default_factory=list)
    hops_ms: dict[str, list[float]] = field(default_factory=lambda: {h: [] for h in HOPS})
    lost: int = 0


# request: request_reclaim's transaction (reclaim + outbox row) until committed; relay: commit → the outbox row
# handed to the broker (beat's relay, woken by NOTIFY); worker: → the control-queue worker wrote the kill-switch
# command (task pickup + run_reclaim up to commands.send); delivery: → the agent has it (rest of the task's
# transaction, commit, channel layer, daphne's consumer, websocket).
HOPS = ("request", "relay", "worker", "delivery")


def _run_agents(url: str, tokens: dict[int, str], arrivals: Any, stop: Any) -> None:
    """The simulated agents' process: report each first arrival of a command kind on ``arrivals``."""
    sims = RecordingAgents(url, tokens, stagger_s=0.01, on_arrival=lambda n, k, t: arrivals.put((n, k, t)))
    sims.start()
    stop.wait()
    sims.stop()


class RemoteAgents:
    """RecordingAgents in a process of their own, as agents are other machines: 500 agents' heartbeats and
    acks must not share this process's interpreter lock with the reclaim requests being timed."""

    def __init__(self, url: str, tokens: dict[int, str]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.arrived: dict[tuple[int, str], float] = {}
        self._arrivals = ctx.Queue()
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_run_agents, args=(url, tokens, self._arrivals, self._stop), daemon=True)
        self._reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        while True:
            item = self._arrivals.get()
            if item is None:
                return
            node_id, kind, at = item
            self.arrived.setdefault((node_id, kind), at)

    def start(self) -> None:
        self._proc.start()
        self._reader.start()

    def stop(self) -> None:
        self._stop.set()
        self._proc.join(30)
        if self._proc.is_alive():
            self._proc.terminate()  # our own child
        self._arrivals.put(None)
        self._reader.join(5)


def _hops(samples: list[tuple[int, int, float, float, float]], arrived: dict[tuple[int, str], float]) -> \
        dict[str, list[float]]:
    """Each sample's hops from the rows' timestamps (one clock: every process runs on this machine)."""
    from portal.control.models import AgentCommand
    from portal.core.models import OutboxMessage
    from portal.core.outbox import Task

    reclaim_ids = [r for _, r, _, _, _ in samples]
    relayed = {int(m.args[0]): m.sent_at for m in OutboxMessage.objects.filter(task_name=Task.RUN_RECLAIM)
               if m.args and m.args[0] in reclaim_ids and m.sent_at is not None}
    written = {c.payload.get("reclaim_id"): c.created_at for c in AgentCommand.objects.filter(kind="killswitch")}
    out: dict[str, list[float]] = {h: [] for h in HOPS}
    for node_id, reclaim_id, t0, committed, _ in samples:
        if reclaim_id not in relayed or reclaim_id not in written or (node_id, "killswitch") not in arrived:
            continue
        marks = [t0, committed, relayed[reclaim_id].timestamp(), written[reclaim_id].timestamp(),
                 arrived[(node_id, "killswitch")]]
        for hop, a, b in zip(HOPS, marks, marks[1:], strict=False):
            out[hop].append((b - a) * 1000)
    return out


def worst_line(run: LatencyRun, count: int = 3) -> str:
    """The slowest samples with their hops: where the tail comes from."""
    n = len(run.hops_ms[HOPS[0]])
    totals = [sum(run.hops_ms[h][k] for h in HOPS) for k in range(n)]
    worst = sorted(range(n), key=lambda k: -totals[k])[:count]
    return "; ".join(f"{totals[k]:.0f} = " + " + ".join(f"{h} {run.hops_ms[h][k]:.0f}" for h in HOPS)
                     for k in worst)


def control_latency(st: harness.Stack, n_agents: int, samples: int, runs: int) -> list[LatencyRun]:
    """Reclaim-request → agent-acting latency (ms) with ``n_agents`` simulated agents connected (they ack every
    command and heartbeat as the agent does): ``runs`` runs of ``samples`` emergency reclaims, each on a node of
    its own."""
    from portal.core.models import Node
    from portal.core.services.reclaims import request_reclaim

    nodes = harness.make_campus([(f"sim-{i:04d}", "ABCD"[i % 4]) for i in range(n_agents)], gpus_per_node=1)
    sims = RemoteAgents(st.portal_ws, {pk: tok for pk, tok in nodes.values()})
    sims.start()
    names = sorted(nodes)
    out: list[LatencyRun] = []
    try:
        harness.wait_for(lambda: Node.objects.filter(name__startswith="sim-", state="online").count() == n_agents,
                         240, interval_s=0.5, what=f"{n_agents} simulated agents online")
        print(f"  {n_agents} simulated agents online; {runs} runs of {samples} reclaims", flush=True)
        time.sleep(5.0)  # let the control tick absorb the new nodes (estimates) before sampling
        for run in range(runs):
            result = LatencyRun()
            taken: list[tuple[int, int, float, float, float]] = []
            for name in names[run * samples:(run + 1) * samples]:
                node_id = nodes[name][0]
                node = Node.objects.get(pk=node_id)
                t0 = time.time()
                event = request_reclaim(node, None, 0.0)
                committed = time.time()
                try:
                    harness.wait_for(lambda n=node_id: (n, "killswitch") in sims.arrived, ACT_TIMEOUT_S,
                                     interval_s=0.001, what="agent acting")
                    acted = sims.arrived[(node_id, "killswitch")]
                    result.latencies_ms.append((acted - t0) * 1000)
                except TimeoutError:  # counted at the timeout, not dropped: a lost command must show in the p99
                    print(f"  no kill-switch seen by {name} within {ACT_TIMEOUT_S:.0f} s", flush=True)
                    result.latencies_ms.append(ACT_TIMEOUT_S * 1000)
                    result.lost += 1
                    acted = float("nan")
                taken.append((node_id, event.pk, t0, committed, acted))
                time.sleep(0.05)
            result.hops_ms = _hops(taken, sims.arrived)
            out.append(result)
            print(f"  run {run + 1}: {run_line(result)} (load average {os.getloadavg()[0]:.2f})", flush=True)
            print(f"    slowest (ms): {worst_line(result)}", flush=True)
            time.sleep(2.0)
        return out
    finally:
        sims.stop()


def run_line(run: LatencyRun) -> str:
    hops = " | ".join(f"{h} p50 {pct(v, 50):.1f} p99 {pct(v, 99):.1f}" for h, v in run.hops_ms.items())
    return (f"{len(run.latencies_ms)} samples: p50 {pct(run.latencies_ms, 50):.1f} ms, p99 "
            f"{pct(run.latencies_ms, 99):.1f} ms, max {max(run.latencies_ms, default=float('nan')):.1f} ms"
            f"{f', {run.lost} lost' if run.lost else ''}; hops (ms): {hops}")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summary_line(results_path: Path, downtime: dict[str, list[dict[str, float]]], p99_ms: float,
                 trials: int) -> tuple[str, bool]:
    try:
        outcomes: dict[str, str] = json.loads(results_path.read_text())
    except (OSError, ValueError):
        outcomes = {}

    def verdict(words: tuple[str, ...], bench_key: str | None) -> str:
        picked = [v for k, v in outcomes.items() if any(w in k for w in words)]
        ok = bool(picked) and all(v == "PASS" for v in picked)
        if bench_key is not None:
            ok = ok and len(downtime.get(bench_key, [])) == trials
        return "PASS" if ok else "FAIL"

    scheduled = verdict(("scheduled", "short_notice", "corrupt"), "scheduled")
    emergency = verdict(("emergency",), "emergency")
    sigkill = verdict(("sigkill",), None)
    multiportal = verdict(("multiportal",), None)
    line = (f"e2e: scheduled {scheduled}, emergency {emergency}, sigkill {sigkill}, control p99 {p99_ms:.1f} ms, "
            f"multiportal {multiportal}")
    return line, "FAIL" not in line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--samples", type=int, default=100, help="reclaims per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--results", default=str(REPO / "reports" / "e2e_results.json"))
    args = parser.parse_args(argv)

    base = os.environ.get("DATABASE_URL", "postgres://reclaimnet@127.0.0.1:5432/reclaimnet")
    database_url = base.rsplit("/", 1)[0] + f"/{BENCH_DB}"
    redis_url = harness.redis_db(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), 4)
    _setup_django(database_url, redis_url)
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-bench-"))

    print("bench: downtime of scheduled and emergency reclaims (3 agents, loopback)", flush=True)
    st = harness.Stack(workdir / "a", database_url, redis_url)
    st.flush_redis()
    nodes = harness.make_campus([("bench-a1", "A"), ("bench-a2", "A"), ("bench-b1", "B")])
    downtime: dict[str, list[dict[str, float]]] = {}
    try:
        st.start_portal()
        st.start_worker()
        for name, (_, token) in nodes.items():
            st.start_agent(name, token)
        from portal.core.models import Node

        harness.wait_for(lambda: Node.objects.filter(state="online").count() == 3, 30, what="agents online")
        downtime = downtime_trials(st, args.trials)
    finally:
        st.stop_all()
    for kind, rows in downtime.items():
        if not rows:
            print(f"  {kind:9s}: no successful trial", flush=True)
            continue
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"  {kind:9s} (median of {len(rows)}): decision {med['decision_s'] * 1000:7.1f} ms | checkpoint "
              f"{med['checkpoint_s'] * 1000:7.1f} ms | transfer {med['transfer_s'] * 1000:7.1f} ms | restart "
              f"{med['restart_s'] * 1000:7.1f} ms | total {med['total_s']:.3f} s", flush=True)

    print(f"bench: control-plane latency, reclaim request -> agent acting, {args.agents} simulated agents",
          flush=True)
    st2 = harness.Stack(workdir / "b", database_url, redis_url, heartbeat_interval_s=5.0,
                        heartbeat_timeout_s=600.0, control_period_s=2.0)
    st2.flush_redis()
    runs: list[LatencyRun] = []
    try:
        st2.start_portal()
        st2.start_worker("control", beat=False, extra_args=("-Q", "control"))
        st2.start_worker("others", beat=False, extra_args=("-Q", "tick,placement,housekeeping,default"))
        st2.start_beat()
        runs = control_latency(st2, args.agents, args.samples, args.runs)
    finally:
        st2.stop_all()
    p50s = [pct(r.latencies_ms, 50) for r in runs]
    p99s = [pct(r.latencies_ms, 99) for r in runs]
    p99 = max(p99s, default=float("nan"))
    print(f"  spread over {len(runs)} runs: p50 {min(p50s, default=float('nan')):.1f}-"
          f"{max(p50s, default=float('nan')):.1f} ms, p99 {min(p99s, default=float('nan')):.1f}-{p99:.1f} ms",
          flush=True)
    print("control p99 of each run: " + ", ".join(f"{v:.1f} ms" for v in p99s), flush=True)
    if not os.environ.get("RECLAIMNET_E2E_KEEP"):
        shutil.rmtree(workdir, ignore_errors=True)
    line, ok = summary_line(Path(args.results), downtime, p99, args.trials)
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
