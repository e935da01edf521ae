"""Reclaim workflows through the real consumer and tasks with fake agents (design §1 warn → drain → force, §3, §4)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from control_helpers import FakeAgent, db, make_node, make_running_job, until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.timeout(30)]

SHA = "b" * 64


async def _online(name: str, building: str, port: int) -> tuple[object, FakeAgent]:
    node, token = await db(make_node)(name, building)
    agent = FakeAgent(token, data_port=port)
    assert await agent.connect()
    await agent.hello()
    return node, agent


def _add_checkpoint(job: object, node: object, sequence: int, replica: object | None) -> object:
    from django.utils import timezone

    from portal.core.models import Checkpoint

    now = timezone.now()
    ckpt = Checkpoint.objects.create(job=job, sequence=sequence, node=node, step=10 * sequence, size_bytes=1000,
                                     sha256=SHA, taken_at=now - dt.timedelta(seconds=1), completed_at=now)
    if replica is not None:
        ckpt.replica_nodes.add(replica)
    return ckpt


async def test_scheduled_reclaim_moves_job_through_every_phase() -> None:
    from portal.core.models import DecisionLog, Job, Migration, Node, ReclaimEvent
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", "A", 9001)
    dst, b = await _online("dst", "A", 9002)
    job = await db(make_running_job)(src)
    reclaim = await db(request_reclaim)(src, None, 60.0)

    notice = await a.expect("reclaim_notice")
    assert 0 < notice["deadline_in_s"] <= 60
    final = await a.expect("checkpoint")
    assert final["final"] is True and final["job_id"] == job.pk
    assert await db(DecisionLog.objects.filter(reclaim=reclaim, kind="p2").count)() == 1
    assert await db(DecisionLog.objects.filter(reclaim=reclaim, kind="p3").count)() == 1
    mig = await db(Migration.objects.get)(job=job)
    assert mig.mode == "planned" and mig.destination_id == dst.pk and mig.assigned_rate_bytes_per_s > 0
    assert (await db(Job.objects.get)(pk=job.pk)).state == "migrating"

    await a.send({"type": "checkpoint_done", "job_id": job.pk, "sequence": 1, "step": 77, "size_bytes": 1000,
                  "sha256": SHA, "taken_at": 1.0, "final": True, "compat": {"compute_capability": "8.6"}})
    expect = await b.expect("expect_checkpoint")
    send = await a.expect("send_checkpoint")
    assert expect["transfer_id"] == send["transfer_id"] and expect["token"] == send["token"]
    assert send["dest_port"] == 9002 and send["flow_class"] == "migration" and send["rate_bytes_per_s"] > 0

    # The receiver verified the sha256; the sender's report alone does not start anything.
    await a.send({"type": "transfer_sent", "transfer_id": send["transfer_id"], "ok": True, "attempts": 1,
                  "elapsed_s": 0.1, "errors": []})
    await b.send({"type": "transfer_received", "transfer_id": send["transfer_id"], "sha256": SHA,
                  "size_bytes": 1000})
    start = await b.expect("start_job")
    assert start["restore_sequence"] == 1 and start["restore_sha256"] == SHA
    await b.send({"type": "job_started", "job_id": job.pk, "restored_sequence": 1})
    await until(lambda: Migration.objects.get(pk=mig.pk).finished_at is not None, what="migration finished")
    job = await db(Job.objects.get)(pk=job.pk)
    assert job.state == "running"
    mig = await db(Migration.objects.get)(pk=mig.pk)
    assert mig.success and mig.finished_at and mig.downtime_s is not None
    assert (await db(Node.objects.get)(pk=src.pk)).state == "reclaimed"
    assert (await db(ReclaimEvent.objects.get)(pk=reclaim.pk)).outcome == "completed"
    await a.close()
    await b.close()


async def test_scheduled_reclaim_runs_once_even_if_redelivered() -> None:
    from portal.control.tasks import run_reclaim
    from portal.core.models import Migration
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", "A", 9001)
    _, b = await _online("dst", "B", 9002)
    job = await db(make_running_job)(src)
    reclaim = await db(request_reclaim)(src, None, 60.0)
    await a.expect("checkpoint")
    assert await db(run_reclaim)(reclaim.pk) == "already planned"
    assert await db(Migration.objects.filter(job=job).count)() == 1
    await a.close()
    await b.close()


async def test_too_little_notice_is_degraded_and_resumes_from_replica() -> None:
    from portal.core.models import Migration
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", "A", 9001)
    holder, b = await _online("holder", "A", 9002)
    job = await db(make_running_job)(src, 50_000_000)
    await db(_add_checkpoint)(job, src, 3, holder)
    await db(request_reclaim)(src, None, 0.5)  # C/b + T_r > 0.5 s
    await a.expect("stop_job")
    start = await b.expect("start_job")  # the holder is a feasible destination: no copy needed
    assert start["restore_sequence"] == 3
    mig = await db(Migration.objects.get)(job=job)
    assert mig.mode == "degraded" and mig.degraded_reason in ("notice", "capacity", "deadline")
    await a.close()
    await b.close()


async def test_emergency_reclaim_copies_replica_to_p2_destination() -> None:
    from portal.control.models import Transfer
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import Migration, Node
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", "A", 9001)
    holder, b = await _online("holder", "A", 9002)
    _, c = await _online("dest", "B", 9003)
    job = await db(make_running_job)(src)
    await db(_add_checkpoint)(job, src, 2, holder)
    # The holder keeps the replica but cannot host the job (its provider switched it off for new work).
    holder_row = await db(Node.objects.get)(pk=holder.pk)
    await db(node_lifecycle.start_draining)(holder_row)
    await db(request_reclaim)(src, None, 0.0)
    ks = await a.expect("killswitch")
    assert ks["engaged"] and ks["stop_jobs"]
    send = await b.expect("send_checkpoint")
    assert send["flow_class"] == "emergency" and send["dest_port"] == 9003
    await c.expect("expect_checkpoint")
    transfer = await db(Transfer.objects.get)(transfer_id=send["transfer_id"])
    assert transfer.dscp == 46 and transfer.token_hash != send["token"]
    await c.send({"type": "transfer_received", "transfer_id": send["transfer_id"], "sha256": SHA,
                  "size_bytes": 1000})
    start = await c.expect("start_job")
    assert start["restore_sequence"] == 2
    await c.send({"type": "job_started", "job_id": job.pk, "restored_sequence": 2})
    await until(lambda: Migration.objects.get(job=job).finished_at is not None, what="migration finished")
    mig = await db(Migration.objects.get)(job=job)
    assert mig.success and mig.mode == "degraded" and mig.work_lost_s >= 0
    for agent in (a, b, c):
        await agent.close()


async def test_transfer_from_the_wrong_node_is_refused() -> None:
    from portal.control.models import Transfer
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", "A", 9001)
    _, b = await _online("dst", "A", 9002)
    job = await db(make_running_job)(src)
    await db(request_reclaim)(src, None, 60.0)
    await a.expect("checkpoint")
    await a.send({"type": "checkpoint_done", "job_id": job.pk, "sequence": 1, "step": 7, "size_bytes": 1000,
                  "sha256": SHA, "taken_at": 1.0, "final": True, "compat": {}})
    send = await a.expect("send_checkpoint")
    # The source claims to have received its own transfer: refused, the transfer stays issued.
    await a.send({"type": "transfer_received", "transfer_id": send["transfer_id"], "sha256": SHA,
                  "size_bytes": 1000})
    assert "does not involve this node" in (await a.expect("error"))["reason"]
    assert (await db(Transfer.objects.get)(transfer_id=send["transfer_id"])).state == "issued"
    await a.close()
    await b.close()


async def test_lost_heartbeat_is_detected_by_the_tick() -> None:
    from django.utils import timezone

    from portal.control.loop.ticks import control_tick  # a one-off tick: no restart grace
    from portal.core.models import Job, Migration, Node, ReclaimEvent

    src, a = await _online("src", "A", 9001)
    holder, b = await _online("holder", "A", 9002)
    job = await db(make_running_job)(src)
    await db(_add_checkpoint)(job, src, 1, holder)
    await a.close()
    stale = timezone.now() - dt.timedelta(seconds=3600)
    await db(lambda: Node.objects.filter(pk=src.pk).update(last_heartbeat_at=stale))()
    await db(lambda: Node.objects.filter(pk=holder.pk).update(last_heartbeat_at=timezone.now()))()
    await db(control_tick)()
    assert (await db(Node.objects.get)(pk=src.pk)).state == "offline"
    event = await db(ReclaimEvent.objects.get)(node=src, kind="heartbeat_lost")
    assert event.finished_at is not None
    start = await b.expect("start_job")
    assert start["job_id"] == job.pk and start["restore_sequence"] == 1
    assert (await db(Job.objects.get)(pk=job.pk)).state == "migrating"
    assert await db(Migration.objects.filter(job=job, reclaim=event).exists)()
    await b.close()


async def test_p1_tick_sets_interval_and_logs_decision() -> None:
    from portal.control.tasks import control_tick
    from portal.core.models import DecisionLog, Job

    src, a = await _online("src", "A", 9001)
    job = await db(make_running_job)(src)
    await db(control_tick)()
    msg = await a.expect("set_interval")
    job = await db(Job.objects.get)(pk=job.pk)
    assert msg["interval_s"] == pytest.approx(job.checkpoint_interval_s)
    assert job.checkpoint_interval_s <= 2 * job.loss_budget_s  # Eq. 9 upper bound
    assert await db(DecisionLog.objects.filter(kind="p1", job=job).exists)()
    await db(control_tick)()  # unchanged plan: nothing resent
    assert await a.nothing(0.3)
    await a.close()


async def test_deadline_forces_and_falls_back_to_the_replica() -> None:
    """The final checkpoint never comes: at the deadline the kill-switch engages, the job resumes from the
    pre-synced replica and the reclaim is recorded as forced (the provider always wins)."""
    from django.utils import timezone

    from portal.control.tasks import control_tick
    from portal.core.models import Migration, Node, ReclaimEvent
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", "A", 9001)
    holder, b = await _online("holder", "A", 9002)
    job = await db(make_running_job)(src)
    await db(_add_checkpoint)(job, src, 4, holder)
    reclaim = await db(request_reclaim)(src, None, 3.0)
    assert (await a.expect("checkpoint"))["final"]  # ... and the agent never answers
    # The deadline comes (moved to now instead of waiting three seconds for it).
    await db(lambda: ReclaimEvent.objects.filter(pk=reclaim.pk).update(deadline_at=timezone.now()))()
    await db(control_tick)()
    assert (await a.expect("killswitch"))["engaged"]
    assert (await b.expect("start_job"))["restore_sequence"] == 4
    reclaim = await db(ReclaimEvent.objects.get)(pk=reclaim.pk)
    assert reclaim.outcome == "forced" and reclaim.finished_at is not None
    assert (await db(Node.objects.get)(pk=src.pk)).state == "reclaimed"
    mig = await db(Migration.objects.get)(job=job)
    assert mig.mode == "degraded" and mig.degraded_reason == "deadline"
    await a.close()
    await b.close()


async def test_cancel_stops_the_job_on_its_node() -> None:
    from django.contrib.auth import get_user_model

    from portal.core.models import Job
    from portal.core.services.jobs import cancel_job

    src, a = await _online("src", "A", 9001)
    job = await db(make_running_job)(src)
    admin = await db(lambda: get_user_model().objects.create_superuser("root", "r@x", "pw"))()
    await db(cancel_job)(job, admin)
    stop = await a.expect("stop_job")
    assert stop["job_id"] == job.pk and stop["reason"] == "cancelled"
    await a.send({"type": "job_exited", "job_id": job.pk, "returncode": -9, "step": 3, "result": {},
                  "reason": "cancelled"})
    assert await a.nothing(0.5)  # the stop report of a cancelled job is accepted: no refusal comes back
    assert (await db(Job.objects.get)(pk=job.pk)).state == "cancelled"
    await a.close()


async def test_destination_lost_mid_transfer_falls_back_instead_of_waiting_forever() -> None:
    """The destination vanishes while the final checkpoint is on its way: nothing will ever report that
    transfer, so losing the node fails it and the job resumes from the replica elsewhere."""
    from django.utils import timezone

    from portal.control.loop.ticks import control_tick  # a one-off tick: no restart grace
    from portal.control.models import Transfer
    from portal.core.models import Migration, Node
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", "A", 9001)
    dst, b = await _online("dst", "A", 9002)
    holder, c = await _online("holder", "B", 9003)
    job = await db(make_running_job)(src)
    await db(_add_checkpoint)(job, src, 1, holder)
    await db(request_reclaim)(src, None, 60.0)
    await a.expect("checkpoint")
    await a.send({"type": "checkpoint_done", "job_id": job.pk, "sequence": 2, "step": 20, "size_bytes": 1000,
                  "sha256": SHA, "taken_at": 1.0, "final": True, "compat": {}})
    send = await a.expect("send_checkpoint")
    assert send["dest_port"] == 9002
    await b.close()
    stale = timezone.now() - dt.timedelta(seconds=3600)
    await db(lambda: Node.objects.filter(pk=dst.pk).update(last_heartbeat_at=stale))()
    await db(lambda: Node.objects.exclude(pk=dst.pk).update(last_heartbeat_at=timezone.now()))()
    await db(control_tick)()
    assert (await db(Transfer.objects.get)(transfer_id=send["transfer_id"])).state == "failed"
    start = await c.expect("start_job")
    assert start["job_id"] == job.pk and start["restore_sequence"] == 1
    mig = await db(Migration.objects.get)(job=job)
    assert mig.mode == "degraded" and mig.degraded_reason == "transfer failed"
    await a.close()
    await c.close()


async def test_killswitch_fires_at_the_deadline_even_if_recovery_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider wins whatever happened: a recovery that raises (and rolls back, to be retried) must not
    take the deadline's kill-switch down with it."""
    from portal.control.reclaim import apply as reclaims
    from portal.core.models import ReclaimEvent
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", "A", 9001)
    holder, b = await _online("holder", "A", 9002)
    job = await db(make_running_job)(src)
    await db(_add_checkpoint)(job, src, 4, holder)
    reclaim = await db(request_reclaim)(src, None, 60.0)
    await a.expect("checkpoint")
    past = reclaim.requested_at - dt.timedelta(seconds=1)
    await db(lambda: ReclaimEvent.objects.filter(pk=reclaim.pk).update(deadline_at=past))()

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("recovery failed")

    monkeypatch.setattr(reclaims, "recover_from_replica", broken)
    with pytest.raises(RuntimeError):
        await db(reclaims.enforce_deadline)(reclaim.pk)
    ks = await a.expect("killswitch")
    assert ks["engaged"] and ks["stop_jobs"]
    assert (await db(ReclaimEvent.objects.get)(pk=reclaim.pk)).finished_at is None  # retried by the next tick
    monkeypatch.undo()
    assert await db(reclaims.enforce_deadline)(reclaim.pk) == "forced"
    await a.close()
    await b.close()


