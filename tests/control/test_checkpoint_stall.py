"""A checkpoint's stall and transfer time reach the portal and P1 (design §2 "Asynchronous snapshots"): the agent's
``checkpoint_done`` carries the job's pause and write time, the sender's ``transfer_sent`` the copy's time; both
are validated at the boundary (a bad one is refused naming the field), stored on the Checkpoint, and the next P1
tick plans the job's interval from the stall, never shorter than the transfer."""

from __future__ import annotations

import pytest
from control_helpers import FakeAgent, db, make_node, make_running_job, until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.timeout(30)]

SHA = "c" * 64


async def _online(name: str, building: str, port: int) -> tuple[object, FakeAgent]:
    node, token = await db(make_node)(name, building)
    agent = FakeAgent(token, data_port=port)
    assert await agent.connect()
    await agent.hello()
    return node, agent


def _done(job_id: int, sequence: int, **extra: object) -> dict[str, object]:
    return {"type": "checkpoint_done", "job_id": job_id, "sequence": sequence, "step": 10 * sequence,
            "size_bytes": 1_000_000, "sha256": SHA, "taken_at": 1.0, "final": False, "compat": {}, **extra}


@pytest.mark.parametrize(("field", "value"), [("stall_s", -0.5), ("write_s", 1e12), ("stall_s", "2"),
                                              ("mode", "eventually")])
async def test_a_bad_stall_write_or_mode_is_refused_naming_the_field(field: str, value: object) -> None:
    from portal.core.models import Checkpoint

    src, a = await _online("src", "A", 9001)
    job = await db(make_running_job)(src)
    await a.send(_done(job.pk, 1, **{field: value}))
    assert f"checkpoint_done.{field}" in (await a.expect("error"))["reason"]
    assert not await db(Checkpoint.objects.filter(job=job).exists)()
    await a.close()


async def test_stall_and_transfer_reach_the_checkpoint_and_p1() -> None:
    from portal.control.models import Transfer
    from portal.control.tasks import control_tick
    from portal.core.models import Checkpoint, DecisionLog, Job

    src, a = await _online("src", "A", 9001)
    _, b = await _online("replica", "A", 9002)
    job = await db(make_running_job)(src)
    await a.send(_done(job.pk, 1, stall_s=0.25, write_s=3.5, mode="async"))
    send = await a.expect("send_checkpoint")  # the pre-sync of the new checkpoint to the replica
    ckpt = await db(Checkpoint.objects.get)(job=job, sequence=1)
    assert (ckpt.stall_s, ckpt.write_s, ckpt.mode, ckpt.transfer_s) == (0.25, 3.5, "async", None)

    await a.send({"type": "transfer_sent", "transfer_id": send["transfer_id"], "ok": True, "attempts": 1,
                  "elapsed_s": 700.0, "errors": []})
    await b.send({"type": "transfer_received", "transfer_id": send["transfer_id"], "sha256": SHA,
                  "size_bytes": 1_000_000})
    await until(lambda: Transfer.objects.get(transfer_id=send["transfer_id"]).state == "received",
                what="copy received")
    await until(lambda: Checkpoint.objects.get(pk=ckpt.pk).transfer_s is not None, what="transfer time stored")
    assert (await db(Checkpoint.objects.get)(pk=ckpt.pk)).transfer_s == 700.0

    await db(control_tick)()
    msg = await a.expect("set_interval")
    assert msg["interval_s"] >= 700.0  # never shorter than the copy (the sync rule gives 60 s here)
    job = await db(Job.objects.get)(pk=job.pk)
    assert job.checkpoint_interval_s == pytest.approx(msg["interval_s"])
    log = await db(DecisionLog.objects.filter(kind="p1", job=job).latest)("pk")
    mine = next(j for j in log.request["jobs"] if j["id"] == job.pk)
    assert (mine["stall_s"], mine["transfer_s"]) == (0.25, 700.0)
    assert mine["loss_budget_mode"] == job.loss_budget_mode  # the log replays as the p1 request it was

    await a.send({"type": "transfer_sent", "transfer_id": send["transfer_id"], "ok": True, "attempts": 1,
                  "elapsed_s": -1.0, "errors": []})
    assert "transfer_sent.elapsed_s" in (await a.expect("error"))["reason"]
    await a.close()
    await b.close()
