"""Permissions in the browser: a researcher cannot reach provider pages or another group's job; a provider
cannot reclaim another lab's node by editing a URL or a form; everything needs a login; keyboard works."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from playwright.sync_api import Page, expect

from portal.core.models import Job, Node, ReclaimEvent


def test_researcher_is_kept_out(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    login(page, "researcher")
    node = Node.objects.filter(provider__name="Vision Lab").first()
    for url in ("/provider/", f"/provider/nodes/{node.pk}/reclaim/", "/dashboard/"):
        response = page.goto(url)
        assert response is not None and response.status == 404, url
    other = Job.objects.exclude(group__name="NLP Group").first()
    response = page.goto(f"/jobs/{other.pk}/")
    assert response is not None and response.status == 404
    screenshot(page, "other-groups-job-404")
    page.goto("/jobs/")
    expect(page.get_by_role("navigation", name="Main")).not_to_contain_text("My nodes")


def test_provider_cannot_reclaim_another_labs_node(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    own = Node.objects.filter(provider__name="Vision Lab", state="online").order_by("name").first()
    foreign = Node.objects.exclude(provider__name="Vision Lab").filter(state="online").order_by("name").first()
    before = ReclaimEvent.objects.filter(node=foreign).count()
    login(page, "provider")

    response = page.goto(f"/provider/nodes/{foreign.pk}/reclaim/")  # by editing the URL
    assert response is not None and response.status == 404

    page.goto(f"/provider/nodes/{own.pk}/reclaim/")  # by editing the form's target in the page
    page.locator("#emergency-confirm").check()
    page.evaluate(
        "id => { const f = document.querySelector('form[action$=\"/reclaim/emergency/\"]');"
        " f.action = f.action.replace(/nodes\\/\\d+\\//, 'nodes/' + id + '/'); }",
        foreign.pk,
    )
    with page.expect_navigation() as nav:
        page.get_by_role("button", name="Emergency reclaim now").click()
    assert nav.value is not None and nav.value.status == 404
    assert ReclaimEvent.objects.filter(node=foreign).count() == before
    foreign.refresh_from_db()
    assert foreign.state == "online"
    screenshot(page, "foreign-node-404")


def test_login_required_and_keyboard_only_sign_in(
    page: Page, base_url: str, screenshot: Callable[[Any, str], Any]
) -> None:
    page.goto("/jobs/")
    assert "/accounts/login/" in page.url
    # Keyboard only: Tab to the fields, type, Enter.
    page.keyboard.press("Tab")  # skip link
    page.keyboard.press("Tab")  # brand
    focused = ""
    for _ in range(4):
        page.keyboard.press("Tab")
        focused = page.evaluate("document.activeElement.name || ''")
        if focused == "username":
            break
    assert focused == "username"
    page.keyboard.type("researcher")
    page.keyboard.press("Tab")
    page.keyboard.type("reclaimnet-demo")
    page.keyboard.press("Enter")
    # A refused sign-in re-renders /accounts/login/?next=/jobs/, which a "**/jobs/" glob would also match.
    page.wait_for_url(re.compile(r"^[^?]*/jobs/$"))
    expect(page.get_by_role("navigation", name="Main")).to_contain_text("My jobs")
    screenshot(page, "signed-in-by-keyboard")
