"""``/api/notify/…`` (design §12): a user sees only their own preferences, webhooks and deliveries; members
manage their group's and lab's webhooks; admins all; a webhook's secret is answered once."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from portal.notify import dispatch
from portal.notify.api import create_webhook
from portal.notify.models import Delivery, Preference, Webhook
from tests.notify.conftest import World

pytestmark = pytest.mark.django_db


def client(user: Any | None) -> APIClient:
    c = APIClient()
    if user is not None:
        c.force_authenticate(user)
    return c


def test_every_endpoint_needs_a_signed_in_user(world: World) -> None:
    for path in ("/api/notify/preferences/", "/api/notify/webhooks/", "/api/notify/deliveries/"):
        assert client(None).get(path).status_code in (401, 403)


def test_preferences_list_every_catalogue_event_with_defaults_and_a_change_is_the_users_own(world: World) -> None:
    from portal.core import events

    rows = client(world.researcher).get("/api/notify/preferences/").json()
    assert [r["event"] for r in rows] == [n for n, k in events.CATALOGUE.items() if k.audience == "researchers"]
    lab_rows = client(world.provider_user).get("/api/notify/preferences/").json()
    assert {r["audience"] for r in lab_rows} == {"provider"}
    assert len(client(world.admin).get("/api/notify/preferences/").json()) == len(events.CATALOGUE)
    warned = next(r for r in rows if r["event"] == "job.warned")
    assert (warned["email"], warned["webhook"], warned["toast"], warned["explicit"]) == ("now", True, True, False)
    answer = client(world.researcher).patch("/api/notify/preferences/job.warned/", {"email": "digest"},
                                            format="json")
    assert answer.status_code == 200 and answer.json()["email"] == "digest" and answer.json()["explicit"]
    assert client(world.colleague).get("/api/notify/preferences/job.warned/").json()["email"] == "now"
    assert client(world.researcher).delete("/api/notify/preferences/job.warned/").status_code == 204
    assert not Preference.objects.exists()


def test_a_bad_preference_names_the_field_and_an_unknown_event_is_404(world: World) -> None:
    answer = client(world.researcher).patch("/api/notify/preferences/job.warned/", {"email": "hourly"},
                                            format="json")
    assert answer.status_code == 400 and "email" in answer.json()
    assert client(world.researcher).get("/api/notify/preferences/job.nothing/").status_code == 404


def test_a_webhook_answers_its_secret_once_and_never_again(world: World) -> None:
    created = client(world.researcher).post("/api/notify/webhooks/", {"url": "https://hooks.example.org/a",
                                                                       "name": "mine"}, format="json")
    assert created.status_code == 201
    body = created.json()
    assert body["secret"].startswith("whsec_") and body["scope"] == "user"
    assert Webhook.objects.get(pk=body["id"]).user == world.researcher
    again = client(world.researcher).get(f"/api/notify/webhooks/{body['id']}/").json()
    assert "secret" not in again and again["url"] == "https://hooks.example.org/a"
    listed = client(world.researcher).get("/api/notify/webhooks/").json()
    assert all("secret" not in row for row in listed["results"])


def test_webhook_urls_must_be_http_and_group_hooks_need_membership(world: World) -> None:
    bad = client(world.researcher).post("/api/notify/webhooks/", {"url": "file:///etc/passwd"}, format="json")
    assert bad.status_code == 400 and "url" in bad.json()
    stranger = client(world.outsider).post("/api/notify/webhooks/", {"url": "https://h.example/x",
                                                                      "group": world.group.pk}, format="json")
    assert stranger.status_code == 400 and "group" in stranger.json()
    lab = client(world.researcher).post("/api/notify/webhooks/", {"url": "https://h.example/x",
                                                                   "provider": world.lab.pk}, format="json")
    assert lab.status_code == 400 and "provider" in lab.json()
    member = client(world.colleague).post("/api/notify/webhooks/", {"url": "https://h.example/g",
                                                                     "group": world.group.pk}, format="json")
    assert member.status_code == 201 and member.json()["scope"] == "group"


def test_who_sees_which_webhook(world: World) -> None:
    own = create_webhook(world.outsider, url="https://h.example/carol")
    group_hook = create_webhook(world.colleague, url="https://h.example/nlp", group=world.group)
    lab_hook = create_webhook(world.provider_user, url="https://h.example/lab", provider=world.lab)

    def ids(user: Any) -> set[int]:
        return {row["id"] for row in client(user).get("/api/notify/webhooks/").json()["results"]}

    assert ids(world.researcher) == {group_hook.pk}  # a member of the group sees its webhook
    assert ids(world.outsider) == {own.pk}
    assert ids(world.provider_user) == {lab_hook.pk}
    assert ids(world.admin) == {own.pk, group_hook.pk, lab_hook.pk}
    assert client(world.researcher).get(f"/api/notify/webhooks/{own.pk}/").status_code == 404
    assert client(world.researcher).delete(f"/api/notify/webhooks/{own.pk}/").status_code == 404
    off = client(world.researcher).patch(f"/api/notify/webhooks/{group_hook.pk}/", {"enabled": False},
                                         format="json")
    assert off.status_code == 200 and not Webhook.objects.get(pk=group_hook.pk).enabled
    moved = client(world.researcher).patch(f"/api/notify/webhooks/{group_hook.pk}/",
                                           {"group": world.other_group.pk}, format="json")
    assert moved.status_code == 400 and "group" in moved.json()


def test_send_test_queues_a_delivery_the_caller_sees_in_the_log(world: World) -> None:
    hook = create_webhook(world.researcher, url="https://h.example/t")
    answer = client(world.researcher).post(f"/api/notify/webhooks/{hook.pk}/test/")
    assert answer.status_code == 202
    delivery = Delivery.objects.get(pk=answer.json()["delivery"])
    assert (delivery.channel, delivery.event, delivery.webhook_id) == ("webhook", "test", hook.pk)
    log = client(world.researcher).get("/api/notify/deliveries/").json()["results"]
    assert [row["id"] for row in log] == [delivery.pk]
    assert client(world.outsider).get("/api/notify/deliveries/").json()["results"] == []
    assert client(world.outsider).get(f"/api/notify/deliveries/{delivery.pk}/").status_code == 404
    assert client(world.admin).get(f"/api/notify/deliveries/{delivery.pk}/").status_code == 200


def test_the_delivery_log_filters_are_validated(world: World) -> None:
    dispatch.send_test(None, world.researcher, "email")
    ok = client(world.researcher).get("/api/notify/deliveries/?channel=email&status=pending")
    assert ok.status_code == 200 and len(ok.json()["results"]) == 1
    bad = client(world.researcher).get("/api/notify/deliveries/?channel=pigeon")
    assert bad.status_code == 400 and "channel" in bad.json()


def test_the_schema_documents_the_notify_endpoints(world: World) -> None:
    schema = client(world.researcher).get("/api/schema/?format=json").json()
    paths = set(schema["paths"])
    assert {"/api/notify/preferences/", "/api/notify/preferences/{event}/", "/api/notify/webhooks/",
            "/api/notify/webhooks/{id}/test/", "/api/notify/deliveries/"} <= paths
