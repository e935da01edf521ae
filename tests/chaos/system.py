"""The system under chaos: its processes, its jobs and the checks run after every fault (`make chaos`).

Django must be configured (``DATABASE_URL`` of the private cluster) before this module is imported:
scripts/chaos.py does that, then imports it. Every process is started here and signalled by its PID only.

After a fault, ``ChaosSystem.settle`` waits (bounded by ``SETTLE_S``) until nothing is in flight, then
``ChaosSystem.evaluate`` counts, with no human step:

- **stuck**: whatever is still in flight when the bound ran out — a job ``migrating``, a migration in an
  unfinished phase, a reclaim ``requested`` or ``planned``, a transfer ``issued``, an outbox row due more than
  ``OUTBOX_GRACE_S`` ago and not handed over, a job ``running`` with no step executed for
  ``GHOST_S``, a migration recorded as resumed with no step executed since, a node ``offline`` although its
  agent runs, a system process that exited.
- **lost**: rows present before the fault and gone after it, jobs ``failed`` during it, completed jobs whose
  final weights differ from an uninterrupted run, and rows a 2xx answer promised that do not exist.
- **duplicated**: a job with two open placements or running in two processes at once (step ledger), a node
  with two open reclaims, a row created twice for one request.
- **misrecorded**: migrations whose recorded resume step or ``work_lost_s`` disagree with the work actually
  redone (tests/chaos/ledger.py defines the measure).

A fault is survived when all four are zero and its own checks passed; one check applies to every fault: no
node whose agent ran throughout (was neither killed nor cut off by the fault) may be declared lost.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.db import InterfaceError, OperationalError, connection
from django.db.models import Count
from django.utils import timezone
from rest_framework.authtoken.models import Token

from portal.control.models import MigrationWork, ReclaimWork, Transfer
from portal.core.models import (
    Checkpoint,
    Gpu,
    Job,
    Migration,
    Node,
    OutboxMessage,
    Placement,
    Provider,
    ReclaimEvent,
    ResearchGroup,
)
from portal.core.services.nodes import lend_again
from tests.chaos.ledger import Ledger, MigrationRecord, attribute, median_step_s, overlaps, reconcile, redos
from tests.e2e import harness

NODES = [("chaos-a1", "A"), ("chaos-a2", "A"), ("chaos-b1", "B"), ("chaos-b2", "B"), ("chaos-c1", "C"),
         ("chaos-c2", "C")]
HOSTILE_NODE = ("chaos-hostile", "C")  # registered, never run by an agent: the hostile client uses its token
# Registered with BURST_GPUS GPUs and never connected (a machine still being set up): the 200-submit burst asks
# for that many, so its jobs are valid (a request no registered node could ever run is refused) and stay queued.
PARKED_NODE = ("chaos-parked", "B")
BURST_GPUS = 8  # at most what a standard job may borrow (portal/control/ladder.py), more than any running node has
GPUS_PER_NODE = 2
STEPS = 3000
STEP_SLEEP_S = 0.05
PAD_BYTES = 200_000
RUNNING_TARGET = 4  # training jobs kept running while faults are injected
HEARTBEAT_TIMEOUT_S = 10.0
SETTLE_S = 150.0  # bound on waiting for the system to settle after a fault
OUTBOX_GRACE_S = 30.0
GHOST_S = 20.0
TRACKED = (Job, ReclaimEvent, Migration, Checkpoint, Placement, Transfer, Node, Gpu)
UNFINISHED_MIGRATION = ("checkpointing", "waiting", "transferring", "starting")


def retry_db(fn: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """Run ``fn``; on a dropped database connection (a PostgreSQL restart) reconnect and try again."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except (OperationalError, InterfaceError):
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@dataclass
class FaultResult:
    name: str
    stuck: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    misrecorded: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # fault-specific checks that failed
    notes: list[str] = field(default_factory=list)  # measurements, for the report
    may_lose: set[str] = field(default_factory=set)  # nodes the fault itself took away (agent killed or cut)
    settle_s: float = 0.0

    @property
    def survived(self) -> bool:
        return not (self.stuck or self.lost or self.duplicated or self.misrecorded or self.failures)

    def lines(self) -> list[str]:
        head = (f"chaos: {self.name}: {'SURVIVED' if self.survived else 'FAILED'} (settled in {self.settle_s:.0f} s; "
                f"stuck {len(self.stuck)}, lost {len(self.lost)}, duplicated {len(self.duplicated)}, "
                f"misrecorded {len(self.misrecorded)}, failed checks {len(self.failures)})")
        out = [head]
        for label, items in (("stuck", self.stuck), ("lost", self.lost), ("duplicated", self.duplicated),
                             ("misrecorded", self.misrecorded), ("check failed", self.failures),
                             ("note", self.notes)):
            out += [f"    {label}: {item}" for item in items]
        return out


