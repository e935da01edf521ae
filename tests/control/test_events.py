"""The events people see (docs/design.md §9.12), emitted where the state changes, through the real consumer,
handlers and reclaim workflow with fake agents: who gets which sentence, and that a checkpoint tells nobody."""

from __future__ import annotations

import re
from typing import Any

import pytest
from control_helpers import FakeAgent, db, make_node, make_running_job, until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]

SHA = "c" * 64


@pytest.fixture
def notices(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every notice delivered (after its commit), in order, instead of sending it to browsers."""
    from portal.core import events

    delivered: list[Any] = []
    monkeypatch.setattr(events, "DELIVERIES", [delivered.append])
    return delivered


async def _online(name: str, building: str, port: int) -> tuple[Any, FakeAgent]:
    node, token = await db(make_node)(name, building)
    agent = FakeAgent(token, data_port=port)
    assert await agent.connect()
    await agent.hello()
    return node, agent


def _checkpoint(job: Any, node: Any, sequence: int, replica: Any) -> None:
    from django.utils import timezone

    from portal.core.models import Checkpoint

    now = timezone.now()
    ckpt = Checkpoint.objects.create(job=job, sequence=sequence, node=node, step=10 * sequence, size_bytes=1000,
                                     sha256=SHA, taken_at=now, completed_at=now)
    ckpt.replica_nodes.add(replica)


def _by_name(notices: list[Any]) -> dict[str, Any]:
    return {n.name: n for n in notices}


@pytest.mark.asyncio
async def test_a_scheduled_reclaim_warns_then_moves_the_job_by_name_and_gives_the_node_back(
        notices: list[Any]) -> None:
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("lab-a-01", "A", 9001)
    _, b = await _online("lab-a-03", "A", 9002)
    notices.clear()  # the agents' hello: "online and lent"
    job = await db(make_running_job)(src)
    await db(request_reclaim)(src, None, 60.0)
    await a.expect("checkpoint")
    await a.send({"type": "checkpoint_done", "job_id": job.pk, "sequence": 1, "step": 77, "size_bytes": 1000,
                  "sha256": SHA, "taken_at": 1.0, "final": True, "compat": {}})
    send = await a.expect("send_checkpoint")
    await b.send({"type": "transfer_received", "transfer_id": send["transfer_id"], "sha256": SHA,
                  "size_bytes": 1000})
    await b.expect("start_job")
    await b.send({"type": "job_started", "job_id": job.pk, "restored_sequence": 1})
    await until(lambda: {n.name for n in notices} >= {"job.moved", "reclaim.done"}, what="moved and given back")

    # The researcher hears of it twice, in order; the lab once.
    assert [n.name for n in notices if n.audience == "researchers"] == ["job.warned", "job.moved"]
    assert [n.name for n in notices if n.audience != "researchers"] == ["reclaim.done"]
    seen = _by_name(notices)
    warned = seen["job.warned"]
    assert warned.text.startswith("Your job “j” must leave lab-a-01 by ")
    assert "move to lab-a-03; no work should be lost" in warned.text
    assert warned.text_others.startswith("Job “j” of researcher must leave lab-a-01")
    assert warned.groups == (f"group-{job.group_id}",) and warned.owner_id == job.owner_id
    assert warned.url == f"/jobs/{job.pk}/"
    assert seen["job.moved"].text == "Your job “j” moved to lab-a-03; no work lost."
    done = seen["reclaim.done"]
    assert done.text == "Your node lab-a-01 is yours again: 1 job moved off it with no work lost."
    assert done.groups == (f"provider-{src.provider_id}",)
    for n in notices:
        assert not re.search(r"#\d|\b(job|node) \d", n.text), n.text  # names, never ids
    await a.close()
    await b.close()


@pytest.mark.asyncio
async def test_a_checkpoint_of_a_running_job_tells_nobody(notices: list[Any]) -> None:
    from portal.core.models import Checkpoint

    src, a = await _online("lab-a-01", "A", 9001)
    notices.clear()
    job = await db(make_running_job)(src)
    for sequence in (1, 2, 3):
        await a.send({"type": "checkpoint_done", "job_id": job.pk, "sequence": sequence, "step": 10 * sequence,
                      "size_bytes": 1000, "sha256": SHA, "taken_at": float(sequence), "final": False,
                      "compat": {}})
    await until(lambda: Checkpoint.objects.filter(job=job).count() == 3, what="three checkpoints recorded")
    assert notices == []
    await a.close()


@pytest.mark.asyncio
async def test_an_emergency_reclaim_tells_the_researcher_why_and_the_admins_it_was_forced(
        notices: list[Any]) -> None:
    from portal.core.services.reclaims import request_reclaim

    src, a = await _online("lab-a-01", "A", 9001)
    holder, b = await _online("lab-a-02", "A", 9002)
    notices.clear()
    job = await db(make_running_job)(src)
    await db(_checkpoint)(job, src, 3, holder)
    await db(request_reclaim)(src, None, 0.0)
    await b.expect("start_job")
    seen = _by_name(notices)
    assert set(seen) == {"job.lost_work", "reclaim.done", "reclaim.forced"}
    lost = seen["job.lost_work"]
    assert lost.text.startswith("Your job “j” ")
    assert "leave lab-a-01 because its lab took the node back without notice" in lost.text
    assert seen["reclaim.forced"].text.startswith("Lab took lab-a-01 back without notice: 1 job moved off it")
    assert seen["reclaim.forced"].groups == ("dashboard",)
    assert seen["reclaim.done"].groups == (f"provider-{src.provider_id}",)
    await a.close()
    await b.close()


@pytest.mark.asyncio
async def test_a_lost_node_tells_its_lab_and_the_admins_not_that_it_was_given_back(notices: list[Any]) -> None:
    from portal.control.reclaim.apply import node_lost

    src, a = await _online("lab-a-01", "A", 9001)
    holder, b = await _online("lab-a-02", "A", 9002)
    notices.clear()
    job = await db(make_running_job)(src)
    await db(_checkpoint)(job, src, 3, holder)
    await db(node_lost)(src.pk)
    seen = _by_name(notices)
    assert set(seen) == {"node.offline", "node.lost", "job.lost_work"}
    assert seen["node.offline"].text.startswith("Your node lab-a-01 went offline: its agent has not been heard")
    assert "Its 1 job resumes elsewhere" in seen["node.offline"].text
    assert seen["node.offline"].groups == (f"provider-{src.provider_id}",)
    assert seen["node.lost"].text.startswith("lab-a-01 (Lab) was lost: no heartbeat for ")
    assert seen["node.lost"].groups == ("dashboard",)
    assert "the node stopped answering" in seen["job.lost_work"].text
    await a.close()
    await b.close()


@pytest.mark.asyncio
async def test_placing_a_queued_job_names_it_and_its_node(notices: list[Any]) -> None:
    from django.contrib.auth import get_user_model

    from portal.control.loop.ticks import place_job
    from portal.core.models import Job, ResearchGroup

    _, a = await _online("lab-a-01", "A", 9001)
    notices.clear()

    def queued() -> Job:
        group = ResearchGroup.objects.create(name="NLP", slug="nlp")
        owner = get_user_model().objects.create_user("ada")
        return Job.objects.create(name="bert-finetune", owner=owner, group=group, command="python t.py",
                                  gpu_count=1, expected_runtime_s=600, ckpt_bytes_estimate=1000)

    job = await db(queued)()
    assert (await db(place_job)(job.pk)).startswith("placed")
    assert [(n.name, n.text) for n in notices] == [
        ("job.placed", "Your job “bert-finetune” was placed on lab-a-01 and is starting.")]
    assert notices[0].text_others == "Job “bert-finetune” of ada was placed on lab-a-01 and is starting."
    await a.close()


def _exit(node: Any, job: Any, returncode: int) -> None:
    from django.db import transaction

    from portal.control.link.handlers import job_exited

    with transaction.atomic():
        job_exited(node.pk, {"type": "job_exited", "job_id": job.pk, "returncode": returncode,
                             "reason": "exited", "step": 5, "result": {}})


@pytest.mark.parametrize(("returncode", "name", "words"), [
    (0, "job.finished", "Your job “j” finished after "),
    (2, "job.failed", "Your job “j” failed on lab-a-01 (exit code 2). Its output is on the job page"),
])
def test_a_job_that_ends_tells_its_group_how(notices: list[Any], returncode: int, name: str, words: str) -> None:
    node, _ = make_node("lab-a-01", "A")
    job = make_running_job(node)
    _exit(node, job, returncode)
    assert [n.name for n in notices] == [name]
    assert notices[0].text.startswith(words), notices[0].text
    assert notices[0].groups == (f"group-{job.group_id}",)


def test_a_change_rolled_back_tells_nobody(notices: list[Any]) -> None:
    from django.db import transaction

    from portal.core import events

    node, _ = make_node("lab-a-01", "A")
    job = make_running_job(node)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert events.emit("job.placed", job=job, node=node) is not None
        raise RuntimeError("the placement failed")
    assert notices == []


def test_the_catalogue_has_each_persons_events_with_its_audience() -> None:
    from portal.core.events import CATALOGUE

    audiences = {name: kind.audience for name, kind in CATALOGUE.items()}
    assert audiences == {
        "job.placed": "researchers", "job.warned": "researchers", "job.moved": "researchers",
        "job.lost_work": "researchers", "job.failed": "researchers", "job.finished": "researchers",
        "job.dependency_cancelled": "researchers", "job.preempted": "researchers",  # the fair queue (§16.6)
        "array.dependency_cancelled": "researchers", "array.finished": "researchers",  # one per array (§16.6)
        "job.idle_warning": "researchers", "job.loan_ending": "researchers",  # loans (§15)
        "job.released": "researchers", "job.resumed": "researchers",
        "reclaim.done": "provider", "node.returned": "provider", "node.offline": "provider",
        "reclaim.forced": "admins", "node.lost": "admins",
        "node.owner_using_gpu": "provider", "job.budget_at_risk": "admins",  # notify (§12)
    }
    assert all(kind.summary and kind.level in {"info", "ok", "warning", "bad"} for kind in CATALOGUE.values())
