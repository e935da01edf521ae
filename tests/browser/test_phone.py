"""Phone width (390 px): the provider's and the researcher's pages fit without sideways scrolling, and the
reclaim dialog works from the keyboard alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from playwright.sync_api import Page, expect

from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.lifecycle import nodes as node_lifecycle
from portal.core.models import Job, Node, Placement, ResearchGroup

PHONE = {"width": 390, "height": 844}
FITS = "document.documentElement.scrollWidth <= window.innerWidth + 1"


def test_provider_pages_at_phone_width(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    # A node of the lab with a job of its own running on it (other browser tests reclaim the seeded ones).
    node = (Node.objects.filter(provider__name="Vision Lab", state__in=["online", "offline", "registered"])
            .order_by("name").first())
    assert node is not None
    if node.state != "online":
        node_lifecycle.come_online(node)
    group = ResearchGroup.objects.get(name="NLP Group")
    job = Job.objects.create(name="phone-width-job", owner=group.members.first(), group=group,
                             command="python train.py", gpu_count=1, expected_runtime_s=7200,
                             ckpt_bytes_estimate=2_000_000_000, restart_s=30)
    Placement.objects.create(job=job, node=node, gpu_indices=[0])
    job_lifecycle.start(job)
    page.set_viewport_size(PHONE)
    login(page, "provider")
    for url, what in (("/provider/", "nodes"), (f"/provider/nodes/{node.pk}/", "node"),
                      (f"/provider/nodes/{node.pk}/reclaim/", "reclaim")):
        page.goto(url)
        assert page.evaluate(FITS), url
        screenshot(page, what)

    # The point of the dialog, each hosted job's outcome, is on screen without scrolling sideways.
    outcomes = page.locator("#reclaim-preview").get_by_test_id("outcome")
    assert outcomes.count() > 0
    for i in range(outcomes.count()):
        box = outcomes.nth(i).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box

    # Keyboard only on the reclaim dialog: Tab to the notice field, type a notice, the preview follows.
    page.locator("#id_notice_s").focus()
    page.keyboard.press("Control+A")
    page.keyboard.type("45")
    expect(page.locator("#reclaim-preview")).to_contain_text("With 45 s notice")
    page.keyboard.press("Shift+Tab")  # back to the presets
    focused = page.evaluate("document.activeElement.name")
    assert focused == "notice_preset"
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none", "focused control shows no focus ring"


def test_researcher_pages_at_phone_width(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    job = Job.objects.filter(group__name="NLP Group", migrations__isnull=False).distinct().first()
    page.set_viewport_size(PHONE)
    login(page, "researcher")
    for url, what in (("/jobs/", "jobs"), ("/jobs/new/", "submit"), (f"/jobs/{job.pk}/", "job")):
        page.goto(url)
        assert page.evaluate(FITS), url
        screenshot(page, what)