@dataclass
class Snapshot:
    ids: dict[str, set[int]]
    failed_jobs: set[int]
    completed_jobs: set[int]
    reclaim_max: int
    t: float


class ChaosSystem:
    """A private PostgreSQL, a private Redis, daphne, a prefork Celery worker (concurrency 2), beat, six agents
    and training jobs whose every step is recorded in a ledger."""

    def __init__(self, workdir: Path, pg: harness.PrivatePostgres, redis: harness.PrivateRedis) -> None:
        self.workdir = workdir
        self.pg = pg
        self.redis = redis
        # Short periods, a generous timeout: 2 cores shared with other work must not make a busy agent "lost".
        self.stack = harness.Stack(workdir, pg.url, redis.url, heartbeat_interval_s=1.0,
                                   heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, control_period_s=1.0)
        self.ledger = Ledger(workdir / "ledger.jsonl")
        self.nodes: dict[str, tuple[int, str]] = {}
        self.links: dict[str, harness.CuttableLink] = {}  # each agent reaches the portal through its own
        self.tokens: dict[str, str] = {}
        self.reference_sha = ""
        self.seen_mismatches: set[tuple[int, int | None, str]] = set()
        self.seen_overlaps: set[tuple[str, str]] = set()
        self.job_serial = 0

    # --- the processes ------------------------------------------------------------------------------------
    def boot(self) -> None:
        self.nodes = harness.make_campus([*NODES, HOSTILE_NODE], gpus_per_node=GPUS_PER_NODE)
        self.nodes.update(harness.make_campus([PARKED_NODE], gpus_per_node=BURST_GPUS))
        group, _ = ResearchGroup.objects.get_or_create(slug="e2e-group", defaults={"name": "E2E Group"})
        users = get_user_model().objects
        researcher, _ = users.get_or_create(username="chaos-researcher")
        group.members.add(researcher)
        provider, _ = users.get_or_create(username="chaos-provider")
        Provider.objects.get(slug="e2e-lab").members.add(provider)
        admin, _ = users.get_or_create(username="chaos-admin", defaults={"is_staff": True, "is_superuser": True})
        self.tokens = {u.username.removeprefix("chaos-"): Token.objects.get_or_create(user=u)[0].key
                       for u in (researcher, provider, admin)}
        self.reference_sha = harness.reference_weights(STEPS, PAD_BYTES, self.workdir / "reference")
        self.stack.start_portal()
        self.links = {name: harness.CuttableLink(self.stack.port) for name, _ in NODES}
        self.start_worker()
        self.stack.start_beat()
        for name, _ in NODES:
            self.start_agent(name)
        harness.wait_for(lambda: self.online_count() == len(NODES), 60, what="six agents online")

    def start_worker(self) -> harness.Proc:
        return self.stack.start_worker("worker", beat=False, pool="prefork", concurrency=2)

    def start_agent(self, name: str) -> harness.Proc:
        return self.stack.start_agent(name, self.nodes[name][1], gpus=GPUS_PER_NODE, via=self.links[name])

    def agent(self, name: str) -> harness.Proc:
        return self.stack.procs[f"agent-{name}"]

    def online_count(self) -> int:
        return int(retry_db(lambda: Node.objects.filter(name__in=[n for n, _ in NODES], state="online").count()))

    def restart_dead(self, result: FaultResult) -> None:
        """A process that exited is a failure of the fault it exited in; a supervisor would start it again, so
        the harness does, to go on with the next fault."""
        for name, proc in list(self.stack.procs.items()):
            if proc.alive():
                continue
            result.failures.append(f"{name} exited (code {proc.popen.returncode}); its log ends:\n"
                                   + _indent(proc.tail(15)))
            if name == "daphne":
                self.stack.start_portal()
            elif name == "worker":
                self.start_worker()
            elif name == "beat":
                self.stack.start_beat()
            elif name.startswith("agent-"):
                self.start_agent(name.removeprefix("agent-"))

    # --- HTTP -----------------------------------------------------------------------------------------------
    def http(self, method: str, path: str, role: str, body: Any = None, headers: dict[str, str] | None = None,
             timeout_s: float = 60.0) -> tuple[int, Any, dict[str, str]]:
        """One request as ``role`` (researcher, provider, admin): (status, parsed body or text, headers)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.stack.port}{path}", data=data, method=method,
            headers={"Authorization": f"Token {self.tokens[role]}", "Content-Type": "application/json",
                     **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                status, raw, hdrs = int(response.status), response.read(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            status, raw, hdrs = int(exc.code), exc.read(), dict(exc.headers or {})
        except (OSError, urllib.error.URLError) as exc:
            return 0, f"{type(exc).__name__}: {exc}", {}
        try:
            return status, json.loads(raw), hdrs
        except ValueError:
            return status, raw[:300].decode(errors="replace"), hdrs

    # --- jobs -----------------------------------------------------------------------------------------------
    def live_jobs(self) -> list[Job]:
        return list(Job.objects.filter(name__startswith="chaos-train-").exclude(
            state__in=("completed", "failed", "cancelled")))

    def top_up(self, timeout_s: float = 120.0) -> None:
        """Keep ``RUNNING_TARGET`` training jobs running, each with a checkpoint copied off its node."""
        def submit() -> None:
            for _ in range(RUNNING_TARGET - len(self.live_jobs())):
                self.job_serial += 1
                harness.submit_training_job(f"chaos-train-{self.job_serial}", STEPS, STEP_SLEEP_S, PAD_BYTES,
                                            ledger=self.ledger.path)

        retry_db(submit)

        def ready() -> bool:
            running = [j for j in self.live_jobs() if j.state == "running"]
            synced = sum(1 for j in running
                         if Checkpoint.objects.filter(job=j).exclude(replica_nodes=None).exists())
            return len(running) >= RUNNING_TARGET and synced >= RUNNING_TARGET

        harness.wait_for(lambda: retry_db(ready), timeout_s, interval_s=0.5,
                         what=f"{RUNNING_TARGET} jobs running with a pre-synced checkpoint")

    def running_job_node(self, exclude: tuple[str, ...] = ()) -> tuple[Job, Node]:
        """A running job with a pre-synced replica and its node (one of the agents' nodes)."""
        for job in Job.objects.filter(name__startswith="chaos-train-", state="running").order_by("pk"):
            placement = Placement.objects.filter(job=job, ended_at__isnull=True).select_related("node").first()
            if placement is None or placement.node.name in exclude or placement.node.name == HOSTILE_NODE[0]:
                continue
            if Checkpoint.objects.filter(job=job).exclude(replica_nodes=None).exists():
                return job, placement.node
        raise RuntimeError("no running job with a pre-synced checkpoint")

    # --- before and after a fault --------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        def take() -> Snapshot:
            return Snapshot(
                ids={m.__name__: set(m.objects.values_list("pk", flat=True)) for m in TRACKED},
                failed_jobs=set(Job.objects.filter(state="failed").values_list("pk", flat=True)),
                completed_jobs=set(Job.objects.filter(state="completed").values_list("pk", flat=True)),
                reclaim_max=max([0, *ReclaimEvent.objects.values_list("pk", flat=True)]), t=time.time())

        return retry_db(take)

    def inflight(self) -> list[str]:
        """What is still moving (or stuck): see the module docstring."""
        now = timezone.now()
        out = [f"job {j.pk} ({j.name}) migrating" for j in Job.objects.filter(state="migrating")]
        for w in MigrationWork.objects.filter(phase__in=UNFINISHED_MIGRATION).select_related("migration"):
            out.append(f"migration {w.migration_id} of job {w.migration.job_id} in phase {w.phase} since "
                       f"{w.phase_entered_at:%H:%M:%S} (deadline {_hms(w.phase_deadline_at)}, attempts "
                       f"{w.phase_attempts}, detail {w.detail!r})")
        for w in ReclaimWork.objects.filter(phase__in=("requested", "planned")).select_related("reclaim"):
            out.append(f"reclaim {w.reclaim_id} of node {w.reclaim.node_id} ({w.reclaim.kind}) {w.phase} since "
                       f"{_hms(w.phase_entered_at)} (deadline {_hms(w.phase_deadline_at)}, reclaim deadline "
                       f"{_hms(w.reclaim.deadline_at)})")
        for r in ReclaimEvent.objects.filter(finished_at__isnull=True, work__isnull=True):
            out.append(f"reclaim {r.pk} of node {r.node_id} ({r.kind}) unfinished with no work row")
        for t in Transfer.objects.filter(state="issued"):
            out.append(f"transfer {t.pk} ({t.purpose}) of job {t.job_id} issued at {_hms(t.created_at)} "
                       f"(expires {_hms(t.expires_at)}, attempts {t.attempts}, errors {t.errors[-2:]})")
        due = now - dt.timedelta(seconds=OUTBOX_GRACE_S)
        for m in OutboxMessage.objects.filter(sent_at__isnull=True, available_at__lt=due)[:20]:
            out.append(f"outbox row {m.pk} {m.task_name}{tuple(m.args)} due {_hms(m.available_at)} not handed "
                       f"over (attempts {m.attempts})")
        self.ledger.refresh()
        runs = self.ledger.runs()
        for job in Job.objects.filter(state="running", name__startswith="chaos-train-"):
            placement = Placement.objects.filter(job=job, ended_at__isnull=True).first()
            if placement is None:
                out.append(f"job {job.pk} running with no open placement")
                continue
            if (now - placement.started_at).total_seconds() < GHOST_S:
                continue
            last = max([r.last_t for r in runs.get(job.pk, [])], default=0.0)
            if time.time() - last > GHOST_S:
                out.append(f"job {job.pk} 'running' on node {placement.node_id} but no step executed for "
                           f"{time.time() - last:.0f} s")
        for mismatch in self.mismatches(runs):  # "done" comes with job_started, before the first step
            if mismatch.kind == "no-run" and mismatch.key not in self.seen_mismatches:
                out.append(f"migration {mismatch.migration} of job {mismatch.job} started, no step executed yet")
        for name, _ in NODES:
            node = Node.objects.get(name=name)
            if node.state == "offline" and self.agent(name).alive():
                out.append(f"node {name} offline although its agent runs")
        out += [f"{name} exited" for name, p in self.stack.procs.items() if not p.alive()]
        return out

    def lend_reclaimed(self) -> None:
        """The provider lends a node again once its reclaim is over (part of the scenario, not a repair)."""
        for node in Node.objects.filter(name__in=[n for n, _ in NODES], state="reclaimed"):
            if not ReclaimEvent.objects.filter(node=node, finished_at__isnull=True).exists():
                lend_again(node, None)

    def settle(self, result: FaultResult, started: float) -> None:
        """Wait until nothing is in flight (bounded); whatever still is, is stuck."""
        deadline = time.monotonic() + SETTLE_S
        pending: list[str] = []
        while time.monotonic() < deadline:
            pending = retry_db(self.inflight)
            retry_db(self.lend_reclaimed)
            if not pending:
                break
            time.sleep(1.0)
        result.settle_s = time.time() - started
        result.stuck += pending

    def evaluate(self, result: FaultResult, before: Snapshot) -> None:
        retry_db(lambda: self._evaluate(result, before))

    def _evaluate(self, result: FaultResult, before: Snapshot) -> None:
        for model in TRACKED:
            now_ids = set(model.objects.values_list("pk", flat=True))
            gone = sorted(before.ids[model.__name__] - now_ids)
            if gone:
                result.lost.append(f"{model.__name__} rows {gone[:10]} existed before the fault and are gone")
        for job in Job.objects.filter(state="failed").exclude(pk__in=before.failed_jobs):
            result.lost.append(f"job {job.pk} ({job.name}) failed: {job.failure_reason}")
        for job in Job.objects.filter(state="completed", name__startswith="chaos-train-").exclude(
                pk__in=before.completed_jobs).select_related("runtime"):
            sha = getattr(getattr(job, "runtime", None), "result_sha256", "")
            if sha != self.reference_sha:
                result.lost.append(f"job {job.pk} completed with weights {sha[:12]!r}, an uninterrupted run "
                                   f"gives {self.reference_sha[:12]!r}")
        for row in (Placement.objects.filter(ended_at__isnull=True).values("job").annotate(n=Count("pk"))
                    .filter(n__gt=1)):
            result.duplicated.append(f"job {row['job']} has {row['n']} open placements")
        for row in (ReclaimEvent.objects.filter(finished_at__isnull=True).values("node").annotate(n=Count("pk"))
                    .filter(n__gt=1)):
            result.duplicated.append(f"node {row['node']} has {row['n']} open reclaims")
        self.ledger.refresh()
        runs = self.ledger.runs()
        for job, job_runs in runs.items():
            for a, b, common_s in overlaps(job_runs):
                if (a.run, b.run) not in self.seen_overlaps:
                    self.seen_overlaps.add((a.run, b.run))
                    result.duplicated.append(
                        f"job {job} executed on {a.node} (steps {a.steps[0][0]}..{a.steps[-1][0]}) and on {b.node} "
                        f"(steps {b.steps[0][0]}..{b.steps[-1][0]}) at once for {common_s:.1f} s"
                        f"{' (still)' if time.time() - min(a.last_t, b.last_t) < 3 else ''}")
        for mismatch in self.mismatches(runs):
            if mismatch.key not in self.seen_mismatches:
                self.seen_mismatches.add(mismatch.key)
                result.misrecorded.append(f"job {mismatch.job}, migration {mismatch.migration}: {mismatch.what}")
        for reclaim in ReclaimEvent.objects.filter(pk__gt=before.reclaim_max, kind="heartbeat_lost").exclude(
                node__name__in=result.may_lose).select_related("node"):
            result.failures.append(f"node {reclaim.node.name} declared lost (reclaim {reclaim.pk}) though its agent "
                                   f"ran throughout (restarts and load are not node failures)")
        for reclaim in ReclaimEvent.objects.filter(pk__gt=before.reclaim_max).select_related("node"):
            result.notes.append(f"reclaim {reclaim.pk} of {reclaim.node.name}: {reclaim.kind}, requested "
                                f"{_hms(reclaim.requested_at)}, outcome {reclaim.outcome} {reclaim.outcome_detail!r}")
        migrations = Migration.objects.filter(started_at__gte=_aware(before.t))
        redone = self.redone_by_migration(runs)
        for mig in migrations.select_related("work", "checkpoint"):
            actual = redone.get(mig.pk)
            result.notes.append(
                f"migration {mig.pk} of job {mig.job_id}: {mig.mode}{'/' + mig.degraded_reason if mig.degraded_reason else ''}"
                f" node {mig.source_id} -> {mig.destination_id}, success {mig.success}, resumed step "
                f"{mig.checkpoint.step if mig.checkpoint else 0}, work_lost_s {mig.work_lost_s:.1f}"
                + (f" (ledger: {actual[1]} steps, {actual[0]:.1f} s redone)" if actual else "")
                + f", phase {getattr(getattr(mig, 'work', None), 'phase', '?')}")

    def redone_by_migration(self, runs: dict[int, Any]) -> dict[int, tuple[float, int]]:
        """{migration pk: (seconds, steps) its runs actually redid, per the ledger}, for the notes."""
        out: dict[int, tuple[float, int]] = {}
        by_job = self.migration_records()
        for job, job_runs in runs.items():
            for pk, mine in attribute(by_job.get(job, []), redos(job_runs)).items():
                if pk is not None:
                    out[pk] = (sum(r.redone_s for r in mine), sum(r.redone_steps for r in mine))
        return out

    def migration_records(self) -> dict[int, list[MigrationRecord]]:
        by_job: dict[int, list[MigrationRecord]] = {}
        for mig in Migration.objects.filter(job__name__startswith="chaos-train-").select_related(
                "work", "checkpoint", "destination"):
            by_job.setdefault(mig.job_id, []).append(MigrationRecord(
                mig.pk, mig.job_id, mig.started_at.timestamp(), mig.checkpoint.step if mig.checkpoint else None,
                float(mig.work_lost_s), getattr(getattr(mig, "work", None), "phase", "") == "done",
                mig.destination.name if mig.destination else ""))
        return by_job

    def mismatches(self, runs: dict[int, Any]) -> list[Any]:
        """Every job's migrations against its ledger (tests/chaos/ledger.py)."""
        out = []
        by_job = self.migration_records()
        for job, job_runs in runs.items():
            out += reconcile(by_job.get(job, []), redos(job_runs), median_step_s(job_runs))
        return out

    def heartbeat_lost_since(self, before: Snapshot, names: tuple[str, ...] = ()) -> list[ReclaimEvent]:
        qs = ReclaimEvent.objects.filter(pk__gt=before.reclaim_max, kind="heartbeat_lost")
        if names:
            qs = qs.filter(node__name__in=names)
        return list(qs.select_related("node"))

    def non_finite_floats(self) -> list[str]:
        """Every float column of every table holding NaN or ±Infinity (agents are untrusted input)."""
        out = []
        with connection.cursor() as cur:
            cur.execute("SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = "
                        "'public' AND data_type IN ('double precision', 'real', 'numeric')")
            for table, column in cur.fetchall():
                cur.execute(f'SELECT count(*) FROM "{table}" WHERE "{column}" IN '  # names from the catalogue
                            "('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)")
                n = cur.fetchone()[0]
                if n:
                    out.append(f"{table}.{column}: {n} non-finite value(s)")
        return out

    def stop(self) -> None:
        self.stack.stop_all()
        for link in self.links.values():
            link.close()


def kill_agent(proc: harness.Proc, sig: int = signal.SIGKILL) -> None:
    proc.signal(sig)
    if sig == signal.SIGKILL:
        proc.popen.wait(10)


def _hms(value: Any) -> str:
    return f"{value:%H:%M:%S}" if value is not None else "none"


def _aware(epoch_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC)


def _indent(text: str) -> str:
    return "\n".join("      " + line for line in text.splitlines())
