"""No job runs twice (design §9.10): an agent the portal has not heard for ``fence_fraction`` × the portal's
heartbeat timeout pauses its jobs before the portal can declare the node lost and give them away; the next
welcome says which jobs are still placed on the node — those resume, the others are killed.

The agent side runs with an injected clock; one test pauses and resumes a real process group."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from control_helpers import FakeAgent, db, make_node, make_running_job

from nodeagent.agent import bounded_put
from nodeagent.config import build_config
from nodeagent.runner import RunningJob

pytestmark = pytest.mark.timeout(30)

TIMEOUT_S = 10.0  # the portal's HEARTBEAT_TIMEOUT_S as the welcome tells it; the agent fences at 7 s


class _Socket:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.sent if m.get("type") == kind]


class _Run:
    """Stands in for a job process: keeps the signals sent to its process group."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.stop_reason = ""
        self.gpus: list[int] = []
        self.proc = SimpleNamespace(pid=os.getpid())  # a live pid: the agent tells its jobs' processes apart

    def signal(self, signum: int) -> None:
        self.signals.append(signum)

    def step(self) -> int:
        return 0


def _agent(tmp_path: Path, now: list[float]) -> Any:
    from nodeagent.agent import Agent

    cfg = build_config({"token": "t", "portal": "ws://127.0.0.1:1", "data_dir": str(tmp_path / "data"),
                        "allow_unconfined_jobs": True,  # under pytest's 0700 tmp_path: no job user reaches it
                        "enforcement": "off"}, {})
    agent = Agent(cfg)
    agent.clock = lambda: now[0]
    agent.ws = _Socket()
    agent.welcomed({"type": "welcome", "node_id": 1, "heartbeat_timeout_s": TIMEOUT_S, "jobs": []}, now[0])
    return agent


async def _ack(agent: Any, seq: int, sent_at: float) -> None:
    """Heartbeat ``seq`` was sent at ``sent_at`` and the portal answered that it recorded it."""
    bounded_put(agent._beats_sent, str(seq), sent_at, 64)
    await agent._on_message(json.dumps({"type": "heartbeat_ack", "seq": seq}))


@pytest.mark.asyncio
async def test_jobs_pause_once_the_portal_is_unheard_for_the_fence_time_counted_from_the_acked_heartbeat_sent(
        tmp_path: Path) -> None:
    now = [0.0]
    agent = _agent(tmp_path, now)
    run = agent.jobs["4"] = _Run()
    assert agent.fence_s == pytest.approx(0.7 * TIMEOUT_S)
    now[0] = 6.9
    assert not agent.check_fence() and run.signals == []
    await _ack(agent, 1, sent_at=5.0)  # the answer came late: the portal's silence counts from 5.0 at the earliest
    now[0] = 11.9
    assert not agent.check_fence()
    now[0] = 12.1
    assert agent.check_fence() and agent.fenced and run.signals == [signal.SIGSTOP]
    assert not agent.check_fence() and run.signals == [signal.SIGSTOP]  # paused once


@pytest.mark.asyncio
async def test_an_agent_whose_portal_never_said_its_timeout_does_not_fence(tmp_path: Path) -> None:
    now = [0.0]
    agent = _agent(tmp_path, now)
    agent.welcomed({"type": "welcome", "node_id": 1, "heartbeat_interval_s": 1.0}, now[0])  # an older portal
    agent.jobs["4"] = _Run()
    now[0] = 1000.0
    assert agent.fence_s is None and not agent.check_fence()


@pytest.mark.asyncio
async def test_the_welcome_after_a_cut_resumes_the_jobs_still_placed_and_kills_the_ones_given_away(
        tmp_path: Path) -> None:
    now = [0.0]
    agent = _agent(tmp_path, now)
    kept = agent.jobs["4"] = _Run()
    given = agent.jobs["5"] = _Run()
    now[0] = 8.0
    assert agent.check_fence()
    now[0] = 20.0  # reconnected: the hello went out at 19.5
    agent.welcomed({"type": "welcome", "node_id": 1, "heartbeat_timeout_s": TIMEOUT_S, "jobs": [4]}, 19.5)
    assert not agent.fenced and agent.heard_at == 19.5
    assert kept.signals == [signal.SIGSTOP, signal.SIGCONT]
    assert signal.SIGKILL in given.signals and given.stop_reason  # its job_exited tells the step it got to
    assert kept.stop_reason == ""


@pytest.mark.asyncio
async def test_a_fenced_agent_still_connected_says_hello_again_when_heard_and_that_welcome_unfences(
        tmp_path: Path) -> None:
    now = [0.0]
    agent = _agent(tmp_path, now)
    run = agent.jobs["4"] = _Run()
    now[0] = 8.0
    assert agent.check_fence()
    await _ack(agent, 9, sent_at=8.5)  # the portal hears it again (it was slow, not gone)
    await _ack(agent, 10, sent_at=8.6)
    assert len(agent.ws.of("hello")) == 1  # once, not at every heartbeat
    assert agent.ws.of("hello")[0]["jobs"] == [{"job_id": 4, "step": 0}]
    await agent._on_message(json.dumps({"type": "welcome", "node_id": 1, "heartbeat_timeout_s": TIMEOUT_S,
                                        "jobs": [4]}))
    assert not agent.fenced and run.signals == [signal.SIGSTOP, signal.SIGCONT]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _until_state(pid: int, wanted: str) -> str:
    deadline = time.monotonic() + 5.0
    while (state := _state(pid)) not in wanted and time.monotonic() < deadline:
        time.sleep(0.02)
    return state


