"""Many protocol-speaking node agents in one asyncio loop (a thread of the test process), recording every
command the portal sends them. For tests that count commands (exactly once) rather than run real jobs.

They speak the agent's protocol (design §9.9): every command is acknowledged (``ack``); a command whose
``cmd_id`` was seen before (the portal re-sends until the ack arrives) is acked again, counted in
``duplicates`` and not recorded twice; they send no reliable reports, so they wait for no ``received``.
``arrived[(node id, kind)]`` is the wall-clock time the first command of that kind reached the agent (the
benchmark's "agent acting"), read before the ack is sent."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any


class RecordingAgents:
    """Connect one simulated agent per ``{node id: token}``; ``commands[node_id]`` lists what each received.

    Each says hello with ``running[node_id]`` as the jobs it runs (so a reconnect is not a restart), beats
    every ``heartbeat_interval_s`` the portal asks for, and answers nothing else: the portal is under test.
    """

    def __init__(self, url: str, tokens: dict[int, str], stagger_s: float = 0.0,
                 on_arrival: Callable[[int, str, float], None] | None = None) -> None:
        self.url = url
        self.on_arrival = on_arrival  # called (in the agents' thread) with each first arrival of a kind
        self.tokens = tokens
        self.stagger_s = stagger_s  # agent k connects k × stagger_s after start (a campus coming up)
        self.arrived: dict[tuple[int, str], float] = {}
        self.commands: dict[int, list[dict[str, Any]]] = defaultdict(list)
        self.seen_ids: dict[int, set[str]] = defaultdict(set)
        self.duplicates = 0  # commands received again (re-sent before their ack arrived)
        self.running: dict[int, list[int]] = defaultdict(list)  # job ids each agent reports it runs
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.tasks: list[asyncio.Future[Any]] = []

    def received(self, node_id: int, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [c for c in self.commands[node_id] if c.get("type") == kind]

    async def _agent(self, node_id: int, token: str, delay_s: float = 0.0) -> None:
        from websockets.asyncio.client import connect

        await asyncio.sleep(delay_s)
        while True:  # reconnect when the portal drops the connection
            try:
                async with connect(self.url, additional_headers={"Authorization": f"Bearer {token}"},
                                   open_timeout=30, ping_interval=None) as ws:
                    await ws.send(json.dumps({
                        "type": "hello", "agent_version": "sim", "data_host": "127.0.0.1",
                        "data_port": 20000 + node_id % 40000, "edge_backend": "noop",
                        "jobs": [{"job_id": j, "step": 0} for j in self.running[node_id]],
                        "gpus": [{"index": 0, "model": "RTX 3090", "uuid": f"sim-{node_id}", "vram_gb": 24,
                                  "capability": 8.6, "driver_version": "sim", "cuda_version": "sim"}]}))
                    welcome = json.loads(await ws.recv())
                    interval = float(welcome.get("heartbeat_interval_s", 1.0))

                    async def beat(interval: float = interval) -> None:
                        seq = 0
                        while True:
                            seq += 1
                            await ws.send(json.dumps({"type": "heartbeat", "seq": seq, "gpu_util": [],
                                                      "egress": {}, "jobs": []}))
                            await asyncio.sleep(interval)

                    beating = asyncio.create_task(beat())
                    try:
                        async for raw in ws:
                            arrived = time.time()
                            msg = json.loads(raw)
                            key = (node_id, str(msg.get("type")))
                            if key not in self.arrived:
                                self.arrived[key] = arrived
                                if self.on_arrival is not None:
                                    self.on_arrival(node_id, key[1], arrived)
                            cmd_id = msg.get("cmd_id")
                            if isinstance(cmd_id, str):
                                await ws.send(json.dumps({"type": "ack", "cmd_id": cmd_id, "t": time.time()}))
                            with self.lock:
                                if isinstance(cmd_id, str) and cmd_id in self.seen_ids[node_id]:
                                    self.duplicates += 1
                                    continue
                                if isinstance(cmd_id, str):
                                    self.seen_ids[node_id].add(cmd_id)
                                self.commands[node_id].append(msg)
                    finally:
                        beating.cancel()
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(0.5)

    def start(self) -> None:
        self.thread.start()
        for k, (node_id, token) in enumerate(self.tokens.items()):
            self.tasks.append(asyncio.run_coroutine_threadsafe(self._agent(node_id, token, k * self.stagger_s),
                                                               self.loop))

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        for task in self.tasks:
            task.cancel()

        async def settle() -> None:  # every agent task has closed its websocket and ended
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if tasks:
                await asyncio.wait(tasks, timeout=10)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(settle(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
