"""The faults of `make chaos`, injected one at a time into a running ``ChaosSystem``.

Each fault function injects its fault and runs the checks only it needs (appending to ``result.failures``,
``result.lost``, ``result.duplicated``); the checks every fault gets (stuck, lost, duplicated, misrecorded)
run after it, in scripts/chaos.py. No check assumes a command or report is lost or delivered once: they look
at the outcome (rows, the step ledger), which stays valid when the agent link becomes reliable.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from portal.control.models import AgentSession, MigrationWork, ReclaimWork, Transfer
from portal.core.models import Gpu, Job, Migration, Node, ReclaimEvent
from portal.core.services.jobs import cancel_job
from tests.chaos.system import BURST_GPUS, HOSTILE_NODE, NODES, ChaosSystem, FaultResult, Snapshot, retry_db
from tests.e2e import harness

RECLAIM_NOTICE_S = 12.0
BURST = 200
FLOOD = 1000


def _reclaim(sys_: ChaosSystem, node: Node, notice_s: float, key: str | None = None) -> tuple[int, Any]:
    headers = {"Idempotency-Key": key} if key else None
    status, body, _ = sys_.http("POST", f"/api/nodes/{node.pk}/reclaim/", "provider", {"notice_s": notice_s},
                                headers=headers)
    return status, body


def _reclaim_finished(result: FaultResult, reclaim_id: int, timeout_s: float = 120.0) -> None:
    try:
        harness.wait_for(lambda: retry_db(lambda: ReclaimEvent.objects.get(pk=reclaim_id).finished_at), timeout_s,
                         interval_s=0.5, what=f"reclaim {reclaim_id} finished")
    except TimeoutError as exc:
        work = retry_db(lambda: ReclaimWork.objects.filter(reclaim_id=reclaim_id).first())
        result.failures.append(f"{exc} (phase {getattr(work, 'phase', None)})")


def _job_resumed(result: FaultResult, job: Job, source: Node, timeout_s: float = 120.0) -> None:
    """The job runs on another node (or has finished) after leaving ``source``."""
    def resumed() -> bool:
        j = Job.objects.get(pk=job.pk)
        if j.state in ("completed", "cancelled"):
            return True
        return j.state == "running" and j.placements.filter(ended_at__isnull=True).exclude(node=source).exists()

    try:
        harness.wait_for(lambda: retry_db(resumed), timeout_s, interval_s=0.5, what=f"job {job.pk} resumed")
    except TimeoutError as exc:
        j = retry_db(lambda: Job.objects.get(pk=job.pk))
        result.failures.append(f"{exc}: state {j.state}")


def worker_sigkill(sys_: ChaosSystem, result: FaultResult, before: Snapshot) -> None:
    """SIGKILL the prefork worker (its pool children first) as soon as a scheduled reclaim has started moving a
    job, then start a new worker after 3 s (a supervisor's restart): the interrupted steps must be redone."""
    sys_.top_up()
    job, node = sys_.running_job_node()
    status, body = _reclaim(sys_, node, RECLAIM_NOTICE_S)
    if status != 201:
        result.failures.append(f"reclaim request answered {status}: {body}")
        return
    reclaim_id = int(body["id"])
    try:
        harness.wait_for(lambda: MigrationWork.objects.filter(migration__reclaim_id=reclaim_id).exists()
                         or ReclaimWork.objects.filter(reclaim_id=reclaim_id).exclude(phase="requested").exists(),
                         30, interval_s=0.02, what="the reclaim under way")
    except TimeoutError as exc:
        result.notes.append(f"{exc}: killed the worker anyway")
    phase = ReclaimWork.objects.filter(reclaim_id=reclaim_id).values_list("phase", flat=True).first()
    worker = sys_.stack.procs["worker"]
    children = worker.children()
    worker.kill_tree(signal.SIGKILL)
    result.notes.append(f"worker {worker.popen.pid} and pool {children} SIGKILLed with reclaim {reclaim_id} in "
                        f"phase {phase}")
    time.sleep(3.0)
    sys_.start_worker()
    _reclaim_finished(result, reclaim_id)
    _job_resumed(result, job, node)


def _restart_under_reclaim(sys_: ChaosSystem, result: FaultResult, restart: Any, what: str) -> bool:
    """Request a scheduled reclaim, restart a server (down 3 s) with it under way, and check that every process
    is still alive and the reclaim finished with its job resumed elsewhere. False if the request was refused."""
    sys_.top_up()
    job, node = sys_.running_job_node()
    status, body = _reclaim(sys_, node, RECLAIM_NOTICE_S)
    if status != 201:
        result.failures.append(f"reclaim request answered {status}: {body}")
        return False
    restart(down_s=3.0)
    time.sleep(5.0)
    for name in ("worker", "beat", "daphne"):
        if not sys_.stack.procs[name].alive():
            result.failures.append(f"{name} exited after the {what} restart:\n{sys_.stack.procs[name].tail(12)}")
    _reclaim_finished(result, int(body["id"]))
    _job_resumed(result, job, node)
    return True


def redis_restart(sys_: ChaosSystem, result: FaultResult, before: Snapshot) -> None:
    """Restart the broker and channel layer (down 3 s) just after a scheduled reclaim was requested; nothing is
    restarted by hand: the worker, beat and daphne must reconnect."""
    _restart_under_reclaim(sys_, result, sys_.redis.restart, "Redis")


def postgres_restart(sys_: ChaosSystem, result: FaultResult, before: Snapshot) -> None:
    """Restart the private PostgreSQL cluster (fast shutdown, down 3 s) with a scheduled reclaim under way."""
    if not _restart_under_reclaim(sys_, result, sys_.pg.restart, "PostgreSQL"):
        return
    status, _, _ = sys_.http("GET", "/api/jobs/?limit=5", "researcher")
    if status != 200:
        result.failures.append(f"GET /api/jobs/ answered {status} after the PostgreSQL restart")


def daphne_restart(sys_: ChaosSystem, result: FaultResult, before: Snapshot) -> None:
    """SIGTERM daphne (it must exit within 10 s), start it again on the same port; every agent reconnects (a
    session opened and greeted after the restart: a restart does not take nodes offline, so "online" alone would
    be true before any agent is back)."""
    sys_.top_up()
    daphne = sys_.stack.procs["daphne"]
    stopped_at = timezone.now()
    t0 = time.monotonic()
    daphne.signal(signal.SIGTERM)
    try:
        daphne.popen.wait(10)
        result.notes.append(f"daphne exited {time.monotonic() - t0:.1f} s after SIGTERM")
    except Exception:
        result.failures.append("daphne still running 10 s after SIGTERM (killed)")
        daphne.signal(signal.SIGKILL)
        daphne.popen.wait(10)
    sys_.stack.start_portal()

    def reconnected() -> int:
        return AgentSession.objects.filter(node__name__in=[n for n, _ in NODES], connected_at__gt=stopped_at,
                                           closed_at__isnull=True, data_port__isnull=False
                                           ).values("node").distinct().count()

    try:
        harness.wait_for(lambda: retry_db(reconnected) == len(NODES) and sys_.online_count() == len(NODES), 60,
                         interval_s=0.5, what="every agent reconnected and online")
        result.notes.append(f"all {len(NODES)} agents reconnected {time.monotonic() - t0:.1f} s after the SIGTERM")
    except TimeoutError as exc:
        result.failures.append(f"{exc}: {retry_db(reconnected)} of {len(NODES)} reconnected")


def agent_sigkill(sys_: ChaosSystem, result: FaultResult, before: Snapshot) -> None:
    """SIGKILL an agent running a job (its job dies with it: PR_SET_PDEATHSIG), start it again 3 s later, as a
    supervisor would: the portal must learn from the agent's hello that the job is gone (the heartbeat timeout
    has not passed yet) and run it again, from its freshest checkpoint."""
    sys_.top_up()
    job, node = sys_.running_job_node()
    proc = sys_.agent(node.name)
    result.may_lose.add(node.name)
    killed_t = time.time()
    proc.signal(signal.SIGKILL)
    proc.popen.wait(10)
    time.sleep(3.0)
    sys_.start_agent(node.name)
    _job_progressing(result, sys_, job, killed_t)
    lost = sys_.heartbeat_lost_since(before, (node.name,))
    result.notes.append(f"{node.name} SIGKILLed and restarted after 3 s; heartbeat_lost reclaims {[r.pk for r in lost]}")


def _job_progressing(result: FaultResult, sys_: ChaosSystem, job: Job, since_t: float,
                     timeout_s: float = 120.0) -> None:
    """A run of the job started after ``since_t`` executes steps (or the job has finished)."""
    def progressing() -> bool:
        if retry_db(lambda: Job.objects.get(pk=job.pk).state) in ("completed", "cancelled"):
            return True
        sys_.ledger.refresh()
        return any(r.start_t > since_t and r.steps for r in sys_.ledger.runs().get(job.pk, []))

    try:
        harness.wait_for(progressing, timeout_s, interval_s=0.5, what=f"job {job.pk} running again")
    except TimeoutError as exc:
        j = retry_db(lambda: Job.objects.get(pk=job.pk))
        result.failures.append(f"{exc}: state {j.state}")


def agent_cut(sys_: ChaosSystem, result: FaultResult, before: Snapshot) -> None:
    """Cut an agent off from the portal for 30 s, then heal the cut (harness.CuttableLink: the relay between
    them stops moving bytes and holds new connections silent, closing nothing — a partition as both ends see
    it, while the agent and its job run on, as on a node cut off from the campus). The portal may give the node
    up and resume its job elsewhere; the job must then not run on both nodes (the step ledger shows it)."""
    sys_.top_up()
    job, node = sys_.running_job_node()
    link = sys_.links[node.name]
    result.may_lose.add(node.name)
    link.cut()
    time.sleep(30.0)
    link.heal()
    lost = sys_.heartbeat_lost_since(before, (node.name,))
    result.notes.append(f"{node.name} cut off 30 s: heartbeat_lost reclaims {[r.pk for r in lost]}")
    _job_progressing(result, sys_, job, time.time() - 30.0)
    time.sleep(10.0)  # the healed link's backlog and the portal's answer to it


def corrupt_transfer(sys_: ChaosSystem, result: FaultResult, before: Snapshot) -> None:
    """The migration copy is corrupted once and cut once (harness.inject_faults), under a scheduled reclaim."""
    sys_.top_up()
    job, node = sys_.running_job_node()
    sys_.stack.inject_faults(node.name, corrupt=1, truncate=1, classes=("migration",))
    status, body = _reclaim(sys_, node, 20.0)
    if status != 201:
        result.failures.append(f"reclaim request answered {status}: {body}")
        return
    _reclaim_finished(result, int(body["id"]))
    _job_resumed(result, job, node)
    # The node is released once its jobs are off it; their copies and restarts may still be finishing.
    try:
        harness.wait_for(lambda: retry_db(lambda: not Migration.objects.filter(
            reclaim_id=int(body["id"]), finished_at__isnull=True).exists()), 120, interval_s=0.5,
            what="every migration of the reclaim finished")
    except TimeoutError as exc:
        result.failures.append(str(exc))
    migrations = list(Migration.objects.filter(reclaim_id=int(body["id"])))  # every job on the node
    if not migrations:
        result.failures.append("no migration recorded for the reclaim")
        return
    transfers = list(Transfer.objects.filter(migration__in=migrations))
    errors = [e for t in transfers for e in (t.errors or [])]
    result.notes.append(f"migrations {[(m.pk, m.mode, m.success) for m in migrations]}; transfers "
                        f"{[(t.migration_id, t.state, t.attempts) for t in transfers]}; errors {errors[:4]}")
    if not any("sha256" in e for e in errors):
        result.failures.append("the corrupted copy was not reported as a sha256 mismatch")
    result.failures += [f"migration {m.pk} did not succeed" for m in migrations if not m.success]


def reclaim_5x(sys_: ChaosSystem, result: FaultResult, before: Snapshot) -> None:
    """The same reclaim sent 5× at once over HTTP: with one Idempotency-Key (all answers the first one, one
    reclaim), then with none (one 201, the others refused, one reclaim)."""
    sys_.top_up()
    _, node_a = sys_.running_job_node()
    _, node_b = sys_.running_job_node(exclude=(node_a.name,))
    for node, key in ((node_a, str(uuid.uuid4())), (node_b, None)):
        barrier = threading.Barrier(5)

        def send(_: int, node: Node = node, key: str | None = key, barrier: threading.Barrier = barrier) -> Any:
            barrier.wait(10)
            return _reclaim(sys_, node, RECLAIM_NOTICE_S, key)

        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(send, range(5)))
        statuses = Counter(s for s, _ in answers)
        created = ReclaimEvent.objects.filter(node=node, pk__gt=before.reclaim_max).count()
        label = f"{node.name} ({'one key' if key else 'no key'})"
        result.notes.append(f"{label}: answers {dict(statuses)}, reclaims created {created}")
        if any(s >= 500 or s == 0 for s in statuses):
            result.failures.append(f"{label}: server errors {dict(statuses)}")
        if created > 1:
            result.duplicated.append(f"{label}: {created} reclaims from one request sent 5×")
        if created == 0:
            result.lost.append(f"{label}: no reclaim although answers were {dict(statuses)}")
        if key:
            ids = {b.get("id") for s, b in answers if s == 201 and isinstance(b, dict)}
            if statuses.get(201) != 5 or len(ids) != 1:
                result.failures.append(f"{label}: expected 5 identical 201 answers, got {dict(statuses)} ids {ids}")
        elif statuses.get(201) != 1:
            result.failures.append(f"{label}: expected one 201 and four refusals, got {dict(statuses)}")
    for reclaim in ReclaimEvent.objects.filter(pk__gt=before.reclaim_max):
        _reclaim_finished(result, reclaim.pk)


