"""Commands from the control plane to node agents, through the Channels group ``agent-<node id>`` (design §1-§4).

Commands are sent only after the current transaction commits, so an agent never acts on a decision that was
rolled back (and never reports back before the rows it refers to are visible).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)


def agent_group(node_id: int) -> str:
    """The one Channels group per node that its agent's consumer joins."""
    return f"agent-{node_id}"


def _send_now(batch: list[tuple[int, dict[str, Any]]]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return

    async def _send() -> None:
        for node_id, payload in batch:
            await layer.group_send(agent_group(node_id), {"type": "agent.command", "payload": payload})

    try:
        async_to_sync(_send)()
    except Exception:  # the tick re-drives idempotent steps; a lost command is retried from the database state
        log.warning("command to agents not delivered: %s", [p.get("type") for _, p in batch], exc_info=True)


def send_many(orders: list[tuple[int, str, dict[str, Any]]]) -> list[str]:
    """Queue many commands ``(node id, kind, fields)`` after commit, delivered together; returns their ids."""
    batch, ids = [], []
    for node_id, kind, fields in orders:
        cmd_id = fields.pop("cmd_id", None) or uuid.uuid4().hex
        batch.append((node_id, {"type": kind, "cmd_id": cmd_id, "sent_at": time.time(), **fields}))
        ids.append(cmd_id)
    if batch:
        transaction.on_commit(lambda: _send_now(batch))
    return ids


def send(node_id: int, kind: str, **fields: Any) -> str:
    """Queue command ``kind`` for node ``node_id`` after commit; returns its ``cmd_id`` (the agent acks it)."""
    cmd_id = fields.pop("cmd_id", None) or uuid.uuid4().hex
    payload = {"type": kind, "cmd_id": cmd_id, "sent_at": time.time(), **fields}
    transaction.on_commit(lambda: _send_now([(node_id, payload)]))
    return cmd_id
