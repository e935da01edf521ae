"""With DEBUG off (as the demo and production run), a wrong turn shows the portal's own page in its own look —
what happened and what to do — never Django's technical page with the URL list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playwright.sync_api import Page, expect

TECHNICAL = ("Using the URLconf", "Django tried these URL patterns", "DEBUG = True", "Traceback")


def _ours(page: Page, title: str) -> None:
    expect(page).to_have_title(f"{title} · ReclaimNet")
    expect(page.locator(".card h1")).to_be_visible()
    expect(page.get_by_role("link", name="Back to your home page")).to_be_visible()
    body = page.content()
    for words in TECHNICAL:
        assert words not in body, words
    # The stylesheet came through (static files are served with DEBUG off): the top bar has the site's colour.
    assert page.evaluate("getComputedStyle(document.querySelector('.topbar')).backgroundColor") == "rgb(17, 24, 39)"


def test_a_researcher_opening_the_dashboard_gets_our_not_found_page(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    login(page, "researcher")
    response = page.goto("/dashboard/")
    assert response is not None and response.status == 404
    _ours(page, "Not found")
    expect(page.locator("main")).to_contain_text("the dashboard to campus admins")
    expect(page.get_by_role("navigation", name="Main")).to_be_visible()  # still signed in, the menu is there
    screenshot(page, "dashboard-as-researcher")


def test_an_unknown_address_gets_our_not_found_page(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    response = page.goto("/no-such-page/")
    assert response is not None and response.status == 404
    _ours(page, "Not found")
    login(page, "provider")
    response = page.goto("/provider/nodes/999999/")
    assert response is not None and response.status == 404
    _ours(page, "Not found")
    expect(page.locator("main")).to_contain_text("Check the address")
    screenshot(page, "unknown-node")


def test_a_form_sent_without_its_token_gets_our_refusal_page(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    """A stale or forged form (no CSRF token) is refused with a page that says nothing changed and what to do."""
    login(page, "researcher")
    page.goto("/jobs/")
    page.evaluate("document.querySelector('.who form input[name=csrfmiddlewaretoken]').remove()")
    with page.expect_navigation():
        page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_title("Form expired · ReclaimNet")
    expect(page.locator("main")).to_contain_text("Nothing was changed")
    expect(page.locator("main")).to_contain_text("reload the page and send the form again")
    for words in (*TECHNICAL, "CSRF verification failed"):
        assert words not in page.content(), words
    screenshot(page, "form-refused")
