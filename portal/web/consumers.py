"""The browsers' live-update websocket (``/ws/live/``): forwards ``live.event`` messages to the page.

1. ``connect``: the session user (AuthMiddlewareStack) must be logged in, else the socket is closed (4401).
2. It joins only the groups the user may see (its labs, its research groups, ``dashboard`` for admins).
3. A page may ask to follow one object: ``{"follow": ["job-12", "node-3"]}``; each is checked again.
4. Each ``live.event`` from ``portal.control.link.publish`` is sent on as JSON; the page's script decides which
   htmx fragments to reload (the database stays the source of truth: events carry ids, not state).
5. Each ``person.event`` (``portal.core.events``: placed, moved, lost work, …) is sent on as
   ``{"event": "notice", "name", "text", "level", "url"}`` — only if this user is a member of one of the groups
   it was addressed to (``audience_groups_for``: an admin sees every group's pages but is not every group's
   member; a followed object never makes one its audience), once per socket however many of those groups it
   joined, in the owner's words for the job's owner ("Your job …"). The page toasts these.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from portal.core.models import Provider, ResearchGroup
from portal.core.permissions import is_admin
from portal.notify.preferences import muted_toasts
from portal.web.access import live_groups_for, may_follow

MAX_FOLLOWED = 50
RECENT_NOTICES = 64  # notice ids remembered per socket: one notice reaches a socket once per group it is in


def audience_groups_for(user: Any) -> list[str]:
    """The groups whose notices are this user's (portal.core.events audiences): the labs and research groups
    the user is a member of, and ``dashboard`` for admins. Narrower than :func:`live_groups_for`, which lets an
    admin's pages refresh on every lab's and group's events: an admin is not told of every job's placement."""
    groups = [f"provider-{pk}" for pk in Provider.objects.filter(members=user).values_list("pk", flat=True)]
    groups += [f"group-{pk}" for pk in ResearchGroup.objects.filter(members=user).values_list("pk", flat=True)]
    return [*groups, "dashboard"] if is_admin(user) else groups


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Session-authenticated, read-only stream of live events for one browser tab."""

    joined: list[str]
    members_of: frozenset[str]  # the groups whose notices are this user's (audience_groups_for)
    recent_notices: deque[str]

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.joined = []
        self.recent_notices = deque(maxlen=RECENT_NOTICES)
        self.members_of = frozenset(await database_sync_to_async(audience_groups_for)(user))
        # Events this user turned toasts off for (design §12).
        self.muted = await database_sync_to_async(muted_toasts)(user)
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

    async def person_event(self, message: dict[str, Any]) -> None:
        """Handler of ``{"type": "person.event", "notice": {...}}`` (``portal.control.link.publish.publish_notice``)."""
        notice = message.get("notice") or {}
        if not self.members_of.intersection(notice.get("groups") or ()) or notice.get("id") in self.recent_notices:
            return
        self.recent_notices.append(notice.get("id"))
        if notice.get("name") in getattr(self, "muted", ()):
            return
        user = self.scope["user"]
        mine = notice.get("owner_id") is None or notice.get("owner_id") == user.pk
        await self.send_json({"event": "notice", "name": notice.get("name"), "level": notice.get("level"),
                              "text": notice.get("text") if mine else notice.get("text_others"),
                              "url": notice.get("url")})

    async def _join(self, group: str) -> None:
        if group not in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
            self.joined.append(group)
