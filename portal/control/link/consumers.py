"""The agent websocket consumer: one connection per node agent, one group ``agent-<node id>`` per node (design §1).

Authentication: the node's agent token in ``Authorization: Bearer …`` (refused before the handshake completes:
HTTP 403), or — for clients that cannot set headers — in the first message ``{"type": "hello", "token": …}``
within :data:`AUTH_TIMEOUT_S` (refused with close code 4401). The consumer declares and translates; the work is
in :mod:`portal.control.link.handlers`.

Nothing is lost on the link (design §9.9): right after the welcome the consumer sends the node's unacknowledged
commands again, in their original order; a reliable report (one with a ``msg_id``) is answered ``received`` once
its transaction committed or it was refused for good (a refusal is an answer). A transient database error is
not an answer: the agent sends the report again.

Heartbeats are not handled one by one: they go to this process's batch (:mod:`portal.control.link.heartbeats`),
written every 0.2 s in a fixed number of statements with the session tokens re-checked there, so a command for an
agent never waits behind the heartbeats of 500 others on the one database thread (design §9.10).

Agents are untrusted input: each session may send 20 messages a second (:mod:`portal.control.link.limits`); the
excess is dropped and counted, the agent warned, and a session that keeps flooding is closed (4429).
Unauthenticated attempts are counted (``/metrics``), not written as a row each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import DatabaseError, DataError, IntegrityError
from django.utils import timezone

from portal.control.link import commands, handlers, heartbeats, limits, presence
from portal.control.link.commands import agent_group
from portal.control.link.handlers import HeartbeatSeen
from portal.control.link.protocol import ProtocolError, decode, validate
from portal.control.loop import embedded

log = logging.getLogger(__name__)

AUTH_TIMEOUT_S = 5.0
CLOSE_AUTH = 4401
CLOSE_SUPERSEDED = 4409
CLOSE_FLOODING = 4429


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
    _budget: limits.SessionBudget | None = None
    _arrivals: limits.Arrivals | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Each incoming message is stamped as it arrives: the budget charges arrivals, not handling (a backlog
        behind a busy database is not a flood; :mod:`portal.control.link.limits`)."""
        self._arrivals = limits.Arrivals(receive, limits.new_budget().clock)
        try:
            await super().__call__(scope, self._arrivals.receive, send)
        finally:
            await self._arrivals.close()

    async def _count(self, event: str) -> None:
        """Count a link event; add this process's counts to the database when a flush is due."""
        limits.count(event)
        if limits.flush_due():
            try:
                await database_sync_to_async(limits.flush)()
            except DatabaseError:
                log.warning("agent-link counters not written now; kept for the next flush", exc_info=True)

    async def connect(self) -> None:
        """1. Header token → node (refuse 403 if unknown/revoked). 2. No header: accept, wait for a hello+token."""
        self._budget = limits.new_budget()
        token = _bearer(self.scope)
        if token is not None:
            node_id = await database_sync_to_async(handlers.authenticate)(token)
            if node_id is None:
                await self._count(limits.AUTH_REFUSED)
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
        presence.ensure_started()
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
        """Refuse one message: log, record (count it, before authentication), tell the agent; nothing else
        changes."""
        log.warning("agent message refused (node %s, %s): %s", self.node_id, kind or "?", reason)
        if self.node_id is None:
            await self._count(limits.AUTH_REFUSED)
        else:
            await database_sync_to_async(handlers.record_rejection)(self.node_id, reason, kind)
        with contextlib.suppress(Exception):
            await self.send(json.dumps({"type": "error", "reason": reason, "refused": kind}))

    async def _over_budget(self) -> bool:
        """Take one message from the session's budget; over it: drop (counted), warn, close if it persists."""
        budget = self._budget if self._budget is not None else limits.new_budget()
        self._budget = budget
        if budget.take(self._arrivals.arrived_at if self._arrivals is not None else None):
            return False
        await self._count(limits.MESSAGES_DROPPED)
        if budget.persists:
            log.warning("node %s: flooding for %d s; closing its session", self.node_id, limits.STRIKES_TO_CLOSE)
            await self._count(limits.SESSIONS_CLOSED)
            await self.close(code=CLOSE_FLOODING)
        elif budget.should_warn():
            with contextlib.suppress(Exception):
                await self.send(json.dumps({"type": "error", "refused": "rate", "reason": (
                    f"rate limit: more than {limits.RATE_PER_S:.0f} messages a second; the excess is dropped")}))
        return True

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if await self._over_budget():
            return
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
        msg_id = msg.get("msg_id") if isinstance(msg.get("msg_id"), str) else None
        if kind == "heartbeat" and msg_id is None:  # recorded in a batch; the token is re-checked there
            heartbeats.add(HeartbeatSeen(self.node_id, self.session_id, self._token, timezone.now(), msg))
            # The agent's evidence that the portal hears it (fencing, design §9.10), answered on receipt: the
            # batch records it within FLUSH_S, and a batch that fails marks the link interrupted, so silence
            # over that time is not judged against the agent either.
            await self.send(json.dumps({"type": "heartbeat_ack", "seq": msg["seq"]}))
            if limits.flush_due():  # counts waiting in this process reach /metrics
                await database_sync_to_async(limits.flush)()
            return
        try:
            if kind == "hello":
                reply = await database_sync_to_async(handlers.hello)(self.node_id, self.session_id, msg)
                await self.send(json.dumps(reply))
                await self._resend_pending()
                return
            await database_sync_to_async(handlers.handle)(self.node_id, kind, msg)
            if kind == "heartbeat":  # recorded: the agent's evidence that it still holds its jobs (design §9.10)
                await self.send(json.dumps({"type": "heartbeat_ack", "seq": msg["seq"]}))
        except handlers.RefusedError as exc:
            await self._reject(str(exc), kind)
        except (DataError, IntegrityError, ValueError, TypeError, KeyError, OverflowError) as exc:
            # Well-formed but unusable data (the handler's transaction rolled back): refuse, keep the session.
            log.exception("agent message from node %s could not be handled", self.node_id)
            await self._reject(f"could not be handled: {exc.__class__.__name__}", kind)
        except DatabaseError:
            # Transient (the database restarting, a connection lost): no answer, so the agent sends it again; the
            # link was not serving, so silence before now is not judged against the agents (design §9.10).
            presence.note_interrupted()
            log.warning("agent %s from node %s not handled now (database error); the agent re-sends it", kind,
                        self.node_id, exc_info=True)
            return
        if msg_id is not None:  # handled, a duplicate, or refused for good: the agent may forget it
            await self.send(json.dumps({"type": "received", "msg_id": msg_id}))

    async def _resend_pending(self) -> None:
        """Send the node's unacknowledged commands again, oldest first (they may have been lost in the gap)."""
        try:
            pending = await database_sync_to_async(commands.pending_for)(self.node_id)
        except DatabaseError:
            log.warning("node %s: pending commands not re-sent now; the reconciler will", self.node_id,
                        exc_info=True)
            return
        for payload in pending:
            await self.send(json.dumps(payload))

    async def _first_message_auth(self, msg: dict[str, Any]) -> None:
        token = msg.get("token")
        node_id = None
        if msg.get("type") == "hello" and isinstance(token, str):
            node_id = await database_sync_to_async(handlers.authenticate)(token)
        if node_id is None:
            await self._count(limits.AUTH_REFUSED)
            log.warning("agent refused: first message carries no valid token")
            await self.close(code=CLOSE_AUTH)
            return
        if self._auth_timer is not None:
            self._auth_timer.cancel()
        self._token = token
        await self._bind(node_id)
        if self._budget is not None:
            self._budget.tokens += 1  # the hello is handled once more below: it is one message
        await self.receive(text_data=json.dumps({k: v for k, v in msg.items() if k != "token"}))

    # --- group messages -------------------------------------------------------------------------------------
    async def agent_command(self, event: dict[str, Any]) -> None:
        await self.send(json.dumps(event["payload"]))

    async def agent_revoked(self, event: dict[str, Any]) -> None:
        """A heartbeat of this session was refused when recorded: its token no longer authenticates the node."""
        if event.get("session_id") == self.session_id:
            await self.close(code=CLOSE_AUTH)

    async def agent_superseded(self, event: dict[str, Any]) -> None:
        if event.get("session_id") != self.session_id:
            log.info("node %s: session %s superseded by %s", self.node_id, self.session_id, event.get("session_id"))
            await self.close(code=CLOSE_SUPERSEDED)
