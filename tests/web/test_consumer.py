"""The browsers' live websocket: closed without a session, joins only what the user may see."""

from __future__ import annotations

from typing import Any

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import connections

from portal.web.consumers import LiveConsumer
from portal.web.routing import websocket_urlpatterns

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture(autouse=True)
def in_memory_layer(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.CHANNEL_LAYERS = IN_MEMORY
    # database_sync_to_async runs in worker threads; with persistent connections (CONN_MAX_AGE) they would
    # stay open and block the test database's teardown.
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)


@pytest.fixture
def campus_sync(campus: Any) -> Any:
    return campus


async def _connect(user: Any) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = user
    return communicator


async def test_route_refuses_a_browser_without_a_session() -> None:
    app = URLRouter(websocket_urlpatterns)
    communicator = WebsocketCommunicator(app, "/ws/live/", headers=[(b"origin", b"http://127.0.0.1:8000"),
                                                                      (b"host", b"127.0.0.1:8000")])
    connected, code = await communicator.connect()
    assert not connected
    assert code == 4401


async def test_route_refuses_a_foreign_origin() -> None:
    app = URLRouter(websocket_urlpatterns)
    communicator = WebsocketCommunicator(app, "/ws/live/", headers=[(b"origin", b"http://evil.example")])
    connected, _ = await communicator.connect()
    assert not connected


async def test_anonymous_user_is_closed() -> None:
    communicator = await _connect(AnonymousUser())
    connected, code = await communicator.connect()
    assert not connected and code == 4401


async def test_researcher_joins_own_group_and_gets_its_events(campus_sync: Any) -> None:
    campus = campus_sync
    communicator = await _connect(campus.users["researcher"])
    connected, _ = await communicator.connect()
    assert connected
    hello = await communicator.receive_json_from()
    assert hello == {"event": "hello", "groups": [f"group-{campus.group.pk}"]}
    layer = get_channel_layer()
    await layer.group_send(f"group-{campus.group.pk}", {"type": "live.event", "event": "migration",
                                                        "job_id": campus.job.pk, "mode": "planned"})
    assert await communicator.receive_json_from() == {"event": "migration", "job_id": campus.job.pk,
                                                      "mode": "planned"}
    # Another group's events never arrive.
    await layer.group_send(f"group-{campus.other_group.pk}", {"type": "live.event", "event": "job.state"})
    assert await communicator.receive_nothing(timeout=0.2)
    await communicator.disconnect()


async def test_follow_is_checked(campus_sync: Any) -> None:
    campus = campus_sync
    communicator = await _connect(campus.users["researcher"])
    await communicator.connect()
    await communicator.receive_json_from()
    await communicator.send_json_to({"follow": [f"job-{campus.job.pk}", f"job-{campus.other_job.pk}",
                                                f"node-{campus.node.pk}", "dashboard", "nonsense"]})
    assert await communicator.receive_json_from() == {"event": "following", "groups": [f"job-{campus.job.pk}"]}
    await communicator.disconnect()


async def test_provider_follows_own_node_and_hosted_job(campus_sync: Any) -> None:
    campus = campus_sync
    communicator = await _connect(campus.users["provider"])
    await communicator.connect()
    hello = await communicator.receive_json_from()
    assert hello["groups"] == [f"provider-{campus.lab.pk}"]
    await communicator.send_json_to({"follow": [f"node-{campus.node.pk}", f"node-{campus.other_node.pk}",
                                                f"job-{campus.job.pk}"]})
    reply = await communicator.receive_json_from()
    assert reply["groups"] == [f"node-{campus.node.pk}", f"job-{campus.job.pk}"]
    await communicator.disconnect()


async def test_admin_joins_dashboard(campus_sync: Any) -> None:
    communicator = await _connect(campus_sync.users["admin"])
    await communicator.connect()
    hello = await communicator.receive_json_from()
    assert "dashboard" in hello["groups"]
    await communicator.disconnect()