async def _emergency_whose_recovery_fails(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, FakeAgent, FakeAgent, Any]:
    """A running job on ``src`` (agent a) with a replica on ``holder`` (agent b), and a recovery that raises."""
    from portal.control.reclaim import apply as reclaims

    src, a = await _online("src", "A", 9001)
    holder, b = await _online("holder", "A", 9002)
    job = await db(make_running_job)(src)
    await db(_add_checkpoint)(job, src, 4, holder)

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("recovery failed")

    monkeypatch.setattr(reclaims, "recover_from_replica", broken)
    return src, a, b, job


async def test_emergency_kill_switch_is_committed_before_the_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    """An emergency frees the provider's machine first: its kill-switch is committed on its own, so a recovery
    that raises (and rolls back, to be retried) has already sent it; the retry recovers the job once."""
    from portal.control import tasks
    from portal.control.models import AgentCommand
    from portal.core.models import Migration, ReclaimEvent
    from portal.core.services.reclaims import request_reclaim

    src, a, b, job = await _emergency_whose_recovery_fails(monkeypatch)
    reclaim = await db(request_reclaim)(src, None, 0.0)  # the inline relay runs run_reclaim, which raises
    ks = await a.expect("killswitch")
    assert ks["engaged"] and ks["stop_jobs"] and ks["reclaim_id"] == reclaim.pk
    assert (await db(ReclaimEvent.objects.get)(pk=reclaim.pk)).finished_at is None
    assert await db(Migration.objects.filter(job=job).count)() == 0  # the recovery rolled back
    monkeypatch.undo()
    assert await db(tasks.run_reclaim.run)(reclaim.pk) == "degraded"
    sent = AgentCommand.objects.filter(node=src, kind="killswitch")
    before = await db(sent.count)()
    assert await db(tasks.run_reclaim.run)(reclaim.pk) == "already planned"
    assert await db(sent.count)() == before  # a redelivery sends nothing more
    assert await db(Migration.objects.filter(job=job).count)() == 1
    await a.close()
    await b.close()


