"""The node agent: websocket to the portal, heartbeats, job runner, checkpoint data plane (design §1-§4).

Messages are JSON objects with a ``type``; the portal's side of the protocol is ``portal/control/link/protocol.py``.
Nothing is lost on the link (design §9.9):

- reports that must not be lost (checkpoint done, job started/exited, job output, transfer results, kill-switch
  engaged, checkpoints dropped) carry a ``msg_id`` and stay in :attr:`Agent.pending` until the portal answers
  ``received``: they are sent again after every reconnect and every :data:`RESEND_S` while connected;
  heartbeats are not kept;
- every command is acknowledged (``ack``, the ids of commands arriving together in one message); one whose
  ``cmd_id`` was seen already (the portal re-sends until the
  ack arrives) is acked again and not executed twice, and one older than the newest of its subject
  (``supersede_key``/``issued_us``) is not executed at all;
- the hello lists the checkpoints the agent holds, and a checkpoint that disappears (pruned by the job,
  dropped on request, found corrupt) is reported, so the portal never restores from a copy that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import re
import signal
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection, connect

from nodeagent import jobkit
from nodeagent.agent_checkpoints import CheckpointCommands
from nodeagent.classbytes import ClassBytes
from nodeagent.config import AgentConfig, ConfigError
from nodeagent.confine import Confiner
from nodeagent.edge import Edge
from nodeagent.ended import ended_runs, last_progress
from nodeagent.inventory import GpuInfo, gpu_state_field, inventory, job_utilisation, utilisation_source
from nodeagent.output import OutputShipper
from nodeagent.results import ResultsUploader, http_base
from nodeagent.runner import RunningJob, start_job
from nodeagent.telemetry import EgressSampler, tx_total_bytes
from nodeagent.transfer import Faults, Receiver, SendControl, store_dir

MAX_REPORTED_SECONDS = 7 * 86400.0  # the portal refuses a checkpoint_done with a longer stall_s or write_s
MAX_PAUSES = 16  # a job_exited's ``paused`` lists a run's newest pauses, at most this many (the portal refuses more)
log = logging.getLogger("nodeagent")

AGENT_VERSION = "0.1.0"
AUTH_CLOSE_CODES = {4401, 4403}  # the portal refused the token: retrying will not help
RESEND_S = 5.0  # an unanswered reliable report is sent again this often while connected
RESEND_PACE_S = 0.1  # between re-sent reports: 10 a second, well inside the portal's 20 a second per agent
MAX_PENDING = 10_000  # reliable reports kept unanswered (the oldest is dropped beyond, with a warning)
PENDING_MAX_AGE_S = 86_400.0  # a report unanswered for a day is given up (the portal keeps its ids a day)
SEEN_COMMANDS = 4096  # command ids remembered to refuse duplicates
ACK_DELAY_S = 0.02  # acks of commands arriving together go in one message (a burst stays under the rate limit)
ACKS_PER_MESSAGE = 256
HELD_SCAN_EVERY = 10  # watch-loop passes (100 ms each) between scans of the checkpoints held
RESTORE_FAILED = "restore checkpoint missing or corrupt"  # the reason the portal recognises
QUICK_RECONNECT_S = 15.0  # the first seconds of an outage (a portal restart): reconnect attempts stay quick
QUICK_RECONNECT_MAX_S = 1.0  # ... at most this far apart (full jitter from reconnect_min_s)
HEALTHY_SESSION_S = 5.0  # a session that lasted this long ended an outage: the next one starts quick again


def next_portal_index(index: int, count: int) -> int:
    """The portal address to try after the one at ``index`` failed or its session ended: the next in the
    configured list, wrapping round (design §18: a portal of several daphne processes; one URL: always 0)."""
    return (index + 1) % count if count > 0 else 0


def reconnect_delay_s(outage_s: float, slow_attempts: int, min_s: float, max_s: float, rand: float) -> float:
    """The wait before the next connection attempt (full jitter, ``rand`` in [0, 1)).

    For the first QUICK_RECONNECT_S of an outage: uniform in [min_s, QUICK_RECONNECT_MAX_S], so a restarted
    portal sees its agents back within about a second and not all at once. Then exponential backoff with
    full jitter, the cap doubling per attempt up to ``max_s`` (the portal's reconnect grace covers ``max_s``,
    design §9.10)."""
    quick_cap_s = min(max_s, max(min_s, QUICK_RECONNECT_MAX_S))
    cap_s = quick_cap_s if outage_s < QUICK_RECONNECT_S else min(max_s, quick_cap_s * 2.0 ** slow_attempts)
    return min_s + rand * max(0.0, cap_s - min_s)
HEX64 = re.compile(r"^[0-9a-f]{64}$")  # a sha256 the portal accepts (a job writes its own manifests)


def bounded_put(memory: OrderedDict[str, Any], key: str, value: Any, limit: int) -> None:
    """Remember ``key`` → ``value`` as the newest entry, forgetting the oldest beyond ``limit``."""
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > limit:
        memory.popitem(last=False)


def held_checkpoints(data_dir: Path) -> dict[str, dict[int, jobkit.Manifest]]:
    """The checkpoints this agent holds (its jobs' and the replicas it received), by job id and sequence."""
    out: dict[str, dict[int, jobkit.Manifest]] = {}
    root = data_dir / "ckpt"
    if not root.is_dir():
        return out
    for job_dir in sorted(root.iterdir()):
        manifests = jobkit.list_manifests(job_dir) if job_dir.is_dir() else []
        if manifests:
            out[job_dir.name] = {m.sequence: m for m in manifests}
    return out


class Agent(CheckpointCommands):
    """One node's agent. :meth:`run` loops forever: connect, serve the session, back off, reconnect."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.gpus: list[GpuInfo] = []
        self.jobs: dict[str, RunningJob] = {}
        # msg_id → [report, monotonic time it was last sent (-inf: never)], oldest first
        self.pending: OrderedDict[str, list[Any]] = OrderedDict()
        self.seen_commands: OrderedDict[str, None] = OrderedDict()
        self.newest_issued: OrderedDict[str, int] = OrderedDict()  # supersede key → newest issued_us executed
        self.held: dict[str, dict[int, str]] = {}  # job id → {sequence: sha256} last known on disk
        self.flushing = False  # True from a welcome until the unanswered reports were sent again
        self._acks: list[str] = []  # command ids to acknowledge in the next ack message
        self._ack_task: asyncio.Task[None] | None = None
        self.ws: ClientConnection | None = None
        self.node_id: int | None = None
        self.heartbeat_interval_s = config.heartbeat_interval_s
        self.edge = Edge(config.iface, config.enforcement, config.link_capacity_bytes_per_s)
        self.egress = EgressSampler(config.iface)
        # design §4 "Calibrated reserve": bytes per traffic class on the access link (and a trunk it sees)
        self.class_bytes = ClassBytes(tx_total_bytes, getattr(config, "trunk_iface", None))
        self.receiver = Receiver(self.data_dir, self._on_received, self._on_rejected)
        self.faults = Faults(self.data_dir / "faults.json")
        self.sending: dict[str, SendControl] = {}  # transfer id → live rate knobs (set_rate)
        self.data_addr: tuple[str, int] = ("", 0)
        self.killswitch = False
        self._deadline_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._seq = 0
        self._passes = 0
        self.stopping = asyncio.Event()
        self.auth_refused = False
        # Fencing (design §9.10): the right to run the jobs lasts while the portal hears this agent.
        self.clock = time.monotonic
        self.fence_s: float | None = None  # fraction × the portal's heartbeat timeout (None: an older portal)
        self.heard_at = -float("inf")  # when the newest message the portal answered was sent (hello, heartbeat)
        self.fenced = False  # the jobs are paused (SIGSTOP) until a welcome says which are still ours
        # When each running job was paused and resumed ([start, end], unix time, end None while paused), reported
        # with its job_exited: time the job did not run is not work lost (design §9.9).
        self.wall = time.time
        self.pauses: dict[str, list[list[float | None]]] = {}
        self._beats_sent: OrderedDict[str, float] = OrderedDict()  # heartbeat seq → when it was sent
        self._hello_sent_at = -float("inf")  # when a hello was last sent again on a live connection
        self.report_ended = True  # until the first welcome: the hello lists the runs a predecessor left (§9.9)
        self.output = OutputShipper()  # the jobs' stdout+stderr, batched to the portal (design §9.11)
        # The jobs' output directories and final checkpoints, uploaded over HTTP in the background (design §14).
        self.results = ResultsUploader(self.data_dir, config.portal, config.token, faults=self.faults)
        self.portal_index = 0  # into config.portal_urls: the address the next connection attempt uses
        # Confined jobs (design §19): cgroup backend and job users, decided once; a predecessor's leftovers go.
        self.confiner = Confiner.from_config(config, self.data_dir)
        unconfined = self.confiner.unconfined_reasons()
        if unconfined and not config.allow_unconfined_jobs:
            raise ConfigError("allow_unconfined_jobs: jobs would run unconfined here: " + "; ".join(unconfined)
                              + ". Confine them (docs/add-a-node.md, design §19.6) or set allow_unconfined_jobs: "
                              "true in the agent's config (--allow-unconfined-jobs) to run them anyway")
        if unconfined:
            log.warning("confinement: jobs run unconfined (allow_unconfined_jobs is true): %s", "; ".join(unconfined))
        if config.kill_jobs_on_agent_exit:
            self.confiner.sweep()
        # Checkpoint temporaries of writers killed mid-write (a predecessor's jobs, its own received replicas)
        orphans = jobkit.remove_orphan_temporaries_under(self.data_dir / "ckpt")
        if orphans:
            log.info("removed %d orphan checkpoint temporaries: %s", sum(map(len, orphans.values())),
                     sorted(orphans)[:10])

    @property
    def portal_url(self) -> str:
        """The portal address the connect loop tries now (see :func:`next_portal_index`)."""
        return self.config.portal_urls[self.portal_index % len(self.config.portal_urls)]

    # --- lifecycle ------------------------------------------------------------------------------------------
    async def run(self) -> int:
        """Start the data server, take the inventory, then connect, reconnecting quickly at first, then with
        exponential backoff (full jitter, :func:`reconnect_delay_s`)."""
        host, port = await self.receiver.start(self.config.data_host, self.config.data_port)
        self.data_addr = (self.config.advertise_host or host, port)
        self.gpus = inventory(self.config.simulate_gpus, self.config.token[-6:])
        self.held = self._scan_held()
        log.info("data server on %s:%d, %d GPU(s) (%s), edge %s", *self.data_addr, len(self.gpus),
                 "simulated" if self.gpus and self.gpus[0].simulated else "NVML", self.edge.backend_name)
        watcher = asyncio.create_task(self._watch_loop())
        uploader = asyncio.create_task(self.results.run())  # resumes the uploads a predecessor left (§14)
        outage_started: float | None = None
        slow_attempts = 0
        try:
            while not self.stopping.is_set():
                started = time.monotonic()
                try:
                    await self._session()
                except (TimeoutError, OSError, websockets.WebSocketException) as exc:
                    log.info("portal connection ended (%s): %s", self.portal_url, exc)
                if self.auth_refused:
                    log.error("the portal refused this agent's token; not reconnecting")
                    return 3
                now = time.monotonic()
                if outage_started is None or now - started > HEALTHY_SESSION_S:
                    outage_started, slow_attempts = now, 0  # a healthy session ended: a new outage begins
                outage_s = now - outage_started
                sleep_s = reconnect_delay_s(outage_s, slow_attempts, self.config.reconnect_min_s,
                                            self.config.reconnect_max_s, random.random())
                if outage_s >= QUICK_RECONNECT_S:
                    slow_attempts += 1
                self.portal_index = next_portal_index(self.portal_index, len(self.config.portal_urls))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), sleep_s)
        finally:
            watcher.cancel()
            uploader.cancel()
            await self.receiver.close()
            self.edge.close()
            if self.config.kill_jobs_on_agent_exit:  # what the parent-death signal misses (escaped forks), §19
                for job in self.jobs.values():
                    job.signal(signal.SIGKILL)
                    job.finish()
        return 0

    async def _session(self) -> None:
        """One websocket session.

        1. Connect with the node token in the Authorization header (the portal closes 4401/4403 if refused).
        2. Send hello (inventory, data address, running jobs), wait for welcome.
        3. Send the unanswered reports again, then run the heartbeat, re-send and receive loops until the connection drops.
        """
        headers = {"Authorization": f"Bearer {self.config.token}"}
        try:
            ws = await connect(self.portal_url, additional_headers=headers, open_timeout=5,
                               max_size=self.config.max_message_bytes * 16, ping_interval=20)
        except websockets.InvalidStatus as exc:
            if exc.response.status_code in (401, 403):
                self.auth_refused = True
            raise
        self.ws = ws
        try:
            hello_sent_at = self.clock()
            await ws.send(json.dumps(self._hello()))
            welcome = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if welcome.get("type") != "welcome":
                raise websockets.ConnectionClosedError(None, None)
            self.welcomed(welcome, hello_sent_at)
            self.node_id = welcome.get("node_id")
            self.heartbeat_interval_s = float(welcome.get("heartbeat_interval_s", self.heartbeat_interval_s))
            if bool(welcome.get("killswitch")) != self.killswitch:  # the portal's view wins after a reconnect
                await self._cmd_killswitch({"engaged": bool(welcome.get("killswitch")), "stop_jobs": True})
            self.results.base = http_base(self.portal_url)  # results go to the portal this agent reached
            log.info("connected as node %s to %s", self.node_id, self.portal_url)
            self.flushing = True  # new reports queue behind the unanswered ones until those are sent again
            hb = asyncio.create_task(self._heartbeat_loop(ws))
            resender = asyncio.create_task(self._resend_loop(ws))
            try:
                async for raw in ws:
                    await self._on_message(raw)
            finally:
                hb.cancel()
                resender.cancel()
        except websockets.ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code in AUTH_CLOSE_CODES:
                self.auth_refused = True
            raise
        finally:
            self.ws = None
            with contextlib.suppress(Exception):
                await ws.close()

    def _hello(self) -> dict[str, Any]:
        """Inventory, data address, running jobs and the checkpoints held (newest first per job, at most 512)."""
        held = [{"job_id": int(j), "sequence": seq, "sha256": sha}
                for j, seqs in sorted(self.held.items()) if j.isdigit() and 0 < int(j) < 2**63
                for seq, sha in sorted(seqs.items(), reverse=True) if 0 < seq < 2**63 and HEX64.match(sha)]
        return {
            "type": "hello",
            "agent_version": AGENT_VERSION,
            "gpus": [g.as_dict() for g in self.gpus],
            "data_host": self.data_addr[0],
            "data_port": self.data_addr[1],
            "jobs": [{"job_id": int(j), "step": r.step()} for j, r in self.jobs.items() if j.isdigit()],
            "edge_backend": self.edge.backend_name,
            "confinement": self.confiner.summary(),  # how jobs run here, for the node page (design §19.6)
            "checkpoints": held[:512],
            "checkpoints_truncated": len(held) > 512,
            **self._gpu_state(),  # MIG and the GPUs' foreign processes (design §1 "Owner activity and MIG")
            # How far the jobs of a predecessor that died got: steps no heartbeat reported (nodeagent/ended.py).
            **({"ended_jobs": ended_runs(self.data_dir, self.jobs)} if self.report_ended else {}),
        }

    def _gpu_state(self) -> dict[str, Any]:
        """``{"gpu_state": …}``: each GPU's MIG layout and the processes on it that are none of the jobs' (the
        members of each job's cgroup, and its session leader with what descends from it; design §1 "Owner
        activity and MIG"), or {} with no probe."""
        try:
            return gpu_state_field(self.gpus, lambda: {pid for r in self.jobs.values() for pid in r.member_pids()})
        except Exception:  # a failing probe must never cost the hello or the heartbeat that carries it
            log.exception("GPU state probe failed; reporting none")
            return {}

    async def send(self, message: dict[str, Any], reliable: bool = True) -> None:
        """Send now if connected. A ``reliable`` report gets a ``msg_id`` and is kept until the portal answers
        ``received`` (sent again after a reconnect and every RESEND_S)."""
        now = time.monotonic()
        if reliable:
            msg_id = message.setdefault("msg_id", uuid.uuid4().hex)
            if len(self.pending) >= MAX_PENDING:
                log.warning("more than %d unanswered reports: the oldest is dropped", MAX_PENDING)
            bounded_put(self.pending, msg_id, [message, -float("inf"), now], MAX_PENDING)
        ws = self.ws
        if ws is None or (reliable and self.flushing):
            return  # sent by the re-send loop, in order
        try:
            await ws.send(json.dumps(message))
        except websockets.ConnectionClosed:
            return
        if reliable and message["msg_id"] in self.pending:
            self.pending[message["msg_id"]][1] = now

    async def _resend_pending(self, ws: ClientConnection, older_than_s: float, pace_s: float = 0.0) -> int:
        """Send again, oldest first, the reports unanswered and last sent more than ``older_than_s`` ago (also
        those queued while this pass runs), ``pace_s`` apart."""
        sent = 0
        started = time.monotonic()
        done: set[str] = set()
        while True:
            now = time.monotonic()
            due = None
            for msg_id, entry in list(self.pending.items()):
                if msg_id in done:
                    continue
                if now - entry[2] > PENDING_MAX_AGE_S:
                    log.warning("report %s %s unanswered for a day: given up", entry[0].get("type"), msg_id)
                    self.pending.pop(msg_id, None)
                    continue
                if entry[1] <= started - older_than_s or entry[1] == -float("inf"):
                    due = (msg_id, entry)
                    break
            if due is None:
                return sent
            msg_id, entry = due
            done.add(msg_id)
            await ws.send(json.dumps(entry[0]))
            entry[1] = time.monotonic()
            sent += 1
            if pace_s:
                await asyncio.sleep(pace_s)

    async def _resend_loop(self, ws: ClientConnection) -> None:
        """Right after the welcome: every unanswered report, in order, paced (new ones queue behind); then
        every RESEND_S, those still unanswered."""
        try:
            await self._resend_pending(ws, older_than_s=0.0, pace_s=RESEND_PACE_S)
        finally:
            self.flushing = False
        while True:
            await asyncio.sleep(RESEND_S)
            await self._resend_pending(ws, older_than_s=RESEND_S, pace_s=RESEND_PACE_S)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- periodic -------------------------------------------------------------------------------------------
    async def _heartbeat_loop(self, ws: ClientConnection) -> None:
        while True:
            self._seq += 1
            bounded_put(self._beats_sent, str(self._seq), self.clock(), 64)
            # Per GPU, and per job the mean over its GPUs (design §15 idle watchdog): NVML, or the simulated load.
            loads = {g: r.simulated_load() for r in self.jobs.values() for g in r.gpus}
            per_gpu = utilisation_source(self.gpus).per_gpu(self.gpus, loads)
            by_job = job_utilisation(self.gpus, per_gpu, {j: r.gpus for j, r in self.jobs.items()})
            class_bytes = self.class_bytes.report(self.edge.counters(), self.config.iface)  # design §4
            if class_bytes:  # checkpoints borrow the reserve research leaves idle (design §4 work-conserving)
                self.edge.borrow_idle_reserve(class_bytes["access"]["research"] / class_bytes["interval_s"])
            await ws.send(json.dumps({
                "type": "heartbeat",
                "seq": self._seq,
                "gpu_util": per_gpu,
                "egress": self.edge.counters() or self.egress.drain(),
                "jobs": [{"job_id": int(j), "step": r.step(), **({"gpu_util": by_job[j]} if j in by_job else {})}
                         for j, r in self.jobs.items() if j.isdigit()],
                **self._gpu_state(),  # MIG and the GPUs' foreign processes (design §1 "Owner activity and MIG")
                **({"class_bytes": class_bytes} if class_bytes else {}),  # design §4 "Calibrated reserve"
            }))
            await asyncio.sleep(self.heartbeat_interval_s)

    async def _watch_loop(self) -> None:
        """Every 100 ms: sample egress, report new checkpoints (manifests) and exited jobs."""
        while True:
            await asyncio.sleep(0.1)
            try:
                await self._watch_once()
            except Exception:  # one bad pass must not stop job exit reports for good; the next re-reads all
                log.exception("watch loop pass failed")

    def _scan_held(self) -> dict[str, dict[int, str]]:
        return {j: {seq: m.sha256 for seq, m in seqs.items()} for j, seqs in held_checkpoints(self.data_dir).items()}

    async def sync_held(self) -> None:
        """Report the checkpoints that disappeared since the last scan (pruned by the job, dropped, removed as
        corrupt or abandoned on a restore) — reliably, so the portal stops counting on them."""
        now_held = self._scan_held()
        before, self.held = self.held, now_held
        for job_id, seqs in sorted(before.items()):
            gone = sorted(seq for seq, sha in seqs.items()
                          if now_held.get(job_id, {}).get(seq) != sha and 0 < seq < 2**63)
            if gone and job_id.isdigit():
                await self.send({"type": "checkpoints_dropped", "job_id": int(job_id), "sequences": gone[:256],
                                 "reason": "no longer held"})

    async def _watch_once(self) -> None:
        """Sample egress; report new checkpoints (manifests), exited jobs and checkpoints no longer held."""
        self._passes += 1
        self.check_fence()
        if self._passes % HELD_SCAN_EVERY == 0:
            await self.sync_held()
        self.egress.sample()
        for job_id, run in list(self.jobs.items()):
            await self._report_checkpoints(job_id, run)
            code = run.proc.poll()
            if code is not None:
                del self.jobs[job_id]
                # design §19, off the event loop: the rest of its cgroup killed, an OOM kill named
                limit_reason = await asyncio.to_thread(run.finish)
                await self._report_checkpoints(job_id, run)  # a final checkpoint written at exit
                final_output = self.output.final(job_id, run.output)  # the run's last output, before its exit
                if final_output is not None:
                    await self.send(final_output)
                reason = run.stop_reason or limit_reason or ("completed" if code == 0 else "exited")
                exited = {"type": "job_exited", "job_id": int(job_id), "returncode": code, "step": run.step(),
                          "result": run.result(), "reason": reason, "paused": self.pop_pauses(job_id)}
                reached = last_progress(run.work_dir)  # when the job got to that step (its step time, §9.9)
                if reached is not None and reached[0] == exited["step"]:
                    exited["step_at"] = reached[1]
                if run.output is not None:
                    exited["output_tail"] = run.output.tail
                await self.send(exited)
                self._queue_results(job_id, run, code, final=True)  # after the end is reported (design §14)
        for message in self.output.due(self.jobs, self.pending):  # new output, batched (design §9.11)
            await self.send(message)

    async def _report_checkpoints(self, job_id: str, run: RunningJob) -> None:
        """Send checkpoint_done (reliably) for each of the job's checkpoints not reported yet."""
        for manifest in jobkit.list_manifests(run.ckpt_dir):
            if manifest.sequence not in run.reported_sequences:
                run.reported_sequences.add(manifest.sequence)
                self.held.setdefault(job_id, {})[manifest.sequence] = manifest.sha256  # its pruning is reported
                await self.send(self._checkpoint_message(job_id, manifest))
                if run.upload_with_checkpoints and run.proc.poll() is None:
                    self._queue_results(job_id, run, None, final=False)

    def _queue_results(self, job_id: str, run: RunningJob, code: int | None, *, final: bool) -> None:
        """Queue the upload of the job's output directory (design §14): at each checkpoint when asked, with its
        newest checkpoint when it ended on its own (completed or failed), and without it when it stopped to be
        moved (final checkpoint taken, exit 75: this node's working directory stays behind). A job stopped
        otherwise (cancelled, killed) uploads nothing."""
        if not run.output_dir:
            return
        moving = final and code == jobkit.EXIT_CHECKPOINTED
        if final and run.stop_reason and not moving:
            return
        self.results.enqueue(job_id, run.work_dir, run.output_dir, final=final,
                             ckpt_dir=run.ckpt_dir if final and not moving else None)

    @staticmethod
    def _checkpoint_message(job_id: str, m: jobkit.Manifest) -> dict[str, Any]:
        msg = {"type": "checkpoint_done", "job_id": int(job_id), "sequence": m.sequence, "step": m.step,
               "size_bytes": m.size_bytes, "sha256": m.sha256, "taken_at": m.taken_at, "final": m.final,
               "compat": m.compat}
        # design §2 "Asynchronous snapshots": the job's pause and its write time, when its manifest has them (the
        # manifest is the job's own file: only finite non-negative numbers are passed on, the portal checks again)
        for key in ("stall_s", "write_s"):
            value = getattr(m, key, None)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
                    and 0 <= value <= MAX_REPORTED_SECONDS:
                msg[key] = float(value)
        if m.mode in ("sync", "async"):
            msg["mode"] = m.mode
        return msg

    # --- fencing (design §9.10) ------------------------------------------------------------------------------
    def check_fence(self) -> bool:
        """Pause every job (SIGSTOP to its process group) once the portal has not been heard for ``fence_s``:
        the portal declares the node lost only HEARTBEAT_TIMEOUT_S after the last heartbeat it recorded, which
        was sent no earlier than ``heard_at``, so the jobs stop before they can be given away. Paused, not
        killed: a portal restart costs only the pause."""
        if self.fenced or self.fence_s is None or not self.jobs or self.clock() - self.heard_at <= self.fence_s:
            return False
        self.fenced = True
        log.warning("portal not heard for %.1f s: %d job(s) paused until it says which are still ours",
                    self.clock() - self.heard_at, len(self.jobs))
        for job_id, run in self.jobs.items():
            run.signal(signal.SIGSTOP)
            spans = self.pauses.setdefault(job_id, [])
            spans.append([self.wall(), None])
            del spans[:-MAX_PAUSES]  # only the newest are reported
        return True

    def _resumed(self, job_id: str) -> None:
        """The job runs again (SIGCONT): its open pause ends now."""
        spans = self.pauses.get(job_id)
        if spans and spans[-1][1] is None:
            spans[-1][1] = self.wall()

    def pop_pauses(self, job_id: str) -> list[list[float]]:
        """The run's pauses for its job_exited (and forgotten): the newest MAX_PAUSES, a pause still open ending
        now (the run ended while paused), ordered and disjoint even if the wall clock stepped back."""
        self._resumed(job_id)
        out: list[list[float]] = []
        for start, end in self.pauses.pop(job_id, [])[-MAX_PAUSES:]:
            start = max(float(start or 0.0), out[-1][1] if out else 0.0)
            out.append([start, max(start, float(end or start))])
        return out

    def welcomed(self, welcome: dict[str, Any], hello_sent_at: float) -> None:
        """A welcome answers the hello sent at ``hello_sent_at``: learn the portal's heartbeat timeout (fence
        after ``fence_fraction`` of it) and, if fenced, resume the jobs it lists as still placed here and kill
        the others (they were given away meanwhile; their job_exited reports the step they got to)."""
        timeout_s = welcome.get("heartbeat_timeout_s")
        valid = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool) and 0 < timeout_s < 1e6
        self.fence_s = self.config.fence_fraction * float(timeout_s) if valid else None
        self.heard_at = max(self.heard_at, hello_sent_at)
        self.report_ended = False  # the portal recorded them with the hello it answers
        if not self.fenced:
            return
        self.fenced = False
        listed = welcome.get("jobs")
        placed = {str(j) for j in listed} if isinstance(listed, list) else set(self.jobs)
        for job_id, run in self.jobs.items():
            if job_id not in placed:
                run.stop_reason = "given away while the portal could not hear this node"
                run.signal(signal.SIGKILL)
            run.signal(signal.SIGCONT)
            self._resumed(job_id)
        log.info("unfenced: %d job(s) resumed, %d killed", len(set(self.jobs) & placed), len(set(self.jobs) - placed))

    async def _cmd_heartbeat_ack(self, msg: dict[str, Any]) -> None:
        """The portal recorded heartbeat ``seq``: it has heard this agent as of when that heartbeat was sent.
        Fenced, the agent says hello again on this connection to learn which of its jobs are still its own."""
        sent_at = self._beats_sent.get(str(msg.get("seq")))
        if sent_at is None:
            return
        self.heard_at = max(self.heard_at, sent_at)
        if self.fenced and self.ws is not None and self.clock() - self._hello_sent_at > self.heartbeat_interval_s:
            self._hello_sent_at = self.clock()
            await self.send(self._hello(), reliable=False)

    async def _cmd_welcome(self, msg: dict[str, Any]) -> None:
        """The answer to a hello sent again on a live connection (see :meth:`_cmd_heartbeat_ack`)."""
        self.welcomed(msg, self._hello_sent_at)

    # --- commands -------------------------------------------------------------------------------------------
    async def _on_message(self, raw: str | bytes) -> None:
        try:
            msg = json.loads(raw)
            kind = msg["type"]
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable message from the portal ignored")
            return
        if kind == "received":  # the portal handled (or refused for good) a reliable report
            self.pending.pop(str(msg.get("msg_id")), None)
            return
        handler = getattr(self, f"_cmd_{kind}", None)
        if handler is None:
            if kind != "error":
                log.info("ignoring portal message %r", kind)
            else:
                log.warning("portal rejected a message: %s", msg.get("reason"))
            return
        cmd_id = msg.get("cmd_id")
        if isinstance(cmd_id, str):
            self._ack(cmd_id)
            if cmd_id in self.seen_commands:
                log.info("command %s %s received again: acked, not executed twice", kind, cmd_id)
                return
            bounded_put(self.seen_commands, cmd_id, None, SEEN_COMMANDS)
        if not self._newest_of_subject(msg):
            log.info("command %s %s is older than one already executed for %s: skipped", kind, cmd_id,
                     msg.get("supersede_key"))
            return
        try:
            await handler(msg)
        except Exception:
            log.exception("command %s failed", kind)

    def _ack(self, cmd_id: str) -> None:
        """Acknowledge ``cmd_id`` in the next ack message (sent ACK_DELAY_S from the first one waiting)."""
        if cmd_id not in self._acks:
            self._acks.append(cmd_id)
        if self._ack_task is None or self._ack_task.done():
            self._ack_task = asyncio.create_task(self._send_acks_later())

    async def _send_acks_later(self) -> None:
        await asyncio.sleep(ACK_DELAY_S)
        await self.flush_acks()

    async def flush_acks(self) -> None:
        """Send the waiting acks, ACKS_PER_MESSAGE to a message (not kept: an unacked command is re-sent)."""
        while self._acks:
            ids, self._acks = self._acks[:ACKS_PER_MESSAGE], self._acks[ACKS_PER_MESSAGE:]
            await self.send({"type": "ack", "cmd_id": ids[0], "cmd_ids": ids, "t": time.time()}, reliable=False)

    def _newest_of_subject(self, msg: dict[str, Any]) -> bool:
        """Whether ``msg`` is at least as new as every executed command of its subject (and remember it)."""
        key, issued = msg.get("supersede_key"), msg.get("issued_us")
        if not isinstance(key, str) or not isinstance(issued, int) or isinstance(issued, bool):
            return True
        if issued < self.newest_issued.get(key, issued):
            return False
        bounded_put(self.newest_issued, key, issued, SEEN_COMMANDS)
        return True

    def _compat(self, gpus: list[int]) -> dict[str, str]:
        chosen = [g for g in self.gpus if g.index in gpus] or self.gpus
        if not chosen:
            return {}
        g = chosen[0]
        return {"gpu_model": g.model, "compute_capability": str(g.capability), "driver_version": g.driver_version,
                "cuda_version": g.cuda_version}

    async def _cmd_start_job(self, msg: dict[str, Any]) -> None:
        job_id = str(msg["job_id"])
        if job_id in self.jobs:
            await self.send({"type": "job_started", "job_id": int(job_id), "restored_sequence": None,
                             "already_running": True})
            return
        if self.killswitch:
            await self.send({"type": "job_exited", "job_id": int(job_id), "returncode": -1, "step": 0,
                             "result": {}, "reason": "killswitch engaged"})
            return
        restore = msg.get("restore_sequence")
        restored_step = None
        if restore is not None:
            ckpt = store_dir(self.data_dir, job_id)
            manifests = {m.sequence: m for m in jobkit.list_manifests(ckpt)}
            m = manifests.get(int(restore))
            if m is None or m.sha256 != msg.get("restore_sha256") or not jobkit.verify(ckpt, m):
                if m is not None and not jobkit.verify(ckpt, m):
                    jobkit.remove_checkpoint(ckpt, m.sequence)  # corrupt: never offered again
                    jobkit.remove_orphan_temporaries(ckpt)
                await self.send({"type": "checkpoints_dropped", "job_id": int(job_id), "sequences": [int(restore)],
                                 "reason": RESTORE_FAILED})
                await self.sync_held()
                await self.send({"type": "job_exited", "job_id": int(job_id), "returncode": -1, "step": 0,
                                 "result": {}, "reason": RESTORE_FAILED, "restore_sequence": int(restore)})
                return
            restored_step = m.step
        try:
            run = self._start(job_id, msg, restore)
        except (OSError, ValueError, RuntimeError) as exc:  # no free job uid, a cgroup or chown refused: say so
            log.exception("job %s: could not start", job_id)
            await self.send({"type": "job_exited", "job_id": int(job_id), "returncode": -1, "step": 0,
                             "result": {}, "reason": f"could not start: {exc}"[:500]})
            return
        self.jobs[job_id] = run
        self.pauses.pop(job_id, None)  # an earlier run's
        await self.send({"type": "job_started", "job_id": int(job_id), "restored_sequence": restore,
                         "restored_step": restored_step})
        await self.sync_held()  # checkpoints newer than the one restored were abandoned

    def _start(self, job_id: str, msg: dict[str, Any], restore: Any) -> RunningJob:
        return start_job(
            data_dir=self.data_dir, base_dir=self.config.base_dir, job_id=job_id, command=msg["command"],
            gpus=list(msg.get("gpus", [])), interval_s=msg.get("interval_s"),
            next_sequence=int(msg.get("next_sequence", 1)), restore_sequence=restore,
            compat=self._compat(list(msg.get("gpus", []))), kill_with_agent=self.config.kill_jobs_on_agent_exit,
            output_dir=str(msg.get("output_dir") or ""),
            upload_with_checkpoints=bool(msg.get("upload_with_checkpoints", False)),
            extra_env=msg.get("env") if isinstance(msg.get("env"), dict) else None,  # design §16.6: array index
            confiner=self.confiner, memory_bytes=msg.get("memory_bytes"), cpu_cores=msg.get("cpu_cores"),  # §19
        )

    async def _cmd_checkpoint(self, msg: dict[str, Any]) -> None:
        run = self.jobs.get(str(msg["job_id"]))
        if run is not None:
            run.stop_reason = "checkpointed for migration" if msg.get("final") else run.stop_reason
            run.signal(signal.SIGUSR2 if msg.get("final") else signal.SIGUSR1)

    async def _cmd_stop_job(self, msg: dict[str, Any]) -> None:
        run = self.jobs.get(str(msg["job_id"]))
        if run is not None:
            run.stop_reason = str(msg.get("reason", "stopped"))
            run.signal(signal.SIGKILL)

    async def _cmd_set_interval(self, msg: dict[str, Any]) -> None:
        run = self.jobs.get(str(msg["job_id"]))
        if run is not None and msg.get("interval_s"):
            run.set_interval(float(msg["interval_s"]))

    async def _cmd_set_reserve(self, msg: dict[str, Any]) -> None:
        """The portal's calibrated (or overridden) research reserve for this node's link (design §4)."""
        share = msg.get("reserve_share")
        if not isinstance(share, int | float) or isinstance(share, bool) or not 0.0 <= share <= 1.0:
            log.info("set_reserve ignored: reserve_share %r is not in [0, 1]", share)
            return
        self.edge.set_reserve_share(float(share))

    async def _cmd_reclaim_notice(self, msg: dict[str, Any]) -> None:
        """Warn → drain → force (design §1): whatever the portal manages, force at the deadline locally."""
        if self._deadline_task is not None:
            self._deadline_task.cancel()
        delay_s = max(0.0, float(msg.get("deadline_in_s", 0.0)))
        deadline_at = msg.get("deadline_at")
        if isinstance(deadline_at, int | float) and not isinstance(deadline_at, bool):  # a late copy: not later
            delay_s = max(0.0, min(delay_s, float(deadline_at) - time.time()))
        self._deadline_task = asyncio.create_task(self._force_at(delay_s))

    async def _force_at(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self._engage_killswitch(stop_jobs=True, reason="reclaim deadline")

    async def _cmd_killswitch(self, msg: dict[str, Any]) -> None:
        if msg.get("engaged", True):
            await self._engage_killswitch(stop_jobs=bool(msg.get("stop_jobs", True)), reason="kill-switch")
        else:
            self.killswitch = False
            self.receiver.refuse_new = False
            self.edge.killswitch(False)
            if self._deadline_task is not None:
                self._deadline_task.cancel()

    async def _engage_killswitch(self, stop_jobs: bool, reason: str) -> None:
        """Stop taking new work at once (kernel flag when present), then kill the jobs still running."""
        self.killswitch = True
        self.receiver.refuse_new = True
        self.edge.killswitch(True, allow_ports=(self.data_addr[1],))
        if stop_jobs:
            for run in self.jobs.values():
                run.stop_reason = run.stop_reason or reason
                run.signal(signal.SIGKILL)
        await self.send({"type": "killswitch_engaged", "reason": reason, "t": time.time()})

    def shutdown(self) -> None:
        self.stopping.set()
        ws = self.ws
        if ws is not None:
            self._spawn(ws.close())
