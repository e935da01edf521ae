"""The events people see reach the browsers of their audience only (docs/design.md §9.12): the job's group (its
owner in their own words), the node's lab, the admins — once per socket, never through a followed object."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections, transaction

from portal.core import events
from portal.web.consumers import LiveConsumer
from tests.portal import factories as f

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture(autouse=True)
def in_memory_layer(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)


async def _socket(user: Any, follow: list[str] | None = None) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(LiveConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect()
    assert connected
    assert (await communicator.receive_json_from())["event"] == "hello"
    if follow:
        await communicator.send_json_to({"follow": follow})
        assert (await communicator.receive_json_from())["event"] == "following"
    return communicator


@database_sync_to_async
def _emit(name: str, **facts: Any) -> None:
    with transaction.atomic():  # delivered when this commits
        assert events.emit(name, **facts) is not None


async def test_a_job_notice_reaches_its_group_only_in_the_owners_words_for_the_owner(campus: Any) -> None:
    colleague = await database_sync_to_async(f.make_user)("colleague")
    await database_sync_to_async(campus.group.members.add)(colleague)
    owner, member = await _socket(campus.users["researcher"]), await _socket(colleague)
    outsiders = [await _socket(campus.users[role]) for role in ("other_researcher", "provider", "admin")]

    await _emit("job.placed", job=campus.job, node=campus.node)
    assert await owner.receive_json_from() == {
        "event": "notice", "name": "job.placed", "level": "info", "url": f"/jobs/{campus.job.pk}/",
        "text": "Your job “bert-finetune” was placed on vision-01 and is starting."}
    assert (await member.receive_json_from())["text"] == (
        "Job “bert-finetune” of researcher was placed on vision-01 and is starting.")
    for socket in outsiders:
        assert await socket.receive_nothing(timeout=0.2)
    for socket in (owner, member, *outsiders):
        await socket.disconnect()


async def test_a_node_notice_reaches_its_lab_and_an_admin_notice_the_admins(campus: Any) -> None:
    provider, other_provider = await _socket(campus.users["provider"]), await _socket(campus.users["other_provider"])
    admin, researcher = await _socket(campus.users["admin"]), await _socket(campus.users["researcher"])

    await _emit("node.returned", node=campus.node)
    assert (await provider.receive_json_from())["text"] == "Your node vision-01 is online and lent: its agent is connected."
    await _emit("node.lost", node=campus.node)
    lost = await admin.receive_json_from()
    assert lost["name"] == "node.lost" and lost["text"].startswith("vision-01 (Vision Lab) was lost")
    for socket in (other_provider, researcher, provider):
        assert await socket.receive_nothing(timeout=0.2)
    for socket in (provider, other_provider, admin, researcher):
        await socket.disconnect()


async def test_a_notice_addressed_to_two_of_ones_groups_arrives_once(campus: Any) -> None:
    from portal.control.link.publish import publish_notice

    await database_sync_to_async(campus.lab.members.add)(campus.users["researcher"])  # in the lab and the group
    socket = await _socket(campus.users["researcher"])
    notice = {"id": "n1", "name": "node.returned", "level": "ok", "text": "once", "text_others": "once",
              "groups": [f"group-{campus.group.pk}", f"provider-{campus.lab.pk}"], "owner_id": None, "url": "/"}
    await database_sync_to_async(publish_notice)(notice["groups"], notice)
    assert (await socket.receive_json_from())["text"] == "once"
    assert await socket.receive_nothing(timeout=0.2)
    await socket.disconnect()


async def test_following_an_object_never_makes_one_its_audience(campus: Any) -> None:
    """A lab's member may follow a job its node hosts; a notice about that job is still its group's alone."""
    from portal.control.link.publish import publish_notice

    provider = await _socket(campus.users["provider"], follow=[f"job-{campus.job.pk}"])
    notice = {"id": "n2", "name": "job.placed", "level": "info", "text": "yours", "text_others": "theirs",
              "groups": [f"job-{campus.job.pk}"], "owner_id": campus.users["researcher"].pk, "url": "/"}
    await database_sync_to_async(publish_notice)(notice["groups"], notice)
    assert await provider.receive_nothing(timeout=0.2)
    await provider.disconnect()
