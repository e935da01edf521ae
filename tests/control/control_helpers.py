"""Helpers for control-plane tests: a small campus and a fake agent speaking the protocol (design §1).

A "fake agent" is a ``WebsocketCommunicator``, so the portal side is exercised without processes (the real agent
is covered by tests/e2e).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from portal.control.routing import websocket_urlpatterns

APP = URLRouter(websocket_urlpatterns)


def make_node(name: str, building_code: str = "A", gpus: int = 2) -> tuple[Any, str]:
    """Register a node (state ``registered``) in a tiny campus; returns (node, raw token)."""
    from portal.core.models import Building, Link, Provider, Switch
    from portal.core.services.nodes import register_node

    provider, _ = Provider.objects.get_or_create(slug="lab", defaults={"name": "Lab"})
    core, _ = Switch.objects.get_or_create(name="core", defaults={"tier": Switch.Tier.CORE})
    building, _ = Building.objects.get_or_create(name=f"B{building_code}")
    switch, created = Switch.objects.get_or_create(name=f"sw-{building_code}",
                                                   defaults={"tier": Switch.Tier.BUILDING, "building": building})
    if created:
        Link.objects.create(name=f"up-{building_code}", kind=Link.Kind.UPLINK, upper=core, lower_switch=switch,
                            capacity_bytes_per_s=1.25e9)
    return register_node(None, provider=provider, building=building, name=name,
                         gpus=[{"model": "RTX 3090"}] * gpus)


def make_running_job(node: Any, ckpt_bytes: int = 1_000_000) -> Any:
    """A job placed and running on ``node`` (through the lifecycle)."""
    from django.contrib.auth import get_user_model

    from portal.core.lifecycle import jobs as job_lifecycle
    from portal.core.models import Job, Placement, ResearchGroup

    group, _ = ResearchGroup.objects.get_or_create(slug="g", defaults={"name": "G"})
    user, _ = get_user_model().objects.get_or_create(username="researcher")
    job = Job.objects.create(name="j", owner=user, group=group, command="python examples/train_numpy.py",
                             gpu_count=1, expected_runtime_s=600, ckpt_bytes_estimate=ckpt_bytes, restart_s=1.0,
                             loss_budget_s=10)
    Placement.objects.create(job=job, node=node, gpu_indices=[0])
    job_lifecycle.start(job)
    return job


class FakeAgent:
    """A websocket client speaking the agent protocol."""

    def __init__(self, token: str | None, data_port: int = 9000) -> None:
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        self.comm = WebsocketCommunicator(APP, "/ws/agent/", headers=headers)
        self.data_port = data_port
        self.seen: list[dict[str, Any]] = []

    async def connect(self) -> bool:
        connected, _ = await self.comm.connect()
        return bool(connected)

    async def hello(self, jobs: list[dict[str, int]] | None = None, **fields: Any) -> dict[str, Any]:
        await self.send({"type": "hello", "agent_version": "test", "data_host": "127.0.0.1",
                         "data_port": self.data_port, "jobs": jobs or [],
                         "gpus": [{"index": i, "model": "RTX 3090", "uuid": f"u{i}", "vram_gb": 24,
                                   "capability": 8.6, "driver_version": "sim", "cuda_version": "sim"}
                                  for i in range(2)], **fields})
        return await self.expect("welcome")

    async def send(self, msg: dict[str, Any] | str) -> None:
        await self.comm.send_to(text_data=msg if isinstance(msg, str) else json.dumps(msg))

    async def expect(self, kind: str, timeout_s: float = 10.0) -> dict[str, Any]:
        """The next message of type ``kind`` (others are kept in ``seen``). It returns as soon as one comes; the
        bound only fails a test whose message never does (3 s was too short beside the stack tests on 2 cores:
        test_restores_are_given_up_after_the_bound_even_if_copies_remain timed out once)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise AssertionError(f"no {kind!r} message; saw {[m.get('type') for m in self.seen]}")
            msg = json.loads(await self.comm.receive_from(timeout=left))
            if msg.get("type") == kind:
                return msg
            self.seen.append(msg)

    async def nothing(self, timeout_s: float = 0.2) -> bool:
        return await self.comm.receive_nothing(timeout=timeout_s)

    async def close(self) -> None:
        await self.comm.disconnect()


db = database_sync_to_async


async def until(predicate: Any, timeout_s: float = 5.0, what: str = "") -> None:
    """Wait until ``predicate()`` (run in a worker thread: it may query the database) is truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await db(predicate)():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.05)


def load_script(name: str) -> Any:
    """``scripts/<name>.py`` (a script, not a package) as the module ``name``, loaded once."""
    import importlib.util
    import sys
    from pathlib import Path

    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]

