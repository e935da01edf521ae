"""Owner use on lent GPUs at the portal (design §1 "Owner activity and MIG"): fake agents on the websocket send
heartbeats carrying ``gpu_state``; the node's policy decides: ``reclaim`` starts a reclaim after N heartbeats in a
row, ``notify`` tells the provider once per episode and reclaims nothing, ``ignore`` does neither. Malformed
``gpu_state`` is refused with the field named."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.layers import get_channel_layer

from tests.control.control_helpers import FakeAgent, db, make_node, make_running_job, until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.timeout(30),
              pytest.mark.usefixtures("in_process")]

LAB_GPU1 = {"index": 1, "mig_mode": "", "mig_instances": [],
            "foreign_processes": {"count": 2, "memory_bytes": 5100273664, "pids": [52001, 52002]}}
CLEAN_GPU1 = {"index": 1, "mig_mode": "", "mig_instances": [],
              "foreign_processes": {"count": 0, "memory_bytes": 0, "pids": []}}
GPU0 = {"index": 0, "mig_mode": "", "mig_instances": [], "foreign_processes": {"count": 0, "memory_bytes": 0}}


class Agent:
    """A fake agent whose node runs a borrowed job on GPU 0, and the provider's live channel (its toasts)."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.seq = 0

    async def start(self) -> Agent:
        from portal.core.models import Node

        self.node, token = await db(make_node)(f"n-{self.policy}")
        await db(Node.objects.filter(pk=self.node.pk).update)(owner_use_policy=self.policy)
        self.fake = FakeAgent(token)
        assert await self.fake.connect()
        await self.fake.hello()
        self.job = await db(make_running_job)(self.node)  # holds GPU 0
        self.layer = get_channel_layer()
        self.inbox = await self.layer.new_channel()
        await self.layer.group_add(f"provider-{self.node.provider_id}", self.inbox)
        return self

    async def beat(self, gpu1: dict[str, Any], streak: int) -> None:
        """One heartbeat; waits until the batch recorded it (the owner-use streak is then ``streak``)."""
        from portal.core.models import Node

        self.seq += 1
        before = (await db(Node.objects.get)(pk=self.node.pk)).last_heartbeat_at
        await self.fake.send({"type": "heartbeat", "seq": self.seq, "gpu_util": [90.0, 60.0], "egress": {},
                              "jobs": [{"job_id": self.job.pk, "step": self.seq}], "gpu_state": [GPU0, gpu1]})
        await self.fake.expect("heartbeat_ack")
        await until(lambda: Node.objects.get(pk=self.node.pk).last_heartbeat_at != before,
                    what=f"heartbeat {self.seq} recorded")
        assert (await db(Node.objects.get)(pk=self.node.pk)).owner_use_streak == streak

    async def toasts(self) -> list[dict[str, Any]]:
        """The owner-use notices the provider's browsers got since the last call."""
        out = []
        while True:
            try:
                msg = await asyncio.wait_for(self.layer.receive(self.inbox), 0.2)
            except TimeoutError:
                return out
            if msg.get("notice", {}).get("name") == "node.owner_using_gpu":
                out.append(msg["notice"])


async def test_policy_reclaim_starts_a_reclaim_after_three_heartbeats_with_owner_use() -> None:
    from portal.core.models import Gpu, Node, ReclaimEvent

    a = await Agent("reclaim").start()
    await a.beat(LAB_GPU1, 1)
    await a.beat(LAB_GPU1, 2)
    assert await db(ReclaimEvent.objects.count)() == 0
    await a.beat(LAB_GPU1, 3)
    reclaim = await db(ReclaimEvent.objects.get)(node=a.node)
    assert (reclaim.reason, reclaim.kind, reclaim.notice_s, reclaim.requested_by_id) == \
        ("owner use", "scheduled", 300.0, None)
    node = await db(Node.objects.get)(pk=a.node.pk)
    assert node.state in ("draining", "reclaimed")  # the run_reclaim task ran inline after the commit
    (toast,) = await a.toasts()
    assert "GPU 1 (2 processes, 5.1 GB)" in toast["text"] and "being taken back" in toast["text"]
    # Draining: no longer lent, so the streak ends and no second reclaim starts.
    await a.beat(LAB_GPU1, 0)
    assert await db(ReclaimEvent.objects.filter(node=a.node).count)() == 1
    gpu = await db(Gpu.objects.get)(node=a.node, index=1)
    assert (gpu.foreign_process_count, gpu.foreign_memory_bytes, gpu.foreign_pids) == (2, 5100273664, [52001, 52002])
    await a.fake.close()


