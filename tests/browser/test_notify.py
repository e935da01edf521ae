"""Notifications where people look (docs/design.md §12): a researcher opens the notifications page from the top bar,
changes which events reach them, registers a webhook (its secret shown once), sends it a test and reads the
delivery log: the status code of each attempt. The notifications worker is played in this process with the real
attempt code, against a real HTTP receiver on loopback that checks the signature with the secret the page showed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from portal.notify import dispatch
from portal.notify.models import Delivery, Preference, Webhook
from tests.notify.servers import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(statuses=[500]).start()  # the first request fails, the next ones answer 200
    yield r
    r.stop()


def _play_worker(delivery: Delivery, attempt: int) -> str:
    """What the notifications worker does with the queued attempt (the browser stack runs no Celery worker)."""
    return dispatch.attempt_delivery(delivery.pk, attempt)


def test_preferences_and_a_webhook_with_its_delivery_log(
        page: Page, base_url: str, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any],
        receiver: Receiver) -> None:
    Webhook.objects.filter(user__username="researcher").delete()
    Preference.objects.filter(user__username="researcher").delete()
    login(page, "researcher")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Notifications").click()
    expect(page).to_have_url(re.compile(r"/notify/$"))
    expect(page.get_by_role("heading", name="Which events reach you")).to_be_visible()

    # Preferences: warnings in the digest, no toast for placements.
    page.get_by_label("Mail for job.warned").select_option("digest")
    page.get_by_label("Toast for job.placed").uncheck()
    page.get_by_role("button", name="Save preferences").click()
    expect(page.locator(".messages")).to_contain_text("Notification preferences saved.")
    expect(page.get_by_label("Mail for job.warned")).to_have_value("digest")
    expect(page.get_by_label("Toast for job.placed")).not_to_be_checked()
    rows = {p.event: (p.toast, p.email) for p in Preference.objects.filter(user__username="researcher")}
    assert rows["job.warned"][1] == "digest" and rows["job.placed"][0] is False

    # A webhook: a bad URL is refused and named, then the right one registers and shows its secret once.
    page.get_by_label("URL").fill("ftp://nowhere")
    page.get_by_role("button", name="Register webhook").click()
    expect(page.locator(".form-errors")).to_contain_text("url")
    page.get_by_label("URL").fill(receiver.url)
    page.get_by_label("Name").fill("my laptop")
    page.get_by_role("button", name="Register webhook").click()
    secret = page.get_by_test_id("webhook-secret").inner_text().strip()
    hook = Webhook.objects.get(user__username="researcher")
    assert secret == hook.secret and secret.startswith("whsec_")
    screenshot(page, "secret-once")
    receiver.secret = secret  # the receiver checks signatures with what the page showed
    page.get_by_role("link", name="Back to notifications").click()
    expect(page.get_by_test_id("webhooks")).to_contain_text(receiver.url)
    assert secret not in page.content()

    # Send a test; the first attempt meets a 500, the retry a 200: the log shows both status codes.
    page.get_by_test_id("webhooks").get_by_role("button", name="Send test").click()
    expect(page.locator(".messages")).to_contain_text("A test was queued")
    delivery = Delivery.objects.get(webhook=hook)
    assert _play_worker(delivery, 1) == "retrying"
    page.reload()
    log = page.get_by_test_id("delivery-log")
    expect(log.get_by_test_id("delivery-status").first).to_have_text("retrying")
    expect(log).to_contain_text("HTTP 500")
    assert _play_worker(delivery, 2) == "sent"
    page.reload()
    expect(log.get_by_test_id("delivery-status").first).to_have_text("sent")
    expect(log.get_by_test_id("attempt")).to_have_count(2)
    expect(log).to_contain_text("HTTP 200")
    assert [r.status for r in receiver.received] == [500, 200] and all(r.signature_ok for r in receiver.received)
    screenshot(page, "delivery-log")

    # Disabled, it receives nothing more.
    page.get_by_test_id("webhooks").get_by_role("button", name="Disable").click()
    expect(page.get_by_test_id("webhooks")).to_contain_text("disabled")
    assert not Webhook.objects.get(pk=hook.pk).enabled


def test_the_admin_reads_the_mail_the_portal_stored(page: Page, base_url: str,
                                                     login: Callable[[Page, str], None]) -> None:
    from django.core.mail import get_connection, send_mail

    send_mail("[ReclaimNet] Browser test mail", "Your job “x” must leave lab-a-01 by 14:05 UTC.", None,
              ["researcher@campus.example"], connection=get_connection("portal.notify.mail.DatabaseBackend"))
    login(page, "admin")
    page.goto(base_url + "/notify/")
    page.get_by_role("link", name="Mail stored by the portal").click()
    expect(page.get_by_test_id("stored-mail").first).to_contain_text("[ReclaimNet] Browser test mail")
    expect(page.get_by_test_id("stored-mail").first).to_contain_text("must leave lab-a-01")
