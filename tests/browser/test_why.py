"""A researcher sees, in plain words and without reloading, why a queued job waits, and why each placement and
migration on the timeline went where it went (design §3; portal/core/services/explain.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import Page, expect

from portal.control.models import AgentSession
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.models import DecisionLog, Job, Migration, Node, Placement, ReclaimEvent, ResearchGroup
from tests.browser.conftest import publish_live


def _job(name: str, **fields: Any) -> Job:
    return Job.objects.create(name=name, owner=get_user_model().objects.get(username="researcher"),
                              group=ResearchGroup.objects.get(name="NLP Group"), command="python train.py",
                              expected_runtime_s=7200, ckpt_bytes_estimate=4_200_000_000, **fields)


def test_a_queued_job_says_why_it_waits_and_the_reason_follows_the_campus_live(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    # No agent is connected (another test may have left sessions open): no lent node can start a job right now.
    AgentSession.objects.filter(closed_at=None).update(closed_at=timezone.now())
    job = _job("browser-wide", gpu_count=4)
    a100 = Node.objects.filter(gpus__model="A100").distinct().order_by("name").first()
    assert a100 is not None
    state_before = a100.state
    login(page, "researcher")
    page.goto(f"/jobs/{job.pk}/")
    why = page.get_by_test_id("waiting-text")
    expect(why).to_contain_text("No lent node has 4 GPUs free right now.")
    expect(why).to_contain_text("A100 nodes that would fit")
    expect(page.locator("#waiting-reason")).to_contain_text(re.compile(r"Nodes: \d+ with fewer GPUs than it asks for"))
    expect(why).not_to_contain_text("#")
    screenshot(page, "why-it-waits")

    expect(page.locator("body")).to_have_attribute("data-live-state", "open")  # following the job's events
    page.evaluate("window.__sameDocument = true")
    try:
        # Play the control plane: the A100's owner starts reclaiming it; the job's page hears of it and re-reads.
        Node.objects.filter(pk=a100.pk).update(state="draining")
        publish_live([f"job-{job.pk}"], "job.state", job_id=job.pk, state="queued")
        expect(why).to_contain_text("being reclaimed by its owner")
        # Then the job is placed: the explanation goes away.
        Placement.objects.create(job=job, node=Node.objects.exclude(pk=a100.pk).order_by("name").first(),
                                 gpu_indices=[0, 1, 2, 3])
        job_lifecycle.start(job)
        publish_live([f"job-{job.pk}"], "job.state", job_id=job.pk, state="running")
        expect(page.get_by_test_id("job-state").first).to_have_text("running")
        expect(page.get_by_test_id("waiting-reason")).to_have_count(0)
    finally:
        Node.objects.filter(pk=a100.pk).update(state=state_before)
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded instead of updating live"


def test_the_timeline_says_in_plain_words_why_each_placement_and_migration_went_there(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    job = _job("browser-why-there", gpu_count=1)
    first, second, third, busy = Node.objects.filter(state="online").order_by("building__name", "name")[:4]
    # The rows the control plane writes: a fresh placement (P2 by survival, design §3) …
    DecisionLog.objects.create(
        kind="p2", job=job,
        request={"placement": job.pk, "gpus": 1, "vram_gb": 0.0, "remaining_s": 7200.0,
                 "feasible": [first.pk, second.pk, third.pk]},
        response={"destination": first.pk, "survival": 0.96,
                  "runners_up": [{"id": second.pk, "survival": 0.9}, {"id": third.pk, "survival": 0.8}]})
    Placement.objects.create(job=job, node=first, gpu_indices=[0])
    job_lifecycle.start(job)
    login(page, "researcher")
    page.goto(f"/jobs/{job.pk}/")
    placed = page.get_by_test_id("placement-why")
    expect(placed).to_contain_text(f"{first.name} was chosen: the lowest reclaim risk 0.02/h (96 % chance it stays "
                                   "lent for the 2 h left).")
    expect(placed).to_contain_text(f"Runners-up: {second.name} (reclaim risk 0.053/h), {third.name}")
    expect(placed).to_contain_text("3 nodes had room for it")

    # … then its node is reclaimed and P2 scores the destinations (design §5 p2 response); it arrives live (an
    # event published before the page follows the job's group is lost: wait until it does).
    expect(page.locator("body")).to_have_attribute("data-live-state", "open")
    page.evaluate("window.__sameDocument = true")
    now = timezone.now()
    reclaim = ReclaimEvent.objects.create(node=first, kind="scheduled", notice_s=600,
                                          deadline_at=now + timedelta(seconds=600), outcome="completed")
    DecisionLog.objects.create(
        kind="p2", job=job, reclaim=reclaim,
        request={"source": first.pk, "ckpt_holder": first.pk, "ckpt_bytes": 4.2e9, "restart_s": 30.0,
                 "notice_s": 600.0, "remaining_s": 7200.0, "k_min": 2},
        response={"destination": second.pk,
                  "candidates": [{"id": second.pk, "transfer_s": 32.0, "survival": 0.67, "score": 45.0, "local": True},
                                 {"id": third.pk, "transfer_s": 63.6, "survival": 0.7, "score": 75.0, "local": True}],
                  "excluded": [{"id": busy.pk, "reason": "busy"}]})
    Migration.objects.create(job=job, reclaim=reclaim, source=first, destination=second, mode="planned",
                             bytes=4_200_000_000, assigned_rate_bytes_per_s=2.1e9, downtime_s=40.0, work_lost_s=0.0,
                             success=True, finished_at=now + timedelta(seconds=40))
    Placement.objects.filter(job=job, ended_at__isnull=True).update(ended_at=now, end_reason="reclaimed")
    Placement.objects.create(job=job, node=second, gpu_indices=[0])
    publish_live([f"job-{job.pk}", f"group-{job.group_id}"], "migration", job_id=job.pk, mode="planned",
                 status="finished")
    moved = page.get_by_test_id("migration-why")
    expect(moved).to_contain_text(f"{second.name} was chosen: 2.1 GB/s to the checkpoint's copy (the fastest), 32 s "
                                  "to copy and restart")
    expect(moved).to_contain_text(f"Runners-up: {third.name} (only 125 MB/s to the copy).")
    expect(moved).to_contain_text("The other node had too few free GPUs.")
    for text in page.locator("#timeline .why").all_inner_texts():
        assert not re.search(r"#\d|\bnode \d", text), text
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded instead of updating live"
    screenshot(page, "why-there")