async def test_policy_notify_tells_the_provider_once_per_episode_and_reclaims_nothing() -> None:
    from portal.core.models import ReclaimEvent

    a = await Agent("notify").start()
    await a.beat(LAB_GPU1, 1)
    await a.beat(LAB_GPU1, 2)
    await a.beat(CLEAN_GPU1, 0)  # the episode broke off before the threshold
    await a.beat(LAB_GPU1, 1)
    await a.beat(LAB_GPU1, 2)
    assert await a.toasts() == []
    await a.beat(LAB_GPU1, 3)
    await a.beat(LAB_GPU1, 4)
    toasts = await a.toasts()
    assert len(toasts) == 1 and "set the node to be reclaimed automatically" in toasts[0]["text"]
    assert await db(ReclaimEvent.objects.count)() == 0
    await a.beat(CLEAN_GPU1, 0)
    for streak in (1, 2, 3):  # a new episode: told again
        await a.beat(LAB_GPU1, streak)
    assert len(await a.toasts()) == 1
    await a.fake.close()


async def test_policy_ignore_does_nothing_but_the_gpu_rows_still_show_the_processes() -> None:
    from portal.core.models import Gpu, ReclaimEvent

    a = await Agent("ignore").start()
    for _ in range(4):
        await a.beat(LAB_GPU1, 0)
    assert await a.toasts() == []
    assert await db(ReclaimEvent.objects.count)() == 0
    assert (await db(Gpu.objects.get)(node=a.node, index=1)).foreign_process_count == 2
    await a.fake.close()


MALFORMED = [  # (gpu_state as the agent's JSON text, the field the refusal names)
    ('[{"index": 0, "mig_mode": "", "foreign_processes": {"count": 1, "memory_bytes": NaN}}]',
     "heartbeat.gpu_state[0].foreign_processes.memory_bytes"),
    ('[{"index": 0, "mig_mode": "", "foreign_processes": {"count": -2, "memory_bytes": 0}}]',
     "heartbeat.gpu_state[0].foreign_processes.count"),
    ('[{"index": 0, "mig_mode": "enabled", "mig_instances": [{"uuid": "", "memory_bytes": 1}], '
     '"foreign_processes": {"count": 0, "memory_bytes": 0}}]', "heartbeat.gpu_state[0].mig_instances[0].uuid"),
    ('{"index": 0}', "heartbeat.gpu_state"),
]


async def test_a_hello_stores_the_mig_layout_and_malformed_gpu_state_is_refused_with_the_field_named() -> None:
    from portal.control.models import RejectedMessage
    from portal.core.models import Gpu

    node, token = await db(make_node)("n-mig", gpus=1)
    agent = FakeAgent(token)
    assert await agent.connect()
    instances = [{"uuid": f"MIG-{k}", "memory_bytes": (k + 1) * 10 * 2**30} for k in range(3)]
    await agent.send({"type": "hello", "agent_version": "test", "data_host": "127.0.0.1", "data_port": 9000,
                      "jobs": [], "gpus": [{"index": 0, "model": "A100 80GB", "vram_gb": 80, "capability": 8.0}],
                      "gpu_state": [{"index": 0, "mig_mode": "enabled", "mig_instances": instances,
                                     "foreign_processes": {"count": 0, "memory_bytes": 0}}]})
    await agent.expect("welcome")
    gpu = await db(Gpu.objects.get)(node=node, index=0)
    assert gpu.mig_mode == "enabled" and gpu.mig_instances == instances and gpu.activity_at is not None
    for seq, (gpu_state, field) in enumerate(MALFORMED, start=1):
        await agent.send(f'{{"type": "heartbeat", "seq": {seq}, "gpu_util": [], "egress": {{}}, "jobs": [], '
                         f'"gpu_state": {gpu_state}}}')
        error = await agent.expect("error")
        assert error["reason"].startswith(field + ":"), error
        rejected = await db(RejectedMessage.objects.filter(node=node).order_by("-pk").first)()
        assert rejected.reason.startswith(field) and rejected.message_type == "heartbeat"
    assert await db(RejectedMessage.objects.filter(node=node).count)() == len(MALFORMED)
    assert await db(Gpu.objects.filter(node=node, foreign_process_count__gt=0).count)() == 0  # nothing recorded
    assert (await db(Gpu.objects.get)(node=node, index=0)).mig_instances == instances
    await agent.close()

