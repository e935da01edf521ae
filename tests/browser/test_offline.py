"""No page fetches anything from outside the portal: the network to every other host is cut, and any attempt
fails the test. The API docs (Swagger UI, ReDoc) render their operations from the portal's own files, under
the Content-Security-Policy the portal sends (a refused script or style would show as a console error)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, Route, expect

from portal.core.models import Job, Node


class Outside:
    """Every request of the page to a host other than the portal's, aborted and remembered; CSP refusals too."""

    def __init__(self, page: Page, portal_url: str) -> None:
        self.portal = urlsplit(portal_url).netloc
        self.attempts: list[str] = []
        self.refusals: list[str] = []
        page.route("**/*", self._route)
        page.on("console", self._console)

    def _route(self, route: Route) -> None:
        url = route.request.url
        if url.startswith(("data:", "blob:")) or urlsplit(url).netloc == self.portal:
            route.continue_()
        else:
            self.attempts.append(url)
            route.abort("blockedbyclient")

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text or "Refused to" in message.text:
            self.refusals.append(message.text)


@pytest.fixture
def outside(page: Page, base_url: str) -> Iterator[Outside]:
    cut = Outside(page, base_url)
    yield cut
    assert cut.attempts == [], f"pages tried to reach outside the portal: {cut.attempts}"


def _visit(page: Page, url: str) -> None:
    response = page.goto(url)
    assert response is not None and response.status == 200, url
    page.wait_for_load_state("networkidle")


def test_swagger_ui_renders_the_operations_with_nothing_from_outside(
    page: Page, outside: Outside, screenshot: Callable[[Any, str], Any]
) -> None:
    _visit(page, "/api/docs/")
    expect(page.locator(".opblock").first).to_be_visible()
    expect(page.locator(".opblock-summary-path", has_text="/api/jobs/").first).to_be_visible()
    assert page.locator(".opblock").count() > 20
    assert outside.refusals == []
    screenshot(page, "swagger")


def test_redoc_renders_the_operations_with_nothing_from_outside(
    page: Page, outside: Outside, screenshot: Callable[[Any, str], Any]
) -> None:
    _visit(page, "/api/redoc/")
    operations = page.locator("[data-section-id^='operation/']")
    expect(operations.first).to_be_attached()
    assert operations.count() > 20
    expect(page.get_by_text("ReclaimNet portal API").first).to_be_visible()
    assert outside.refusals == []
    screenshot(page, "redoc")


@pytest.mark.parametrize("role", ["researcher", "provider", "admin"])
def test_each_roles_main_pages_load_nothing_from_outside(
    page: Page, outside: Outside, login: Callable[[Page, str], None], role: str
) -> None:
    _visit(page, "/accounts/login/")
    login(page, role)
    job = Job.objects.filter(group__name="NLP Group").order_by("pk").first()
    node = Node.objects.filter(provider__name="Vision Lab").order_by("name").first()
    pages = {
        "researcher": ["/jobs/", "/jobs/new/", f"/jobs/{job.pk}/"],
        "provider": ["/provider/", f"/provider/nodes/{node.pk}/", f"/provider/nodes/{node.pk}/reclaim/",
                     "/provider/reclaims/", "/provider/nodes/register/"],
        "admin": ["/dashboard/", "/provider/", "/jobs/", f"/jobs/{job.pk}/", "/admin/"],
    }[role]
    for url in pages:
        _visit(page, url)
    assert outside.refusals == [], outside.refusals
