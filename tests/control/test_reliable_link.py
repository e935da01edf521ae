"""Nothing is lost on the agent link (design §9.9): commands are acked and re-sent, reports are answered and
re-sent, both sides de-duplicate by id, and placement restores only from copies an agent confirmed."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from control_helpers import FakeAgent, db, make_node, make_running_job, until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

SHA = "c" * 64


async def _online(name: str, building: str = "A", port: int = 9000) -> tuple[Any, FakeAgent]:
    node, token = await db(make_node)(name, building)
    agent = FakeAgent(token, data_port=port)
    assert await agent.connect()
    await agent.hello()
    return node, agent


def _send(node_id: int, kind: str, **fields: Any) -> str:
    from portal.control.link import commands

    return commands.send(node_id, kind, **fields)


def _row(cmd_id: str) -> Any:
    from portal.control.models import AgentCommand

    return AgentCommand.objects.get(cmd_id=cmd_id)


# --- commands: portal → agent ---------------------------------------------------------------------------------
@pytest.mark.asyncio
async def test_an_acked_command_is_marked_acked_and_never_sent_again() -> None:
    from portal.control.loop.reconcile import reconcile

    node, agent = await _online("n1")
    cmd_id = await db(_send)(node.pk, "stop_job", job_id=5, reason="test")
    msg = await agent.expect("stop_job")
    assert msg["cmd_id"] == cmd_id
    await agent.send({"type": "ack", "cmd_id": cmd_id, "t": 1.0})
    await until(lambda: _row(cmd_id).acked_at is not None, what="the ack recorded")
    later = (await db(_row)(cmd_id)).created_at + dt.timedelta(seconds=60)
    assert (await db(reconcile)(later))["commands"] == 0
    assert await agent.nothing()
    await agent.close()


@pytest.mark.asyncio
async def test_one_ack_message_acknowledges_a_burst_of_commands() -> None:
    node, agent = await _online("n1")
    other, _ = await db(make_node)("n2")
    ids = [await db(_send)(node.pk, "stop_job", job_id=j, reason="test") for j in range(3)]
    foreign = await db(_send)(other.pk, "stop_job", job_id=9, reason="test")
    await agent.send({"type": "ack", "cmd_id": ids[0], "cmd_ids": [*ids, foreign], "t": 1.0})
    await until(lambda: all(_row(c).acked_at is not None for c in ids), what="the acks recorded")
    assert (await db(_row)(foreign)).acked_at is None  # another node's command is not this agent's to ack
    await agent.close()


@pytest.mark.asyncio
async def test_unacked_commands_are_sent_again_on_reconnect_in_order_and_a_superseded_one_never() -> None:
    node, token = await db(make_node)("n1")
    first = await db(_send)(node.pk, "set_interval", job_id=7, interval_s=10.0)  # while the agent is away
    stop = await db(_send)(node.pk, "stop_job", job_id=8, reason="test")
    newer = await db(_send)(node.pk, "set_interval", job_id=7, interval_s=20.0)
    assert (await db(_row)(first)).superseded_at is not None
    agent = FakeAgent(token)
    assert await agent.connect()
    await agent.hello()
    got = [await agent.expect("stop_job"), await agent.expect("set_interval")]
    assert [m["cmd_id"] for m in got] == [stop, newer] and got[1]["interval_s"] == 20.0
    assert got[1]["supersede_key"] == "set_interval:7" and isinstance(got[1]["issued_us"], int)
    assert await agent.nothing()  # the superseded interval is not sent
    await agent.send({"type": "ack", "cmd_id": stop, "t": 1.0})
    await until(lambda: _row(stop).acked_at is not None, what="the ack recorded")
    await agent.close()
    again = FakeAgent(token)
    assert await again.connect()
    await again.hello()
    assert (await again.expect("set_interval"))["cmd_id"] == newer  # still unacked: sent once more
    assert await again.nothing()
    assert (await db(_row)(newer)).attempts == 3
    await again.close()


@pytest.mark.asyncio
async def test_the_reconciler_resends_an_unacked_command_with_backoff_until_it_is_acked() -> None:
    from portal.control.loop.reconcile import reconcile

    node, agent = await _online("n1")
    cmd_id = await db(_send)(node.pk, "checkpoint", job_id=3, final=True)
    await agent.expect("checkpoint")
    created = (await db(_row)(cmd_id)).created_at
    assert (await db(reconcile)(created + dt.timedelta(seconds=1)))["commands"] == 0  # not overdue yet
    assert (await db(reconcile)(created + dt.timedelta(seconds=4)))["commands"] == 1
    assert (await agent.expect("checkpoint"))["cmd_id"] == cmd_id
    row = await db(_row)(cmd_id)
    assert row.attempts == 2 and row.next_send_at == created + dt.timedelta(seconds=4 + 6)  # backoff 3 s → 6 s
    assert (await db(reconcile)(created + dt.timedelta(seconds=9)))["commands"] == 0
    assert (await db(reconcile)(created + dt.timedelta(seconds=10)))["commands"] == 1
    await agent.expect("checkpoint")
    await agent.send({"type": "ack", "cmd_id": cmd_id, "t": 1.0})
    await until(lambda: _row(cmd_id).acked_at is not None, what="the ack recorded")
    assert (await db(reconcile)(created + dt.timedelta(seconds=100)))["commands"] == 0
    await agent.close()


@pytest.mark.asyncio
async def test_an_expired_command_is_not_sent_again_and_old_rows_are_pruned() -> None:
    from portal.control.loop.housekeeping import housekeeping
    from portal.control.loop.reconcile import reconcile
    from portal.control.models import AgentCommand

    node, agent = await _online("n1")
    cmd_id = await db(_send)(node.pk, "set_rate", transfer_id="t", rate_bytes_per_s=5.0, decision_id="d")
    await agent.expect("set_rate")
    created = (await db(_row)(cmd_id)).created_at
    assert (await db(reconcile)(created + dt.timedelta(seconds=31)))["commands"] == 0  # set_rate lives 30 s
    await db(housekeeping)(created + dt.timedelta(hours=2))
    assert not await db(AgentCommand.objects.filter(cmd_id=cmd_id).exists)()
    await agent.close()


def test_many_commands_are_written_in_a_fixed_number_of_statements() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from portal.control.link import commands
    from portal.control.models import AgentCommand

    node, _ = make_node("n1")
    counts = []
    for n in (5, 50):
        with CaptureQueriesContext(connection) as captured:
            commands.send_many([(node.pk, "set_interval", {"job_id": j, "interval_s": 9.0}) for j in range(n)])
        counts.append(len(captured.captured_queries))
        assert sum(q["sql"].startswith("INSERT") for q in captured.captured_queries) == 1
    assert counts[0] == counts[1]
    assert AgentCommand.objects.filter(superseded_at__isnull=False).count() == 5  # the first 5 jobs re-sent


def test_a_start_elsewhere_supersedes_one_that_never_arrived_and_kill_switch_states_are_per_node() -> None:
    from portal.control.link import commands

    n1, _ = make_node("n1")
    n2, _ = make_node("n2")
    old_start, new_start = _send(n1.pk, "start_job", job_id=3), _send(n2.pk, "start_job", job_id=3)
    engage1, engage2 = _send(n1.pk, "killswitch", engaged=True), _send(n2.pk, "killswitch", engaged=True)
    release1 = _send(n1.pk, "killswitch", engaged=False)
    assert _row(old_start).superseded_at is not None and _row(new_start).superseded_at is None
    assert _row(engage1).superseded_at is not None and _row(engage2).superseded_at is None
    assert [(p["type"], p.get("engaged")) for p in commands.pending_for(n1.pk)] == [("killswitch", False)]
    assert [p["cmd_id"] for p in commands.pending_for(n2.pk)] == [new_start, engage2]
    assert _row(release1).attempts == 2


# --- reports: agent → portal ----------------------------------------------------------------------------------
def _transfer(job: Any, src: Any, dst: Any) -> Any:
    from django.utils import timezone

    from portal.control.models import Transfer
    from portal.core.models import Checkpoint

    now = timezone.now()
    ckpt = Checkpoint.objects.create(job=job, sequence=1, node=src, step=10, size_bytes=1000, sha256=SHA,
                                     taken_at=now, completed_at=now)
    return Transfer.objects.create(job=job, checkpoint=ckpt, source=src, destination=dst, purpose="presync",
                                   token_hash="x", expires_at=now + dt.timedelta(seconds=600))


def _errors(transfer_pk: int) -> list[str]:
    from portal.control.models import Transfer

    return list(Transfer.objects.get(pk=transfer_pk).errors)


@pytest.mark.asyncio
async def test_a_report_sent_twice_is_handled_once_and_answered_twice() -> None:
    from portal.control.models import ReceivedReport

    src, a = await _online("src", port=9001)
    dst, b = await _online("dst", port=9002)
    job = await db(make_running_job)(src)
    transfer = await db(_transfer)(job, src, dst)
    report = {"type": "transfer_sent", "transfer_id": str(transfer.transfer_id), "ok": True, "attempts": 2,
              "elapsed_s": 1.0, "errors": ["first try reset"], "msg_id": "r-1"}
    for _ in range(2):
        await a.send(report)
        assert (await a.expect("received"))["msg_id"] == "r-1"
    assert await db(_errors)(transfer.pk) == ["first try reset"]  # appended once, not twice
    assert await db(ReceivedReport.objects.filter(node=src, msg_id="r-1").count)() == 1
    await a.close()
    await b.close()


@pytest.mark.asyncio
async def test_a_report_that_met_a_database_error_is_not_answered_and_is_handled_once_when_resent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import OperationalError

    from portal.control.link import handlers
    from portal.control.models import ReceivedReport

    src, a = await _online("src", port=9001)
    dst, b = await _online("dst", port=9002)
    job = await db(make_running_job)(src)
    transfer = await db(_transfer)(job, src, dst)
    real = handlers.HANDLERS["transfer_sent"]
    calls = []

    def flaky(node_id: int, msg: dict[str, Any]) -> None:
        calls.append(msg["msg_id"])
        if len(calls) == 1:
            real(node_id, msg)  # its writes roll back with the error
            raise OperationalError("the database is restarting")
        real(node_id, msg)

    monkeypatch.setitem(handlers.HANDLERS, "transfer_sent", flaky)
    report = {"type": "transfer_sent", "transfer_id": str(transfer.transfer_id), "ok": True, "attempts": 1,
              "elapsed_s": 1.0, "errors": ["e1"], "msg_id": "r-2"}
    await a.send(report)
    assert await a.nothing(0.5)  # neither received nor an error: the agent will send it again
    await until(lambda: len(calls) == 1)
    assert await db(_errors)(transfer.pk) == []
    assert not await db(ReceivedReport.objects.filter(msg_id="r-2").exists)()
    await a.send(report)
    assert (await a.expect("received"))["msg_id"] == "r-2"
    await a.send(report)
    assert (await a.expect("received"))["msg_id"] == "r-2"
    assert await db(_errors)(transfer.pk) == ["e1"] and len(calls) == 2  # handled once after the error
    await a.close()
    await b.close()


@pytest.mark.asyncio
async def test_a_refused_report_is_answered_so_the_agent_stops_sending_it() -> None:
    _, agent = await _online("n1")
    await agent.send({"type": "checkpoint_done", "job_id": 999_999, "sequence": 1, "step": 1, "size_bytes": 10,
                      "sha256": SHA, "taken_at": 1.0, "final": False, "compat": {}, "msg_id": "r-3"})
    assert "unknown job" in (await agent.expect("error"))["reason"]
    assert (await agent.expect("received"))["msg_id"] == "r-3"
    await agent.close()


def test_reports_handled_a_day_ago_are_pruned() -> None:
    from django.utils import timezone

    from portal.control.loop.housekeeping import housekeeping
    from portal.control.models import ReceivedReport

    node, _ = make_node("n1")
    now = timezone.now()
    ReceivedReport.objects.create(node=node, msg_id="old", kind="job_started", received_at=now - dt.timedelta(days=2))
    ReceivedReport.objects.create(node=node, msg_id="new", kind="job_started", received_at=now)
    assert housekeeping(now)["reports_pruned"] == 1
    assert list(ReceivedReport.objects.values_list("msg_id", flat=True)) == ["new"]


# --- placement knows what exists ------------------------------------------------------------------------------
def _checkpoint(job: Any, writer: Any, sequence: int, age_s: float, replica: Any | None) -> Any:
    from django.utils import timezone

    from portal.core.models import Checkpoint

    now = timezone.now()
    ckpt = Checkpoint.objects.create(job=job, sequence=sequence, node=writer, step=100 * sequence,
                                     size_bytes=1000, sha256=f"{sequence:x}".rjust(64, "0"),
                                     taken_at=now - dt.timedelta(seconds=age_s), completed_at=now)
    if replica is not None:
        ckpt.replica_nodes.add(replica)
    return ckpt


def _started_ago(job: Any, seconds: float) -> None:
    from django.utils import timezone

    from portal.core.models import Placement

    Placement.objects.filter(job=job).update(started_at=timezone.now() - dt.timedelta(seconds=seconds))


def _holders(job: Any, sequence: int) -> set[int]:
    from portal.core.models import Checkpoint

    ckpt = Checkpoint.objects.get(job=job, sequence=sequence)
    return set(ckpt.replica_nodes.values_list("pk", flat=True)) | ({ckpt.node_id} if ckpt.node_id else set())


def _restore_failed(job: Any, sequence: int, msg_id: str) -> dict[str, Any]:
    return {"type": "job_exited", "job_id": job.pk, "returncode": -1, "step": 0, "result": {},
            "reason": "restore checkpoint missing or corrupt", "restore_sequence": sequence, "msg_id": msg_id}


@pytest.mark.asyncio
async def test_a_missing_restore_replica_falls_back_to_the_next_and_work_lost_is_from_the_step_resumed() -> None:
    from portal.control.loop.ticks import control_tick
    from portal.core.models import Job, Migration
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", port=9001)
    near, b = await _online("near", port=9002)
    far, c = await _online("far", port=9003)
    job = await db(make_running_job)(src)
    await db(_started_ago)(job, 200.0)  # the run that wrote both checkpoints below
    await db(_checkpoint)(job, src, 1, 100.0, far)  # older copy on "far"
    await db(_checkpoint)(job, src, 2, 10.0, near)  # newest copy on "near", which has pruned it
    await a.send({"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {}, "jobs": [{"job_id": job.pk,
                                                                                     "step": 230}]})
    await until(lambda: Job.objects.get(pk=job.pk).progress_step == 230, what="the progress recorded")
    await db(request_reclaim)(src, None, 0.0)
    await a.expect("killswitch")
    await a.close()  # the reclaimed node is gone: its own copies are out of reach
    start = await b.expect("start_job")
    assert start["restore_sequence"] == 2
    planned = (await db(Migration.objects.get)(job=job)).work_lost_s
    assert 9 < planned < 20
    await b.send(_restore_failed(job, 2, "x-1"))
    await b.expect("received")
    assert near.pk not in await db(_holders)(job, 2)  # that copy is gone from the portal's record
    assert (await db(Job.objects.get)(pk=job.pk)).state == "queued"
    await db(control_tick)()
    start = await c.expect("start_job")
    assert start["restore_sequence"] == 1
    await c.send({"type": "job_started", "job_id": job.pk, "restored_sequence": 1, "restored_step": 100,
                  "msg_id": "x-2"})
    await c.expect("received")
    mig = await db(Migration.objects.get)(job=job)
    # Steps 100 to 230 thrown away (from the older step actually resumed, not 200) at 0.9 s a step (90 s
    # between the checkpoints of steps 100 and 200).
    assert mig.success and mig.work_lost_s == pytest.approx(130 * 0.9, rel=0.01)
    job = await db(Job.objects.get)(pk=job.pk)
    assert job.state == "running" and job.progress_step == 100
    assert not [m for m in b.seen if m.get("type") == "start_job"]  # "near" was not asked again
    for agent in (b, c):
        await agent.close()


@pytest.mark.asyncio
async def test_a_job_whose_copies_are_all_gone_is_placed_a_bounded_number_of_times_then_starts_from_scratch() -> None:
    from portal.control.loop.ticks import control_tick
    from portal.control.models import MigrationWork
    from portal.core.models import Job, Migration
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", port=9001)
    near, b = await _online("near", port=9002)
    job = await db(make_running_job)(src)
    await db(_checkpoint)(job, src, 1, 100.0, near)
    await db(_checkpoint)(job, src, 2, 10.0, near)  # both pruned on "near" already
    await db(request_reclaim)(src, None, 0.0)
    await a.expect("killswitch")
    await a.close()  # the reclaimed node is gone: its own copies are out of reach
    starts = []
    for k in range(6):  # every start fails while it names a checkpoint
        start = await b.expect("start_job")
        starts.append(start["restore_sequence"])
        if start["restore_sequence"] is None:
            break
        await b.send(_restore_failed(job, start["restore_sequence"], f"y-{k}"))
        await b.expect("received")
        await db(control_tick)()
    assert starts == [2, 1, None]  # each copy tried once, then from scratch: no loop
    await b.send({"type": "job_started", "job_id": job.pk, "restored_sequence": None, "restored_step": None,
                  "msg_id": "y-9"})
    await b.expect("received")
    await until(lambda: Job.objects.get(pk=job.pk).state == "running", what="running from scratch")
    work = await db(MigrationWork.objects.get)(migration__job=job)
    assert work.restore_failures == 2 and work.phase == "done"
    mig = await db(Migration.objects.get)(job=job)
    assert mig.checkpoint_id is None and not mig.success
    await b.close()


@pytest.mark.asyncio
async def test_restores_are_given_up_after_the_bound_even_if_copies_remain() -> None:
    from portal.control.loop.ticks import control_tick
    from portal.control.models import MigrationWork
    from portal.control.reclaim.workflow import MAX_RESTORE_FAILURES
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", port=9001)
    near, b = await _online("near", port=9002)
    job = await db(make_running_job)(src)
    for seq in range(1, MAX_RESTORE_FAILURES + 3):
        await db(_checkpoint)(job, src, seq, 100.0 - seq, near)
    await db(request_reclaim)(src, None, 0.0)
    await a.expect("killswitch")
    await a.close()  # the reclaimed node is gone: its own copies are out of reach
    starts = []
    for k in range(MAX_RESTORE_FAILURES + 3):
        start = await b.expect("start_job")
        starts.append(start["restore_sequence"])
        if start["restore_sequence"] is None:
            break
        await b.send(_restore_failed(job, start["restore_sequence"], f"z-{k}"))
        await b.expect("received")
        await db(control_tick)()
    assert len(starts) == MAX_RESTORE_FAILURES + 1 and starts[-1] is None
    assert (await db(MigrationWork.objects.get)(migration__job=job)).restore_failures == MAX_RESTORE_FAILURES
    await b.close()


@pytest.mark.asyncio
async def test_hello_and_drop_reports_keep_the_record_of_what_a_node_holds_in_step() -> None:
    node, token = await db(make_node)("n1")
    other, _ = await db(make_node)("n2")
    job = await db(make_running_job)(other)
    await db(_checkpoint)(job, other, 1, 50.0, node)
    await db(_checkpoint)(job, other, 2, 40.0, node)
    await db(_checkpoint)(job, other, 3, 30.0, None)
    agent = FakeAgent(token)
    assert await agent.connect()
    held = [{"job_id": job.pk, "sequence": 2, "sha256": "2".rjust(64, "0")},
            {"job_id": job.pk, "sequence": 3, "sha256": "3".rjust(64, "0")}]  # 1 pruned, 3 received
    await agent.send({"type": "hello", "agent_version": "t", "data_host": "127.0.0.1", "data_port": 9000,
                      "jobs": [], "gpus": [], "checkpoints": held})
    await agent.expect("welcome")
    assert await db(_holders)(job, 1) == {other.pk}
    assert await db(_holders)(job, 2) == {other.pk, node.pk}
    assert await db(_holders)(job, 3) == {other.pk, node.pk}  # confirmed by the agent
    await agent.send({"type": "checkpoints_dropped", "job_id": job.pk, "sequences": [2], "reason": "pruned",
                      "msg_id": "d-1"})
    await agent.expect("received")
    assert await db(_holders)(job, 2) == {other.pk}
    await agent.close()
    # A malformed item (a job writes its own manifests) costs neither the hello nor the copies it holds.
    again = FakeAgent(token)
    assert await again.connect()
    await again.send({"type": "hello", "agent_version": "t", "data_host": "127.0.0.1", "data_port": 9000,
                      "jobs": [], "gpus": [], "checkpoints": [{"job_id": job.pk, "sequence": 0, "sha256": "zz"}]})
    await again.expect("welcome")
    assert await db(_holders)(job, 3) == {other.pk, node.pk}
    await again.close()
