"""What a provider (and everyone) sees is true and stays true without a reload: the node
page's actions follow a reclaim as it completes, lending windows show in the node list, relative times keep
moving in the server's own words, counts are singular or plural, and no page asks for anything that is not there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import time, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from playwright.sync_api import Page, Response, expect

from portal.core.lifecycle import nodes as node_lifecycle
from portal.core.models import Job, Node, ReclaimEvent
from portal.core.services import nodes as node_services
from portal.web.templatetags.reclaimnet import duration


def _own_online_node(name: str) -> Node:
    """A Vision Lab node of this test's own, online and hosting nothing. The shared campus's idle nodes are not
    used: which of them the seeded history leaves idle depends on the hour it was seeded (its reclaims fall in
    peak hours before ``now``), and a run seeded at 18:14 left only one."""
    vision = Node.objects.filter(provider__name="Vision Lab").order_by("name").first()
    provider = get_user_model().objects.get(username="provider")
    node, _ = node_services.register_node(provider, provider=vision.provider, building=vision.building, name=name,
                                         gpus=[{"model": "RTX 3090"}])
    node_lifecycle.come_online(node)
    node.refresh_from_db()
    return node


def _vision_node_with(gpus: int) -> Node:
    """A Vision Lab node with exactly ``gpus`` GPUs (any state: only its page is read)."""
    return next(n for n in Node.objects.filter(provider__name="Vision Lab").prefetch_related("gpus").order_by("name")
                if n.gpus.count() == gpus)


def _in_worker(action: Callable[[], Any]) -> Any:
    """Run control-plane code the way a worker does: in a thread of its own (Playwright's sync API keeps an
    event loop in this one, where the live publish's ``async_to_sync`` refuses to run)."""

    def run() -> Any:
        try:
            return action()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result(timeout=30)


def test_node_actions_update_live_after_a_reclaim(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    """The badge, the "Reclaim…" link and "Lend again" change together when the control plane gives the node
    back, with no reload: the header actions are a live fragment like the state."""
    from portal.control.reclaim.apply import run_reclaim

    node = _own_online_node("eng-truth-actions")
    login(page, "provider")
    page.goto(f"/provider/nodes/{node.pk}/")
    actions = page.locator("#node-actions")
    page.get_by_role("link", name="Reclaim…").click()
    expect(page.locator("main")).not_to_contain_text("C/B")
    page.get_by_role("button", name=re.compile(r"^Confirm reclaim with")).click()
    expect(page.locator(".messages")).to_contain_text("requested")
    expect(page.get_by_test_id("node-state")).to_have_text("draining")
    expect(actions.get_by_role("button", name="Lend again")).to_have_count(0)
    body = page.locator("body")
    expect(body).to_have_attribute("data-live-state", "open")
    page.evaluate("window.__sameDocument = true")

    # The control plane runs the reclaim: nothing to move, so it drains at once and gives the node back.
    reclaim = ReclaimEvent.objects.filter(node=node).latest("requested_at")
    assert _in_worker(lambda: run_reclaim(reclaim.pk)) == "released"

    expect(page.get_by_test_id("node-state")).to_have_text("reclaimed")
    expect(page.locator("#node-state")).to_contain_text("none lent now")
    expect(actions.get_by_role("button", name="Lend again")).to_be_visible()
    expect(actions.get_by_role("link", name="Reclaim…")).to_have_count(0)
    expect(body).to_have_attribute("data-live-state", "open")
    assert page.evaluate("window.__sameDocument === true")
    screenshot(page, "reclaimed-lend-again-live")

    actions.get_by_role("button", name="Lend again").click()
    expect(page.locator(".messages")).to_contain_text("lent again")
    expect(page.get_by_test_id("node-state")).to_have_text("offline")
    expect(page.locator("#node-actions").get_by_role("link", name="Reclaim…")).to_be_visible()
    node.refresh_from_db()
    node_lifecycle.come_online(node)  # leave the shared campus as it was


@pytest.fixture
def lent_on_weekday_nights() -> Iterator[Node]:
    """One Vision Lab node lent on weekday nights only (the shared campus is put back afterwards)."""
    node = _own_online_node("eng-truth-windows")
    provider = get_user_model().objects.get(username="provider")
    node_services.set_lending_windows(node, provider, [
        {"weekday": day, "start_time": time(18), "end_time": time(8)} for day in range(5)])
    yield node
    node_services.set_lending_windows(node, provider, [])


def test_lending_windows_in_the_node_list_and_their_errors_summarised(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any],
    lent_on_weekday_nights: Node,
) -> None:
    node = lent_on_weekday_nights
    other = Node.objects.filter(provider__name="Vision Lab", lending_windows__isnull=True).order_by("name").first()
    login(page, "provider")
    expect(page.locator(f"#node-{node.pk}").get_by_test_id("lending")).to_have_text("weekdays 18:00–08:00")
    expect(page.locator(f"#node-{other.pk}").get_by_test_id("lending")).to_have_text("always")
    screenshot(page, "lending-windows-in-list")

    page.goto(f"/provider/nodes/{node.pk}/")
    expect(page.locator("#node-state").get_by_test_id("lending")).to_have_text("weekdays 18:00–08:00")
    blank = page.locator(".window-row").last
    blank.get_by_label("Day").select_option(label="Saturday")
    blank.get_by_label("From").fill("09:00")
    blank.get_by_label("Until").fill("09:00")
    page.get_by_role("button", name="Save lending settings").click()
    summary = page.get_by_test_id("settings-errors")
    expect(summary).to_contain_text("Please correct the 1 field marked below.")
    expect(page.locator(".window-row .field.invalid")).to_contain_text("must not start and end at the same time")
    screenshot(page, "window-error-summary")


def test_relative_time_advances_without_reload(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    node = _own_online_node("eng-truth-heartbeat")
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=5, seconds=3))
    page.clock.install()
    login(page, "provider")
    page.goto(f"/provider/nodes/{node.pk}/")
    heartbeat = page.locator("#node-state time")
    expect(heartbeat).to_have_text(re.compile(r"^5 min [0-9]+ s ago$"))
    page.evaluate("window.__sameDocument = true")
    page.clock.run_for(2 * 60_000)
    expect(heartbeat).to_have_text(re.compile(r"^7 min [0-9]+ s ago$"))
    assert page.evaluate("window.__sameDocument === true")
    screenshot(page, "heartbeat-age-moved")

    # The page's words are the server's: the script and the `duration` filter agree.
    for seconds in (0.4, 3.3, 9.96, 12.2, 59.4, 60, 146, 3599, 3661, 7200, 90061):
        words = "just now" if seconds < 1 else duration(seconds) + " ago"
        assert page.evaluate("s => window.reclaimnetTimes.age(s)", seconds) == words, seconds


