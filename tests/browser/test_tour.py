"""Every page of each role, at desktop (1280 px) and phone (390 px) width: it answers, it fits the screen without
sideways scrolling, nothing on it fails to load, and a screenshot of it lands in test-artifacts/screenshots/tour/.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Page

from portal.core.models import Job, Node

WIDTHS = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}
FITS = "document.documentElement.scrollWidth <= window.innerWidth + 1"


def _pages(role: str) -> list[tuple[str, str]]:
    """(name, URL) of every page the role's nav and lists lead to, with a real node and job of the seeded campus."""
    node = Node.objects.filter(provider__name="Vision Lab").order_by("name").first()
    job = Job.objects.filter(group__name="NLP Group").order_by("-pk").first()
    assert node is not None and job is not None, "the seeded campus has a lab node and a group job"
    researcher = [("jobs", "/jobs/"), ("job-submit", "/jobs/new/"), ("job", f"/jobs/{job.pk}/")]
    provider = [("nodes", "/provider/"), ("node", f"/provider/nodes/{node.pk}/"),
                ("reclaim-dialog", f"/provider/nodes/{node.pk}/reclaim/"), ("reclaims", "/provider/reclaims/"),
                ("register", "/provider/nodes/register/")]
    everyone = [("api-docs", "/api/docs/"), ("api-redoc", "/api/redoc/")]
    return {
        "researcher": researcher + everyone,
        "provider": provider + everyone,
        "admin": [("dashboard", "/dashboard/"), ("dashboard-30d", "/dashboard/?range=30d"), *researcher, *provider,
                  ("django-admin", "/admin/"), *everyone],
    }[role]


@pytest.mark.parametrize("width", list(WIDTHS))
@pytest.mark.parametrize("role", ["researcher", "provider", "admin"])
def test_every_page_of_the_role_answers_fits_and_loads_everything(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any], role: str, width: str
) -> None:
    page.set_viewport_size(WIDTHS[width])
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    # Sockets close when the page moves on, and a request the browser abandoned for that reason
    # (net::ERR_ABORTED) is not an error answer.
    page.on("requestfailed", lambda r: None if "/ws/" in r.url or "ERR_ABORTED" in (r.failure or "")
            else failed.append(f"failed {r.url}: {r.failure}"))
    login(page, role)
    for name, url in _pages(role):
        response = page.goto(url)
        assert response is not None and response.status == 200, (url, response and response.status)
        page.wait_for_load_state("networkidle")
        # Our pages fit a phone; the API browsers and Django's admin are third-party layouts.
        if width == "phone" and not url.startswith(("/api/", "/admin/")):
            assert page.evaluate(FITS), f"{url} scrolls sideways at {WIDTHS[width]['width']} px"
        screenshot(page, f"tour-{role}-{width}-{name}")
    assert failed == [], failed