async def test_a_retried_emergency_never_switches_off_a_node_lent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recovery that keeps failing is retried; once the provider has lent the node again, a retry must not
    engage its kill-switch (its new jobs would be stopped)."""
    from portal.control import tasks
    from portal.control.models import AgentCommand
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import Node
    from portal.core.services.reclaims import request_reclaim

    src, a, b, _ = await _emergency_whose_recovery_fails(monkeypatch)
    reclaim = await db(request_reclaim)(src, None, 0.0)
    assert (await a.expect("killswitch"))["engaged"]

    def lend_again() -> None:
        from django.db import transaction

        with transaction.atomic():
            node_lifecycle.lend_again(Node.objects.select_for_update().get(pk=src.pk))

    await db(lend_again)()
    engaged = AgentCommand.objects.filter(node=src, kind="killswitch", payload__engaged=True)
    before = await db(engaged.count)()
    with pytest.raises(RuntimeError):
        await db(tasks.run_reclaim.run)(reclaim.pk)
    assert await db(engaged.count)() == before
    await a.close()
    await b.close()


async def test_a_node_declared_lost_is_not_live_even_with_its_session_open() -> None:
    from portal.core.campus import live_node_pks as live_nodes
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import Node

    a_node, a = await _online("a", "A", 9001)
    b_node, b = await _online("b", "A", 9002)
    assert await db(live_nodes)() == {a_node.pk, b_node.pk}
    await db(node_lifecycle.go_offline)(await db(Node.objects.get)(pk=b_node.pk))  # heartbeat lost, socket open
    assert await db(live_nodes)() == {a_node.pk}
    await a.close()
    await b.close()


async def test_overlapping_reclaims_replan_the_first_flow_jointly_and_push_its_new_rate() -> None:
    """Two scheduled reclaims whose migrations share the destination's access link: the second P3 decision
    re-plans the first flow (still transferring), persists its new rate, logs it and pushes ``set_rate`` to its
    sender (design §4, Theorem 3: never below its own r_min)."""
    from portal.control.models import Transfer
    from portal.core.models import DecisionLog, Migration
    from portal.core.services.reclaims import request_reclaim

    src1, a = await _online("src1", "A", 9001)
    src2, b = await _online("src2", "B", 9002)
    dst, c = await _online("dst", "A", 9003)
    job1 = await db(make_running_job)(src1)
    job2 = await db(make_running_job)(src2)
    # src2 lends only the GPU its job holds, so job1 must go to dst; src1 is draining when src2 goes: job2 → dst.
    from portal.core.models import Node

    await db(lambda: Node.objects.filter(pk=src2.pk).update(gpu_floor=1))()
    reclaim1 = await db(request_reclaim)(src1, None, 120.0)
    await a.expect("checkpoint")
    await a.send({"type": "checkpoint_done", "job_id": job1.pk, "sequence": 1, "step": 7, "size_bytes": 1000,
                  "sha256": SHA, "taken_at": 1.0, "final": True, "compat": {}})
    send = await a.expect("send_checkpoint")
    assert send["dest_port"] == 9003
    mig1 = await db(Migration.objects.get)(job=job1)
    first_rate = mig1.assigned_rate_bytes_per_s
    assert send["rate_bytes_per_s"] == pytest.approx(first_rate)

    reclaim2 = await db(request_reclaim)(src2, None, 60.0)
    await b.expect("reclaim_notice")
    update = await a.expect("set_rate")
    assert update["transfer_id"] == send["transfer_id"]
    mig1 = await db(Migration.objects.get)(pk=mig1.pk)
    mig2 = await db(Migration.objects.get)(job=job2)
    assert mig2.destination_id == dst.pk and mig2.mode == "planned"
    assert mig1.assigned_rate_bytes_per_s == pytest.approx(update["rate_bytes_per_s"])
    assert mig1.assigned_rate_bytes_per_s != pytest.approx(first_rate)
    transfer = await db(Transfer.objects.get)(transfer_id=send["transfer_id"])
    assert transfer.rate_bytes_per_s == pytest.approx(update["rate_bytes_per_s"])
    log = await db(DecisionLog.objects.get)(reclaim=reclaim2, kind="p3")
    assert str(log.decision_id) == update["decision_id"]
    ids = {f["id"] for f in log.request["flows"]}
    assert {f"job-{job2.pk}", f"inflight-{mig1.pk}"} <= ids
    (replanned,) = log.response["replanned"]
    assert replanned["migration"] == mig1.pk and replanned["old_rate"] == pytest.approx(first_rate)
    admitted = {f["id"]: f for f in log.response["admitted"]}
    first = admitted[f"inflight-{mig1.pk}"]
    assert first["rate"] >= first["min_rate"] > 0  # Theorem 3, r_min from its own deadline
    assert reclaim1.pk != reclaim2.pk
    for agent in (a, b, c):
        await agent.close()


async def test_transfer_whose_live_sender_never_reports_times_out_and_falls_back_to_the_replica() -> None:
    """Both agents stay connected but the sender never reports: past the token expiry the control tick fails
    the transfer and the job resumes from its pre-synced replica, as when a node is lost."""
    from django.utils import timezone

    from portal.control.models import Transfer
    from portal.control.tasks import control_tick
    from portal.core.models import Migration, Node
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("src", "A", 9001)
    _dst, b = await _online("dst", "A", 9002)
    holder, c = await _online("holder", "B", 9003)
    job = await db(make_running_job)(src)
    await db(_add_checkpoint)(job, src, 1, holder)
    await db(request_reclaim)(src, None, 60.0)
    await a.expect("checkpoint")
    await a.send({"type": "checkpoint_done", "job_id": job.pk, "sequence": 2, "step": 20, "size_bytes": 1000,
                  "sha256": SHA, "taken_at": 1.0, "final": True, "compat": {}})
    send = await a.expect("send_checkpoint")
    await db(lambda: Node.objects.update(last_heartbeat_at=timezone.now()))()
    await db(control_tick)()  # not expired yet: nothing happens
    assert (await db(Transfer.objects.get)(transfer_id=send["transfer_id"])).state == "issued"
    past = timezone.now() - dt.timedelta(seconds=3600)
    await db(lambda: Transfer.objects.filter(transfer_id=send["transfer_id"]).update(expires_at=past))()
    await db(control_tick)()
    assert (await db(Transfer.objects.get)(transfer_id=send["transfer_id"])).state == "failed"
    start = await c.expect("start_job")
    assert start["job_id"] == job.pk and start["restore_sequence"] == 1
    mig = await db(Migration.objects.get)(job=job)
    assert mig.mode == "degraded" and mig.degraded_reason == "transfer failed"
    for agent in (a, b, c):
        await agent.close()


async def test_presync_holder_choice_is_logged_with_its_inputs() -> None:
    """The pre-sync replica holder is chosen like any decision: kind p2 in the decision log, inputs included."""
    from portal.core.models import DecisionLog

    src, a = await _online("src", "A", 9001)
    near, b = await _online("near", "A", 9002)
    _far, c = await _online("far", "B", 9003)
    job = await db(make_running_job)(src)
    await a.send({"type": "checkpoint_done", "job_id": job.pk, "sequence": 1, "step": 10, "size_bytes": 1000,
                  "sha256": SHA, "taken_at": 1.0, "final": False, "compat": {}})
    send = await a.expect("send_checkpoint")
    assert send["flow_class"] == "presync" and send["dest_port"] == 9002
    row = await db(DecisionLog.objects.filter(job=job, kind="p2").latest)("created_at")
    inputs = row.request["presync"]
    assert inputs["source"] == src.pk and inputs["sequence"] == 1
    assert {cand["id"] for cand in inputs["candidates"]} >= {near.pk}
    assert all("hazard_per_s" in cand and "building" in cand for cand in inputs["candidates"])
    assert row.response["holder"] == near.pk and "building" in row.response["reason"]
    for agent in (a, b, c):
        await agent.close()
