"""The notification pages (design §12): settings for every signed-in user, the stored mail for admins, and the
database mail backend of the embedded demo."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import mail as django_mail
from django.test import Client

from portal.notify import dispatch
from portal.notify.api import create_webhook
from portal.notify.models import Preference, StoredMail, Webhook
from tests.notify.conftest import World

pytestmark = pytest.mark.django_db


def signed_in(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_the_settings_page_lists_events_webhooks_and_the_log_and_the_top_bar_links_it(world: World) -> None:
    hook = create_webhook(world.researcher, url="https://h.example/a", name="lab slack")
    dispatch.send_test(hook, world.researcher, "webhook")
    page = signed_in(world.researcher).get("/notify/")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'href="/notify/"' in html and 'aria-current="page">Notifications' in html
    assert 'data-event="job.warned"' in html and 'data-event="node.owner_using_gpu"' not in html  # not a lab's
    lab_page = signed_in(world.provider_user).get("/notify/").content.decode()
    assert 'data-event="node.owner_using_gpu"' in lab_page and 'data-event="job.warned"' not in lab_page
    assert "https://h.example/a" in html and 'data-testid="delivery-log"' in html
    assert hook.secret not in html  # shown once, at registration only
    assert signed_in(world.outsider).get("/notify/").content.decode().count("https://h.example/a") == 0


def test_saving_preferences_keeps_only_what_differs_from_the_defaults(world: World) -> None:
    from portal.core import events
    from portal.notify.preferences import default_choice

    form: dict[str, str] = {}
    for name in events.CATALOGUE:
        choice = default_choice(name)
        form[f"{name}:email"] = choice.email
        if choice.toast:
            form[f"{name}:toast"] = "on"
        if choice.webhook:
            form[f"{name}:webhook"] = "on"
    form["job.placed:email"] = "now"
    del form["job.finished:toast"]
    answer = signed_in(world.researcher).post("/notify/preferences/", form)
    assert answer.status_code == 302
    rows = {p.event: (p.toast, p.email, p.webhook) for p in Preference.objects.filter(user=world.researcher)}
    assert rows == {"job.placed": (True, "now", False), "job.finished": (False, "digest", True)}


def test_registering_a_webhook_shows_its_secret_once(world: World) -> None:
    c = signed_in(world.colleague)
    answer = c.post("/notify/webhooks/new/", {"url": "https://h.example/nlp", "name": "nlp",
                                              "owner": f"group:{world.group.pk}", "submit_token": "t1"})
    hook = Webhook.objects.get()
    assert answer.status_code == 200 and hook.secret in answer.content.decode() and hook.group == world.group
    again = c.post("/notify/webhooks/new/", {"url": "https://h.example/nlp", "name": "nlp",
                                             "owner": f"group:{world.group.pk}", "submit_token": "t1"})
    assert again.status_code == 302 and Webhook.objects.count() == 1  # a double submit registers one
    bad = c.post("/notify/webhooks/new/", {"url": "ftp://x", "owner": "me", "submit_token": "t2"})
    assert bad.status_code == 400 and "url" in bad.content.decode()


def test_a_stranger_cannot_act_on_another_users_webhook(world: World) -> None:
    hook = create_webhook(world.researcher, url="https://h.example/a")
    assert signed_in(world.outsider).post(f"/notify/webhooks/{hook.pk}/delete/").status_code == 404
    assert signed_in(world.researcher).post(f"/notify/webhooks/{hook.pk}/disable/").status_code == 302
    assert not Webhook.objects.get(pk=hook.pk).enabled


def test_without_smtp_mail_is_stored_and_only_admins_read_it(world: World, settings: Any) -> None:
    settings.EMAIL_BACKEND = "portal.notify.mail.DatabaseBackend"
    django_mail.send_mail("[ReclaimNet] hello", "Your job “bert-finetune” must leave lab-a-01", "from@x",
                          ["alice@campus.example"])
    [stored] = StoredMail.objects.all()
    assert stored.to == "alice@campus.example"
    assert signed_in(world.researcher).get("/notify/mail/").status_code == 403
    page = signed_in(world.admin).get("/notify/mail/").content.decode()
    assert "[ReclaimNet] hello" in page and "must leave lab-a-01" in page
