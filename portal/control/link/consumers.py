"""The agent websocket consumer: one connection per node agent, one group ``agent-<node id>`` per node (design §1).

Authentication: the node's agent token in ``Authorization: Bearer …`` (refused before the handshake completes:
HTTP 403), or — for clients that cannot set headers — in the first message ``{"type": "hello", "token": …}``
within :data:`AUTH_TIMEOUT_S` (refused with close code 4401). The consumer declares and translates; the work is
in :mod:`portal.control.link.handlers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import DatabaseError

from portal.control.link import handlers
from portal.control.link.commands import agent_group
from portal.control.link.protocol import ProtocolError, decode, validate
from portal.control.loop import embedded

log = logging.getLogger(__name__)

AUTH_TIMEOUT_S = 5.0
CLOSE_AUTH = 4401
CLOSE_SUPERSEDED = 4409


def _bearer(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            text = value.decode("latin-1").strip()
            if text.lower().startswith("bearer "):
                return text[7:].strip()
    return None


class AgentConsumer(AsyncWebsocketConsumer):
    """One node agent's websocket."""

    node_id: int | None = None
    session_id: int | None = None
    _token: str = ""  # re-checked at every heartbeat: a token revoked or rotated mid-session ends the session
    _auth_timer: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        """1. Header token → node (refuse 403 if unknown/revoked). 2. No header: accept, wait for a hello+token."""
        token = _bearer(self.scope)
        if token is not None:
            node_id = await database_sync_to_async(handlers.authenticate)(token)
            if node_id is None:
                await database_sync_to_async(handlers.record_rejection)(None, "unknown or revoked agent token", "")
                log.warning("agent refused: unknown or revoked token (header)")
                await self.close(code=CLOSE_AUTH)
                return
            await self.accept()
            self._token = token
            await self._bind(node_id)
            return
        await self.accept()
        self._auth_timer = asyncio.create_task(self._auth_deadline())

    async def _auth_deadline(self) -> None:
        await asyncio.sleep(AUTH_TIMEOUT_S)
        if self.node_id is None:
            log.warning("agent refused: no token within %.0f s", AUTH_TIMEOUT_S)
            await self.close(code=CLOSE_AUTH)

    async def _bind(self, node_id: int) -> None:
        """Join the node's group, record the session, and close any older session of the same node."""
        embedded.ensure_started()
        self.node_id = node_id
        client = self.scope.get("client") or ["", 0]
        self.session_id = await database_sync_to_async(handlers.open_session)(node_id, self.channel_name, client[0])
        await self.channel_layer.group_add(agent_group(node_id), self.channel_name)
        await self.channel_layer.group_send(agent_group(node_id),
                                            {"type": "agent.superseded", "session_id": self.session_id})

    async def disconnect(self, code: int) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        if self.node_id is not None:
            await self.channel_layer.group_discard(agent_group(self.node_id), self.channel_name)
            await database_sync_to_async(handlers.close_session)(self.session_id, f"closed ({code})")

    async def _reject(self, reason: str, kind: str = "") -> None:
        """Refuse one message: log, record, tell the agent; nothing else changes."""
        log.warning("agent message refused (node %s, %s): %s", self.node_id, kind or "?", reason)
        await database_sync_to_async(handlers.record_rejection)(self.node_id, reason, kind)
        with contextlib.suppress(Exception):
            await self.send(json.dumps({"type": "error", "reason": reason, "refused": kind}))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            msg = decode(text_data, bytes_data)
        except ProtocolError as exc:
            await self._reject(str(exc))
            return
        if self.node_id is None:
            await self._first_message_auth(msg)
            return
        try:
            kind = validate(msg)
        except ProtocolError as exc:
            await self._reject(str(exc), str(msg.get("type", ""))[:64])
            return
        if kind == "heartbeat" and not await database_sync_to_async(handlers.token_still_valid)(
            self.node_id, self._token
        ):
            await database_sync_to_async(handlers.record_rejection)(self.node_id, "agent token revoked", kind)
            log.warning("node %s: agent token revoked or rotated; closing its session", self.node_id)
            await self.close(code=CLOSE_AUTH)
            return
        try:
            if kind == "hello":
                reply = await database_sync_to_async(handlers.hello)(self.node_id, self.session_id, msg)
                await self.send(json.dumps(reply))
            else:
                await database_sync_to_async(handlers.handle)(self.node_id, kind, msg)
        except handlers.RefusedError as exc:
            await self._reject(str(exc), kind)
        except (DatabaseError, ValueError, TypeError, KeyError, OverflowError) as exc:
            # Well-formed but unusable data (the handler's transaction rolled back): refuse, keep the session.
            log.exception("agent message from node %s could not be handled", self.node_id)
            await self._reject(f"could not be handled: {exc.__class__.__name__}", kind)

    async def _first_message_auth(self, msg: dict[str, Any]) -> None:
        token = msg.get("token")
        node_id = None
        if msg.get("type") == "hello" and isinstance(token, str):
            node_id = await database_sync_to_async(handlers.authenticate)(token)
        if node_id is None:
            await database_sync_to_async(handlers.record_rejection)(None, "first message is not a valid hello", "")
            log.warning("agent refused: first message carries no valid token")
            await self.close(code=CLOSE_AUTH)
            return
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        self._token = token
        await self._bind(node_id)
        await self.receive(text_data=json.dumps({k: v for k, v in msg.items() if k != "token"}))

    # --- group messages -------------------------------------------------------------------------------------
    async def agent_command(self, event: dict[str, Any]) -> None:
        await self.send(json.dumps(event["payload"]))

    async def agent_superseded(self, event: dict[str, Any]) -> None:
        if event.get("session_id") != self.session_id:
            log.info("node %s: session %s superseded by %s", self.node_id, self.session_id, event.get("session_id"))
            await self.close(code=CLOSE_SUPERSEDED)
