"""Job output, portal side (design §9.11): agents' ``job_output`` reports are validated, cleaned, appended once,
capped with the oldest dropped, marked per run, kept after the job ends, and a failed job's status quotes its
last lines. The last test runs a real agent's job process through the real consumer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from control_helpers import FakeAgent, db, make_node, make_running_job, until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _output(job_id: int) -> str:
    from portal.core.models import JobOutput
    from portal.core.models.output import read_output

    head = JobOutput.objects.filter(pk=job_id).first()
    if head is None:
        return ""
    return read_output(job_id, 0, head.start_offset, head.end_offset)[1]


def _head(job_id: int) -> Any:
    from portal.core.models import JobOutput

    return JobOutput.objects.get(pk=job_id)


def _report(job_id: int, text: str, msg_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "job_output", "job_id": job_id, "text": text, "msg_id": msg_id, **extra}


def _handle(node_id: int, msg: dict[str, Any]) -> bool:
    from portal.control.link import handlers

    return handlers.handle(node_id, msg["type"], msg)


def _queued_on(node: Any) -> Any:
    """A job placed on ``node`` that its agent has not started yet (job_started makes it run)."""
    from portal.core.models import Job

    job = make_running_job(node)
    Job.objects.filter(pk=job.pk).update(state="queued", started_at=None)
    job.refresh_from_db()
    return job


def _move(job: Any, to: Any) -> None:
    """Play a migration: the old placement ends, the job waits placed on ``to``."""
    from django.utils import timezone

    from portal.core.models import Job, Placement

    Placement.objects.filter(job=job, ended_at__isnull=True).update(ended_at=timezone.now(), end_reason="moved")
    Placement.objects.create(job=job, node=to, gpu_indices=[0])
    Job.objects.filter(pk=job.pk).update(state="migrating")


async def _online(name: str, port: int) -> tuple[Any, FakeAgent]:
    node, token = await db(make_node)(name)
    agent = FakeAgent(token, data_port=port)
    assert await agent.connect()
    await agent.hello()
    return node, agent


# --- through the consumer ---------------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_a_report_sent_twice_is_appended_once_and_answered_twice() -> None:
    node, agent = await _online("n1", 9001)
    job = await db(make_running_job)(node)
    for _ in range(2):
        await agent.send(_report(job.pk, "epoch 1 loss 0.9\n", "o-1"))
        assert (await agent.expect("received"))["msg_id"] == "o-1"
    assert await db(_output)(job.pk) == "epoch 1 loss 0.9\n"
    await agent.close()


@pytest.mark.asyncio
async def test_oversized_or_malformed_reports_are_refused_and_change_nothing() -> None:
    from portal.control.link.protocol import MAX_OUTPUT_TEXT_CHARS

    node, agent = await _online("n1", 9001)
    job = await db(make_running_job)(node)
    await agent.send(_report(job.pk, "x" * (MAX_OUTPUT_TEXT_CHARS + 1), "o-big"))
    assert "job_output.text" in (await agent.expect("error"))["reason"]
    await agent.send(_report(job.pk, "ok\n", "o-neg", skipped_bytes=-5))
    assert "skipped_bytes" in (await agent.expect("error"))["reason"]
    await agent.send({"type": "job_output", "job_id": job.pk, "msg_id": "o-notext"})
    assert "job_output.text" in (await agent.expect("error"))["reason"]
    assert await db(_output)(job.pk) == ""
    await agent.close()


@pytest.mark.asyncio
async def test_output_of_a_job_this_node_never_ran_is_refused_and_answered() -> None:
    _, agent = await _online("n1", 9001)
    other, _ = await db(make_node)("n2")
    job = await db(make_running_job)(other)
    await agent.send(_report(job.pk, "not mine\n", "o-x"))
    assert "never placed on this node" in (await agent.expect("error"))["reason"]
    assert (await agent.expect("received"))["msg_id"] == "o-x"  # refused for good: the agent stops sending it
    await agent.send(_report(999_999, "no such job\n", "o-y"))
    assert (await agent.expect("received"))["msg_id"] == "o-y"
    assert await db(_output)(job.pk) == ""
    await agent.close()


# --- the handler ---------------------------------------------------------------------------------------------
def test_escape_sequences_and_control_characters_are_removed_newlines_and_tabs_kept() -> None:
    node, _ = make_node("n1")
    job = make_running_job(node)
    raw = json.loads('"\\u001b[1;32mok\\u001b[0m\\tdone\\r\\nbar 10%\\rbar 99%\\u0000\\u0007\\u202eevil\\ud800 end\\n"')
    _handle(node.pk, _report(job.pk, raw, "c-1"))
    assert _output(job.pk) == "ok\tdone\nbar 10%\nbar 99%evil? end\n"


def test_each_run_gets_a_marker_and_late_output_of_an_earlier_run_is_marked() -> None:
    a, _ = make_node("lab-a-01")
    b, _ = make_node("lab-b-03", "B")
    job = _queued_on(a)
    _handle(a.pk, {"type": "job_started", "job_id": job.pk, "restored_sequence": None, "restored_step": None,
                   "msg_id": "s-1"})
    _handle(a.pk, _report(job.pk, "step 4100\nstep 4200 (unfinished", "o-1"))
    _move(job, b)
    _handle(b.pk, {"type": "job_started", "job_id": job.pk, "restored_sequence": 3, "restored_step": 4200,
                   "msg_id": "s-2"})
    _handle(b.pk, _report(job.pk, "restored step 4200\n", "o-2"))
    _handle(a.pk, _report(job.pk, "final checkpoint at step 4250\n", "o-3", final=True))  # the old node, late
    _handle(b.pk, _report(job.pk, "step 4300\n", "o-4"))
    assert _output(job.pk) == (
        "— run 1 on node lab-a-01 —\n"
        "step 4100\nstep 4200 (unfinished\n"
        "— run 2 on node lab-b-03, resumed from step 4200 —\n"
        "restored step 4200\n"
        "— output of an earlier run on node lab-a-01, arrived late —\n"
        "final checkpoint at step 4250\n"
        "— run 2 on node lab-b-03, continued —\n"
        "step 4300\n")
    assert _head(job.pk).runs == 2


def test_a_job_started_again_on_the_same_run_writes_no_second_marker() -> None:
    node, _ = make_node("n1")
    job = _queued_on(node)
    start = {"type": "job_started", "job_id": job.pk, "restored_sequence": None, "restored_step": None}
    _handle(node.pk, {**start, "msg_id": "s-1"})
    _handle(node.pk, {**start, "already_running": True, "msg_id": "s-2"})  # a start command delivered twice
    assert _output(job.pk) == "— run 1 on node n1 —\n"


def test_skipped_output_is_marked_where_it_was_dropped() -> None:
    node, _ = make_node("n1")
    job = make_running_job(node)
    _handle(node.pk, _report(job.pk, "a\n", "o-1"))
    _handle(node.pk, _report(job.pk, "z\n", "o-2", skipped_bytes=3 * 1024 * 1024))
    assert _output(job.pk) == ("a\n[… 3.0 MiB of output skipped here: the job wrote it faster than its node "
                               "sends output …]\nz\n")


def test_the_tail_is_capped_oldest_chunks_first_and_offsets_only_grow() -> None:
    from portal.core.models import JobOutputChunk
    from portal.core.models.output import OUTPUT_CAP_BYTES, read_output

    node, _ = make_node("n1")
    job = make_running_job(node)
    line = "".join(f"{i:04d} " + "w" * 94 + "\n" for i in range(100))  # 10,000 bytes a report
    written = 0
    for k in range(60):  # 600,000 bytes: more than twice the cap
        _handle(node.pk, _report(job.pk, f"[{k:02d}]" + line, f"o-{k}"))
        written += len(line) + 4
        head = _head(job.pk)
        assert head.end_offset == written
        assert head.end_offset - head.start_offset <= OUTPUT_CAP_BYTES
    assert head.start_offset > 0 and head.end_offset - head.start_offset > OUTPUT_CAP_BYTES - 10_004
    kept = _output(job.pk)
    assert kept.startswith("[") and kept.endswith(f"[59]{line}"[-200:])  # whole reports, the newest last
    assert JobOutputChunk.objects.filter(job=job, start_offset__lt=head.start_offset).count() == 0
    offset, text = read_output(job.pk, 0, head.start_offset, head.end_offset)  # a reader from the beginning
    assert offset == head.start_offset and len(text.encode()) == head.end_offset - head.start_offset
    offset, text = read_output(job.pk, head.end_offset - 50, head.start_offset, head.end_offset)  # following
    assert offset == head.end_offset - 50 and text == line[-50:]


def test_output_is_kept_after_the_job_ends_and_a_failure_quotes_its_last_lines() -> None:
    from portal.core.models import Job

    node, _ = make_node("n1")
    job = make_running_job(node)
    _handle(node.pk, _report(job.pk, "step 1\nTraceback (most recent call last):\n  File \"train.py\"\n", "o-1"))
    _handle(node.pk, {"type": "job_exited", "job_id": job.pk, "returncode": 2, "step": 1, "result": {},
                      "reason": "exited", "msg_id": "x-1",
                      "output_tail": "step 1\nTraceback (most recent call last):\n  File \"train.py\"\n"
                                     "ValueError: learning rate must be positive\n\n"})
    job.refresh_from_db()
    assert job.state == "failed"
    assert job.failure_reason == ('exit code 2: exited. Last output: Traceback (most recent call last): | '
                                  'File "train.py" | ValueError: learning rate must be positive')
    assert Job.objects.get(pk=job.pk).output.end_offset > 0 and "Traceback" in _output(job.pk)


def test_without_the_agents_tail_the_failure_quotes_the_stored_output_never_a_marker() -> None:
    node, _ = make_node("n1")
    job = _queued_on(node)
    _handle(node.pk, {"type": "job_started", "job_id": job.pk, "restored_sequence": None, "msg_id": "s-1"})
    _handle(node.pk, _report(job.pk, "CUDA error: out of memory\n", "o-1"))
    _handle(node.pk, {"type": "job_exited", "job_id": job.pk, "returncode": 1, "step": 0, "result": {},
                      "reason": "exited", "msg_id": "x-1"})  # an older agent: no output_tail
    job.refresh_from_db()
    assert job.failure_reason == "exit code 1: exited. Last output: CUDA error: out of memory"


def test_a_failure_message_stays_within_its_column() -> None:
    node, _ = make_node("n1")
    job = make_running_job(node)
    _handle(node.pk, {"type": "job_exited", "job_id": job.pk, "returncode": 2, "step": 0, "result": {},
                      "reason": "exited", "msg_id": "x-1", "output_tail": ("y" * 3000 + "\n") * 3})
    job.refresh_from_db()
    assert len(job.failure_reason) == 500 and job.failure_reason.startswith("exit code 2: exited. Last output: …")


def test_live_events_are_job_scoped_and_at_most_one_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt

    from portal.control.link import output
    from portal.core.models import JobOutput

    events: list[tuple[list[str], str, dict[str, Any]]] = []
    monkeypatch.setattr(output, "publish_after_commit", lambda groups, event, **f: events.append((groups, event, f)))
    node, _ = make_node("n1")
    job = make_running_job(node)
    _handle(node.pk, _report(job.pk, "a\n", "o-1"))
    _handle(node.pk, _report(job.pk, "b\n", "o-2"))  # within the second: no second event
    assert events == [([f"job-{job.pk}"], "job.output", {"job_id": job.pk, "offset": 2})]
    JobOutput.objects.filter(pk=job.pk).update(published_at=_head(job.pk).published_at - dt.timedelta(seconds=1))
    _handle(node.pk, _report(job.pk, "c\n", "o-3"))
    assert len(events) == 2 and events[1][2]["offset"] == 6


# --- a real agent's job process, through the real consumer ----------------------------------------------------
class _Bridge:
    """The agent's websocket: what it sends goes to the consumer through a FakeAgent's communicator."""

    def __init__(self, fake: FakeAgent) -> None:
        self.fake = fake

    async def send(self, text: str) -> None:
        await self.fake.send(text)


@pytest.mark.asyncio
async def test_a_real_job_process_output_reaches_the_job_with_its_run_marker(tmp_path: Path) -> None:
    from nodeagent.agent import Agent
    from nodeagent.config import build_config

    node, fake = await _online("lab-a-01", 9001)
    job = await db(_queued_on)(node)
    script = tmp_path / "train.py"
    script.write_text("import sys, time\nfor i in range(5):\n    print(f'step {i} loss {1 / (i + 1):.2f}')\n"
                      "    time.sleep(0.05)\nprint('\\x1b[31mdiverged\\x1b[0m', file=sys.stderr)\nsys.exit(3)\n")
    cfg = build_config({"token": "t", "portal": "ws://127.0.0.1:1", "data_dir": str(tmp_path / "data"),
                        "allow_unconfined_jobs": True,  # under pytest's 0700 tmp_path: no job user reaches it
                        "enforcement": "off", "base_dir": str(tmp_path)}, {})
    agent = Agent(cfg)
    agent.ws = _Bridge(fake)

    async def pump() -> None:  # the portal's answers back to the agent (received, acks, errors)
        while not await fake.comm.receive_nothing(timeout=0.05):  # (a receive that times out ends the app)
            await agent._on_message(await fake.comm.receive_from())

    await agent._on_message(json.dumps({"type": "start_job", "cmd_id": "c1", "job_id": job.pk,
                                        "command": "python train.py", "gpus": [0]}))
    for _ in range(300):
        await agent._watch_once()
        await pump()
        if not agent.jobs and not agent.pending:
            break
        await asyncio.sleep(0.05)
    assert not agent.pending  # every report answered: nothing left to re-send

    def state() -> tuple[str, str]:
        from portal.core.models import Job

        row = Job.objects.get(pk=job.pk)
        return row.state, row.failure_reason

    await until(lambda: state()[0] == "failed", what="the job failed")
    assert await db(_output)(job.pk) == (
        "— run 1 on node lab-a-01 —\n" + "".join(f"step {i} loss {1 / (i + 1):.2f}\n" for i in range(5))
        + "diverged\n")
    assert (await db(state)())[1] == "exit code 3: exited. Last output: step 3 loss 0.25 | step 4 loss 0.20 | diverged"
    await fake.close()
