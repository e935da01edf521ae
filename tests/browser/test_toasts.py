"""Toasts are the events people care about, in their words, where they hide nothing (docs/design.md §9.12).

The control plane is played through its real code: a running job's checkpoint is reported through the agent
handler (an internal refresh event, no toast), then a queued job is placed by the real placement (a notice naming
the job). At 1280 px and at 390 px the toast's box intersects no table cell and no card.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from django.db import transaction
from django.utils import timezone
from playwright.sync_api import Page, expect

from portal.control.link.handlers import checkpoint_done
from portal.control.loop.ticks import place_job
from portal.control.models import AgentSession
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.models import Checkpoint, Job, Node, Placement, ResearchGroup
from portal.notify.models import Preference

DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
# Every toast box against every table cell and card box (viewport coordinates, both).
OVERLAPS = """() => {
  const box = (e) => e.getBoundingClientRect();
  const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const toasts = [...document.querySelectorAll('#live-log .toast')].map(box);
  const content = [...document.querySelectorAll('td, th, .card')].filter((e) => box(e).width && box(e).height);
  const out = [];
  for (const t of toasts) for (const e of content) if (hit(t, box(e))) out.push(e.tagName + '.' + e.className);
  return {toasts: toasts.length, content: content.length, overlaps: out};
}"""


def _no_overlap(page: Page) -> None:
    for scroll in ("window.scrollTo(0, 0)", "window.scrollTo(0, document.body.scrollHeight)"):
        page.evaluate(scroll)
        found = page.evaluate(OVERLAPS)
        assert found["toasts"] >= 1 and found["content"] > 0, found
        assert found["overlaps"] == [], found
    page.evaluate("window.scrollTo(0, 0)")


@contextlib.contextmanager
def _live_agent(node: Node) -> Iterator[None]:
    """The node counts as having a connected agent (placement only uses those) for the block."""
    session = AgentSession.objects.create(node=node, channel_name="browser-test", data_host="127.0.0.1",
                                          data_port=9, agent_version="test")
    try:
        yield
    finally:
        AgentSession.objects.filter(pk=session.pk).update(closed_at=timezone.now(), close_reason="test over")


def _queued(name: str) -> Job:
    group = ResearchGroup.objects.get(name="NLP Group")
    owner = group.members.get(username="researcher")
    return Job.objects.create(name=name, owner=owner, group=group, command="python train.py", gpu_count=1,
                              expected_runtime_s=3600, ckpt_bytes_estimate=1_000_000_000)


def _place(job: Job, node: Node) -> None:
    with _live_agent(node):  # at least this node may take it (other tests may have connected more)
        assert place_job(job.pk).startswith("placed on "), "the job found no node"


def _free_node() -> Node:
    busy = Placement.objects.filter(ended_at__isnull=True).values_list("node_id", flat=True)
    node = (Node.objects.filter(state="online", killswitch_engaged=False, lending_windows__isnull=True)
            .exclude(pk__in=busy).order_by("name").first())
    assert node is not None, "the seeded campus has an idle, always-lent node"
    return node


def _report_checkpoint(job: Job) -> None:
    """What an agent's checkpoint report does (portal.control.link.handlers.checkpoint_done)."""
    placement = Placement.objects.get(job=job, ended_at__isnull=True)
    sequence = 1 + max(Checkpoint.objects.filter(job=job).values_list("sequence", flat=True), default=0)
    with transaction.atomic():
        checkpoint_done(placement.node_id, {
            "type": "checkpoint_done", "job_id": job.pk, "sequence": sequence, "step": 100 * sequence,
            "size_bytes": 1000, "sha256": "d" * 64, "taken_at": timezone.now().timestamp(), "final": False,
            "compat": {}})


def _leave(job: Job) -> None:
    """Give the shared campus its GPUs back."""
    Placement.objects.filter(job=job, ended_at__isnull=True).update(ended_at=timezone.now(), end_reason="test")
    job.refresh_from_db()
    job_lifecycle.cancel(job)


def test_a_checkpoint_raises_no_toast_and_a_placement_one_that_hides_nothing(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    running = Job.objects.filter(group__name="NLP Group", state="running").order_by("pk").first()
    assert running is not None, "the seeded history leaves NLP Group jobs running"
    # The researcher's notification choices at their defaults (a toast for job.placed): another test of the
    # session may have turned that toast off.
    Preference.objects.filter(user__username="researcher").delete()
    page.set_viewport_size(DESKTOP)
    login(page, "researcher")
    page.goto("/jobs/")
    expect(page.locator("body")).to_have_attribute("data-live-state", "open")

    _report_checkpoint(running)
    first = _queued("toast-bert-finetune")
    try:
        _place(first, _free_node())
        toast = page.locator("#live-log .toast")
        expect(toast).to_have_count(1)  # the checkpoint came first on the same socket and raised none
        expect(toast).to_contain_text("Your job “toast-bert-finetune” was placed on ")
        expect(toast).not_to_contain_text("#")
        _no_overlap(page)
        screenshot(page, "toast-desktop")
    finally:
        _leave(first)

    page.set_viewport_size(PHONE)
    page.goto(f"/jobs/{running.pk}/")
    expect(page.locator("body")).to_have_attribute("data-live-state", "open")
    second = _queued("toast-vit-small")
    try:
        _place(second, _free_node())
        toast = page.locator("#live-log .toast")
        expect(toast).to_contain_text("Your job “toast-vit-small” was placed on ")
        _no_overlap(page)
        screenshot(page, "toast-phone")
        toast.get_by_role("button", name="Dismiss").click()
        expect(toast).to_have_count(0)
    finally:
        _leave(second)
