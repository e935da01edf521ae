"""The browsers' live-update websocket (``/ws/live/``): forwards ``live.event`` messages to the page.

1. ``connect``: the session user (AuthMiddlewareStack) must be logged in, else the socket is closed (4401).
2. It joins only the groups the user may see (its labs, its research groups, ``dashboard`` for admins).
3. A page may ask to follow one object: ``{"follow": ["job-12", "node-3"]}``; each is checked again.
4. Each ``live.event`` from ``portal.control.link.publish`` is sent on as JSON; the page's script decides which
   htmx fragments to reload (the database stays the source of truth: events carry ids, not state).
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from portal.web.access import live_groups_for, may_follow

MAX_FOLLOWED = 50


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Session-authenticated, read-only stream of live events for one browser tab."""

    joined: list[str]

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.joined = []
        for group in await database_sync_to_async(live_groups_for)(user):
            await self._join(group)
        await self.accept()
        await self.send_json({"event": "hello", "groups": list(self.joined)})

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        wanted = content.get("follow") if isinstance(content, dict) else None
        if not isinstance(wanted, list):
            return
        user = self.scope["user"]
        accepted = []
        for group in wanted[:MAX_FOLLOWED]:
            if not isinstance(group, str) or len(self.joined) >= MAX_FOLLOWED + 10:
                continue
            if group in self.joined or await database_sync_to_async(may_follow)(user, group):
                await self._join(group)
                accepted.append(group)
        await self.send_json({"event": "following", "groups": accepted})

    async def live_event(self, message: dict[str, Any]) -> None:
        """Handler of ``{"type": "live.event", ...}`` (the publisher's message type)."""
        await self.send_json({key: value for key, value in message.items() if key != "type"})

    async def _join(self, group: str) -> None:
        if group not in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
            self.joined.append(group)