@pytest.mark.asyncio
async def test_fencing_stops_the_job_process_group_and_the_welcome_continues_it(tmp_path: Path) -> None:
    now = [0.0]
    agent = _agent(tmp_path, now)
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        agent.jobs["4"] = RunningJob(job_id="4", gpus=[], proc=proc, work_dir=tmp_path, ckpt_dir=tmp_path)
        now[0] = 7.5
        assert agent.check_fence()
        assert _until_state(proc.pid, "T") == "T"
        agent.welcomed({"type": "welcome", "node_id": 1, "heartbeat_timeout_s": TIMEOUT_S, "jobs": [4]}, 9.0)
        assert _until_state(proc.pid, "SR") in "SR" and proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.asyncio
async def test_the_agent_reports_when_it_had_each_run_paused_with_its_job_exited(tmp_path: Path) -> None:
    """Time a fenced job did not run is not work lost (design §9.9): the job_exited of a run killed while paused
    lists the pause, from the SIGSTOP to the kill, on the wall clock of the job's own progress record."""
    now, wall = [0.0], [1_800_000_000.0]
    agent = _agent(tmp_path, now)
    agent.wall = lambda: wall[0]
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        agent.jobs["4"] = RunningJob(job_id="4", gpus=[], proc=proc, work_dir=tmp_path, ckpt_dir=tmp_path)
        now[0], wall[0] = 7.5, wall[0] + 7.5
        assert agent.check_fence() and _until_state(proc.pid, "T") == "T"
        now[0], wall[0] = 30.0, wall[0] + 22.5  # the cut heals: the job was given away meanwhile
        agent.welcomed({"type": "welcome", "node_id": 1, "heartbeat_timeout_s": TIMEOUT_S, "jobs": []}, 29.5)
        proc.wait(5)
        wall[0] += 1.0
        await agent._watch_once()
    finally:
        proc.kill()
        proc.wait()
    exited = agent.ws.of("job_exited")
    assert len(exited) == 1 and exited[0]["paused"] == [[1_800_000_007.5, 1_800_000_030.0]]
    assert not agent.pauses


def test_a_runs_pauses_are_reported_newest_first_bounded_ordered_and_closed(tmp_path: Path) -> None:
    from nodeagent.agent import MAX_PAUSES

    now, wall = [0.0], [100.0]
    agent = _agent(tmp_path, now)
    agent.wall = lambda: wall[0]
    agent.jobs["4"] = _Run()
    for _ in range(MAX_PAUSES + 2):  # fenced, heard again, resumed: over and over
        now[0] += 8.0
        wall[0] += 8.0
        assert agent.check_fence()
        wall[0] += 2.0
        agent.welcomed({"type": "welcome", "node_id": 1, "heartbeat_timeout_s": TIMEOUT_S, "jobs": [4]}, now[0])
    now[0] += 8.0
    wall[0] += 8.0
    assert agent.check_fence()
    wall[0] -= 50.0  # the wall clock stepped back while the job was paused; it then ended
    paused = agent.pop_pauses("4")
    assert len(paused) == MAX_PAUSES and paused[-1] == [paused[-1][0], paused[-1][0]]
    assert all(a[1] <= b[0] <= b[1] for a, b in itertools.pairwise(paused))
    assert paused[0] == [100.0 + 3 * 10.0 + 8.0, 100.0 + 3 * 10.0 + 10.0]  # the oldest three are left out
    assert agent.pop_pauses("4") == [] and agent.pop_pauses("5") == []


# --- the portal side ------------------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_welcome_lists_the_jobs_placed_on_the_node_and_its_timeout_and_a_heartbeat_is_acked() -> None:
    from django.conf import settings

    node, token = await db(make_node)("n1")
    other, _ = await db(make_node)("n2")
    job = await db(make_running_job)(node)
    await db(make_running_job)(other)
    agent = FakeAgent(token)
    assert await agent.connect()
    welcome = await agent.hello(jobs=[{"job_id": job.pk, "step": 3}])
    assert welcome["jobs"] == [job.pk]
    assert welcome["heartbeat_timeout_s"] == settings.RECLAIMNET["HEARTBEAT_TIMEOUT_S"]
    await agent.send({"type": "heartbeat", "seq": 41, "gpu_util": [], "egress": {},
                      "jobs": [{"job_id": job.pk, "step": 5}]})
    assert (await agent.expect("heartbeat_ack"))["seq"] == 41
    await agent.close()
