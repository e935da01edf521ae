"""The fair queue on the pages (design §16.6): a waiting job's page shows its priority with its terms and an
estimated start, as the placement pass computed them; an array submitted from the form lands on its page with
every task listed."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import Page, expect

from portal.control.loop.ticks import place_queued
from portal.control.models import AgentSession
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.models import Job, Node, Placement, ResearchGroup
from portal.queue.models import JobArray, QueueEntry

TERMS = re.compile(r"\d\.\d\d = class \d\.\d\d \+ fair share \d\.\d\d \+ age \d\.\d\d")


def _job(name: str, **fields: Any) -> Job:
    return Job.objects.create(name=name, owner=get_user_model().objects.get(username="researcher"),
                              group=ResearchGroup.objects.get(name="NLP Group"), command="python train.py",
                              ckpt_bytes_estimate=4_200_000_000, **fields)


def test_a_waiting_jobs_page_shows_its_priority_terms_and_estimated_start(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    # No agent is connected: nothing can start now, so the pass only ranks and estimates.
    AgentSession.objects.filter(closed_at=None).update(closed_at=timezone.now())
    a100 = Node.objects.filter(gpus__model="A100").distinct().order_by("name")
    # a free A100 node if the seeded history (relative to now) left one; else any: the waiter waits either way
    node = a100.exclude(placements__ended_at=None).first() or a100.first()
    assert node is not None
    running = _job("queue-holder", gpu_count=4, expected_runtime_s=2 * 3600)
    Placement.objects.create(job=running, node=node, gpu_indices=[0, 1, 2, 3])
    job_lifecycle.start(running)
    waiting = _job("queue-waiter", gpu_count=4, min_capability=8.0, expected_runtime_s=3600)
    try:
        place_queued()
        entry = QueueEntry.objects.get(job=waiting)
        login(page, "researcher")
        page.goto(f"/jobs/{waiting.pk}/")
        terms = page.get_by_test_id("priority-terms")
        expect(terms).to_have_text(TERMS)
        expect(terms).to_have_text(entry.terms_text())
        start = page.get_by_test_id("estimated-start")
        expect(start).to_contain_text("an estimate")
        expect(start).not_to_contain_text("no estimate yet")
        screenshot(page, "queue-priority-terms")
    finally:
        Placement.objects.filter(job=running, ended_at=None).update(ended_at=timezone.now())
        for job in (running, waiting):
            job.refresh_from_db()
            job_lifecycle.cancel(job)


def test_an_array_submitted_from_the_form_lists_its_tasks_on_its_page(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    login(page, "researcher")
    page.goto("/jobs/new/")
    page.get_by_label("Job name").fill("browser-seeds")
    page.get_by_label("GPUs", exact=True).fill("1")
    page.get_by_label("VRAM per GPU (GB)").fill("8")
    page.get_by_label("Command").fill("python train.py --seed $RECLAIMNET_ARRAY_INDEX")
    page.get_by_label("Array").fill("0-3%2")
    page.get_by_role("button", name="Submit job").click()
    expect(page).to_have_url(re.compile(r"/jobs/arrays/\d+/$"))
    arr = JobArray.objects.get(name="browser-seeds")
    expect(page.get_by_role("heading", level=1)).to_contain_text("browser-seeds")
    expect(page.get_by_text("at most 2 running at once")).to_be_visible()
    expect(page.get_by_test_id("task-state")).to_have_count(4)
    expect(page.get_by_role("link", name=re.compile(r"browser-seeds\[3\]"))).to_be_visible()
    screenshot(page, "queue-array")
    page.get_by_role("link", name="In the jobs list").click()
    expect(page.get_by_test_id("array-filter")).to_have_count(4)
    Job.objects.filter(array_task__array=arr).update(state="cancelled")  # leave the campus as it was