def submit_200(sys_: ChaosSystem, result: FaultResult, before: Snapshot) -> None:
    """200 concurrent job submits as a researcher with a token, each with its own Idempotency-Key; refused ones
    (503 + Retry-After) are retried with the same key, as a client would. Every job answered 2xx must exist
    exactly once. The burst jobs ask BURST_GPUS (only a registered node that never connects has them): they are
    valid, stay queued and are cancelled after."""
    barrier = threading.Barrier(BURST)
    first: list[int] = [0] * BURST
    final: list[int] = [0] * BURST
    errors: Counter[str] = Counter()  # what the failed attempts answered (0: no HTTP answer at all)
    refused: Counter[str] = Counter()  # what the refused ones (4xx) answered

    def submit(i: int) -> None:
        key = str(uuid.uuid4())
        body = {"name": f"chaos-burst-{i}", "gpu_count": BURST_GPUS, "expected_runtime_s": 60,
                "ckpt_bytes_estimate": 4096, "command": harness.training_command(10, 0.0, 0)}
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(30)
        for attempt in range(6):
            status, answer, headers = sys_.http("POST", "/api/jobs/", "researcher", body,
                                                headers={"Idempotency-Key": key}, timeout_s=120)
            if status == 0 or status >= 500:
                errors[f"{status} {str(answer)[:120]}"] += 1
            elif not 200 <= status < 300:
                refused[f"{status} {str(answer)[:160]}"] += 1
            if attempt == 0:
                first[i] = status
            final[i] = status
            if 200 <= status < 300 or status in (400, 403, 404):
                return
            time.sleep(min(10.0, float(headers.get("Retry-After", "1") or 1)))

    t0 = time.monotonic()
    with ThreadPoolExecutor(BURST) as pool:
        list(pool.map(submit, range(BURST)))
    result.notes.append(f"{BURST} submits in {time.monotonic() - t0:.1f} s: first answers {dict(Counter(first))}, "
                        f"after retries {dict(Counter(final))}")
    if any((s >= 500 and s != 503) or s == 0 for s in first):
        result.failures.append(f"server errors among the first answers: {dict(Counter(first))}; "
                               f"{dict(errors.most_common(4))}")
    elif errors:
        result.notes.append(f"refusals: {dict(errors.most_common(4))}")
    if any(not 200 <= s < 300 for s in final):
        result.failures.append(f"submits not accepted after retries: {dict(Counter(final))}; "
                               f"{dict(refused.most_common(2))}")
    rows = Counter(retry_db(lambda: list(Job.objects.filter(name__startswith="chaos-burst-")
                                         .values_list("name", flat=True))))
    for i in range(BURST):
        name = f"chaos-burst-{i}"
        if 200 <= final[i] < 300 and rows[name] == 0:
            result.lost.append(f"{name} answered {final[i]} but does not exist")
        if rows[name] > 1:
            result.duplicated.append(f"{name} exists {rows[name]} times")
    researcher = get_user_model().objects.get(username="chaos-researcher")
    for job in Job.objects.filter(name__startswith="chaos-burst-", state="queued"):
        cancel_job(job, researcher)


