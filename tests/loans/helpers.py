"""Helpers for the loans tests: a node whose agent is connected, a running job of a class, and what its agent
reports (heartbeats with GPU utilisation, the final checkpoint, the start after a resume)."""

from __future__ import annotations

import itertools
from typing import Any

SHA = "e" * 64
_ids = itertools.count()


def online_node(name: str, gpus: int = 2) -> Any:
    """A registered node whose agent opened a session and said hello (online, with a data address)."""
    from portal.control.link.handlers import hello, open_session
    from portal.core.models import Building, Link, Provider, Switch
    from portal.core.services.nodes import register_node

    provider, _ = Provider.objects.get_or_create(slug="lab", defaults={"name": "Lab"})
    core, _ = Switch.objects.get_or_create(name="core", defaults={"tier": Switch.Tier.CORE})
    building, _ = Building.objects.get_or_create(name="BA")
    switch, created = Switch.objects.get_or_create(name="sw-A", defaults={"tier": Switch.Tier.BUILDING,
                                                                          "building": building})
    if created:
        Link.objects.create(name="up-A", kind=Link.Kind.UPLINK, upper=core, lower_switch=switch,
                            capacity_bytes_per_s=1.25e9)
    node, _ = register_node(None, provider=provider, building=building, name=name,
                            gpus=[{"model": "RTX 3090"}] * gpus)
    session = open_session(node.pk, f"chan-{name}", "127.0.0.1")
    hello(node.pk, session, {"type": "hello", "agent_version": "t", "gpus": [], "data_host": "127.0.0.1",
                             "data_port": 9000 + node.pk, "jobs": []})
    node.refresh_from_db()
    return node


def owner() -> Any:
    from django.contrib.auth import get_user_model

    from portal.core.models import ResearchGroup

    group, _ = ResearchGroup.objects.get_or_create(slug="g", defaults={"name": "G"})
    user, _ = get_user_model().objects.get_or_create(username="alice")
    group.members.add(user)
    return user


def running_job(node: Any, priority_class: str = "interactive", name: str = "notebook") -> Any:
    """A job of ``priority_class`` placed on GPU 0 of ``node`` and started (through the lifecycle)."""
    from portal.core.lifecycle import jobs as job_lifecycle
    from portal.core.models import Job, Placement, ResearchGroup

    user = owner()
    job = Job.objects.create(name=name, owner=user, group=ResearchGroup.objects.get(slug="g"),
                             command="python examples/train_numpy.py", gpu_count=1, expected_runtime_s=36000,
                             ckpt_bytes_estimate=1000, restart_s=1.0, priority_class=priority_class)
    Placement.objects.create(job=job, node=node, gpu_indices=[0])
    job_lifecycle.start(job)
    return job


def handle(node: Any, kind: str, **fields: Any) -> None:
    from portal.control.link.handlers import handle as handle_message

    handle_message(node.pk, kind, {"type": kind, "msg_id": f"m-{next(_ids)}", **fields})


def heartbeat(node: Any, job: Any, step: int, gpu_util: float | None, at: Any) -> None:
    """``node``'s agent reports ``job`` at ``step`` with ``gpu_util`` percent (None: an agent that does not say),
    received at ``at``; the node's heartbeat time is kept fresh too."""
    from portal.control.link.handlers import HeartbeatSeen, record_heartbeats
    from portal.control.link.protocol import validate

    item: dict[str, Any] = {"job_id": job.pk, "step": step}
    if gpu_util is not None:
        item["gpu_util"] = gpu_util
    msg: Any = {"type": "heartbeat", "seq": 1, "gpu_util": [gpu_util or 0.0], "egress": {}, "jobs": [item]}
    validate(msg)
    assert record_heartbeats([HeartbeatSeen(node.pk, None, None, at, msg)]) == []


def beat_for(clock: Any, node: Any, job: Any, seconds: float, *, step: int, gpu_util: float | None,
             every_s: float = 10.0, step_per_beat: int = 0) -> int:
    """Heartbeats every ``every_s`` for ``seconds`` on the injected clock; returns the last step reported."""
    elapsed = 0.0
    while elapsed < seconds:
        clock.advance(every_s)
        elapsed += every_s
        step += step_per_beat
        heartbeat(node, job, step, gpu_util, clock.t)
    return step


def final_checkpoint(node: Any, job: Any, sequence: int, step: int, at: Any) -> None:
    """The job wrote its final checkpoint (what the agent reports after ``checkpoint final=True``)."""
    handle(node, "checkpoint_done", job_id=job.pk, sequence=sequence, step=step, size_bytes=1000, sha256=SHA,
           taken_at=at.timestamp(), final=True, compat={"gpu_model": "RTX 3090", "compute_capability": "8.6"})


def commands_to(node: Any, kind: str) -> list[dict[str, Any]]:
    from portal.control.models import AgentCommand

    return [c.payload for c in AgentCommand.objects.filter(node=node, kind=kind).order_by("created_at", "id")]


def tick(clock: Any) -> dict[str, int]:
    """One control tick at the injected time, every agent having just sent a heartbeat."""
    from portal.control.loop.ticks import control_tick
    from portal.core.models import Node

    Node.objects.update(last_heartbeat_at=clock.t)
    return control_tick(clock.t)