PAGES = {
    "provider": ["/provider/", "/provider/nodes/{node}/", "/provider/nodes/{node}/reclaim/", "/provider/reclaims/",
                 "/provider/nodes/register/"],
    "researcher": ["/jobs/", "/jobs/{job}/", "/jobs/new/"],
    "admin": ["/dashboard/", "/provider/", "/jobs/", "/provider/nodes/{node}/", "/jobs/{job}/", "/admin/"],
}


def test_no_request_a_page_makes_answers_an_error(
    page: Page, base_url: str, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    """Every script, stylesheet, icon and fragment each page asks for is there (the favicon included)."""
    node = Node.objects.filter(provider__name="Vision Lab").order_by("name").first()
    job = Job.objects.filter(group__name="NLP Group").order_by("-pk").first()
    failed: list[str] = []

    def watch(response: Response) -> None:
        if response.status >= 400:
            failed.append(f"{response.status} {response.url} (page {page.url})")

    page.on("response", watch)
    # A request the browser itself abandoned because the page moved on (net::ERR_ABORTED) is not an error answer.
    page.on("requestfailed", lambda request: None if "ERR_ABORTED" in (request.failure or "") else
            failed.append(f"failed {request.url} (page {page.url}): {request.failure}"))
    for role, urls in PAGES.items():
        page.context.clear_cookies()
        login(page, role)
        for url in urls:
            page.goto(url.format(node=node.pk, job=job.pk))
            page.wait_for_load_state("networkidle")
            icon = page.locator('link[rel="icon"]')
            if url != "/admin/":
                expect(icon).to_have_attribute("href", "/static/web/favicon.svg")
    assert failed == []
    favicon = page.request.get(base_url + "/favicon.ico")
    assert favicon.ok and favicon.headers["content-type"].startswith("image/svg")
    screenshot(page, "admin-index")


def test_counts_are_singular_or_plural_and_admin_labels_are_not_mine(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    one, four = _vision_node_with(gpus=1), _vision_node_with(gpus=4)
    login(page, "provider")
    page.goto(f"/provider/nodes/{one.pk}/")
    gpus = page.locator("#node-state .stat").nth(1)  # <b>count</b><span>GPU or GPUs, N lent</span>
    expect(gpus).to_have_text(re.compile(r"^\s*1\s*GPU, ([0-9]+ lent|none lent now)\s*$"))
    page.goto(f"/provider/nodes/{four.pk}/")
    expect(gpus).to_have_text(re.compile(r"^\s*4\s*GPUs, ([0-9]+ lent|none lent now)\s*$"))
    screenshot(page, "four-gpus")

    page.context.clear_cookies()
    login(page, "admin")
    nav = page.get_by_role("navigation", name="Main")
    expect(nav).to_contain_text("Nodes")
    expect(nav).not_to_contain_text("My ")
    page.goto("/provider/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Nodes")
    page.goto("/jobs/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Jobs")
    page.goto("/admin/")
    expect(page.locator("#content-main")).to_contain_text("Switches")
    expect(page.locator("#content-main")).to_contain_text("GPUs")
    expect(page.locator("#content-main")).not_to_contain_text("Switchs")
    screenshot(page, "django-admin-plurals")