def hostile_agent(sys_: ChaosSystem, result: FaultResult, before: Snapshot) -> None:
    """A websocket client with a real node token says hello with an Infinity VRAM and GPUs never registered,
    beats with NaN and Infinity, then floods 1,000 messages as fast as it can, then sends garbage. The API must
    keep answering, nothing non-finite or unregistered may be stored, the flood must be limited (dropped,
    warned or disconnected) and the other agents stay online."""
    name = HOSTILE_NODE[0]
    node_id, token = sys_.nodes[name]
    registered = list(Gpu.objects.filter(node_id=node_id).values_list("index", "model", "vram_gb"))
    url = sys_.stack.portal_ws
    hello = {"type": "hello", "agent_version": "hostile", "data_host": "127.0.0.1", "data_port": 9,
             "edge_backend": "noop", "jobs": [],
             "gpus": [{"index": 0, "model": "RTX 3090", "uuid": "h-0", "vram_gb": float("inf"), "capability": 8.6,
                       "driver_version": "x", "cuda_version": "x"},
                      {"index": 7, "model": "H100", "uuid": "h-7", "vram_gb": 80, "capability": 9.0,
                       "driver_version": "x", "cuda_version": "x"}]}
    beat = {"type": "heartbeat", "seq": 1, "gpu_util": [float("nan")], "jobs": [],
            "egress": {"mean_bytes_per_s": float("nan"), "peak_bytes_per_s": float("inf")}}
    received: list[str] = []
    sent = 0
    close = "open"
    try:
        with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=30,
                     close_timeout=5, max_size=2**22) as ws:
            ws.send(json.dumps(hello))
            received += _drain(ws, 2.0)
            ws.send(json.dumps(beat))
            ws.send(json.dumps({**beat, "seq": 2, "egress": {"mean_bytes_per_s": float("-inf")}}))
            received += _drain(ws, 1.0)
            t0 = time.monotonic()
            for seq in range(FLOOD):
                ws.send(json.dumps({**beat, "seq": 3 + seq, "egress": {"mean_bytes_per_s": 1e6}}))
                sent += 1
            result.notes.append(f"flood: {sent} messages sent in {time.monotonic() - t0:.2f} s")
            received += _drain(ws, 5.0)
            ws.send("{not json")
            ws.send(json.dumps({"type": "no-such-type", "x": [1] * 1000}))
            received += _drain(ws, 8.0)
    except ConnectionClosed as exc:
        close = f"closed by the portal: code {exc.rcvd.code if exc.rcvd else None} " \
                f"{exc.rcvd.reason if exc.rcvd else ''!r} after {sent} flood messages"
    except (InvalidStatus, OSError, TimeoutError) as exc:
        close = f"{type(exc).__name__}: {exc}"
    kinds = Counter(_kind(m) for m in received)
    result.notes.append(f"hostile agent: {close}; received {dict(kinds)}")
    warned = any(k in ("warning", "throttle", "error", "rate_limited") for k in kinds)
    if close == "open" and not warned:
        result.failures.append(
            f"a flood of {FLOOD} messages was neither limited nor warned about (no close, no warning)"
            + ("; nothing at all was answered after the welcome, not even the refusal of a non-JSON frame "
               "(the session's messages were not being handled)" if set(kinds) <= {"welcome"} else ""))
    for role in ("researcher", "provider", "admin"):
        status, body, _ = sys_.http("GET", "/api/nodes/", role)
        if status != 200:
            result.failures.append(f"GET /api/nodes/ as {role} answered {status}: {str(body)[:200]}")
    stored = list(Gpu.objects.filter(node_id=node_id).values_list("index", "model", "vram_gb"))
    if stored != registered:
        result.failures.append(f"{name}'s GPUs changed from the registered {registered} to {stored}")
    result.failures += [f"stored: {item}" for item in sys_.non_finite_floats()]
    offline = list(Node.objects.filter(name__in=[n for n, _ in NODES]).exclude(state="online")
                   .values_list("name", "state"))
    if offline:
        result.failures.append(f"other nodes not online after the hostile agent: {offline}")


def _drain(ws: Any, seconds: float) -> list[str]:
    out: list[str] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            out.append(str(ws.recv(timeout=left)))
        except TimeoutError:
            break
    return out


def _kind(message: str) -> str:
    try:
        return str(json.loads(message).get("type", "?"))
    except (ValueError, AttributeError):
        return "?"


FAULTS: dict[str, Callable[[ChaosSystem, FaultResult, Snapshot], None]] = {
    "worker_sigkill": worker_sigkill,
    "redis_restart": redis_restart,
    "postgres_restart": postgres_restart,
    "daphne_restart": daphne_restart,
    "agent_sigkill": agent_sigkill,
    "agent_cut": agent_cut,
    "corrupt_transfer": corrupt_transfer,
    "reclaim_5x": reclaim_5x,
    "submit_200": submit_200,
    "hostile_agent": hostile_agent,
}
BOUNDED = ("worker_sigkill", "redis_restart", "hostile_agent")
