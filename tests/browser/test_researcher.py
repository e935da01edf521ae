"""A researcher submits a job (field errors first), then sees its migration appear live, without reloading."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.utils import timezone
from playwright.sync_api import Page, expect

from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.models import Job, Migration, Node, Placement, ReclaimEvent
from tests.browser.conftest import publish_live


def test_submit_job_then_migration_appears_live(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    login(page, "researcher")
    expect(page).to_have_url(re.compile(r"/jobs/$"))
    page.get_by_role("link", name="Submit a job").first.click()

    page.get_by_label("Job name").fill("browser-vit")
    page.get_by_label("GPUs", exact=True).fill("0")
    page.get_by_label("VRAM per GPU (GB)").fill("-4")
    page.get_by_label("Checkpoint size (GB)").fill("0")
    page.get_by_label("Command").fill("")
    page.get_by_role("button", name="Submit job").click()
    errors = page.locator(".field.invalid")
    expect(errors).to_have_count(4)
    expect(page.locator(".form-errors")).to_contain_text("Please correct the 4 fields")
    expect(page.get_by_text("Give a command or a container image.")).to_be_visible()
    expect(page.get_by_label("Job name")).to_have_value("browser-vit")
    expect(page.get_by_label("Checkpoint size (GB)")).to_have_value("0")
    expect(page.get_by_text("Ensure this value is greater than or equal to 0.001.")).to_be_visible()
    screenshot(page, "field-errors")

    page.get_by_label("GPUs", exact=True).fill("1")
    page.get_by_label("VRAM per GPU (GB)").fill("20")
    page.get_by_label("Checkpoint size (GB)").fill("3.2")
    page.get_by_label("Command").fill("python train.py --model vit-b")
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator(".messages")).to_contain_text("submitted")
    job = Job.objects.get(name="browser-vit")
    assert job.group.name == "NLP Group" and job.owner.username == "researcher"
    expect(page).to_have_url(re.compile(rf"/jobs/{job.pk}/$"))
    expect(page.locator("body")).to_have_attribute("data-live-state", "open")

    # Mark this document: if the page reloaded, the mark would be gone.
    page.evaluate("window.__sameDocument = true")
    # Play the control plane: place the job, then a reclaim moves it (rows first, then the live event).
    source, destination = Node.objects.filter(state="online").order_by("name")[:2]
    Placement.objects.create(job=job, node=source, gpu_indices=[0])
    job_lifecycle.start(job)
    publish_live([f"job-{job.pk}", f"group-{job.group_id}"], "job.state", job_id=job.pk, state="running")
    expect(page.get_by_test_id("job-state").first).to_have_text("running")

    now = timezone.now()
    reclaim = ReclaimEvent.objects.create(node=source, kind="scheduled", notice_s=120,
                                          deadline_at=now + timedelta(seconds=120), outcome="completed")
    Migration.objects.create(job=job, reclaim=reclaim, source=source, destination=destination, mode="planned",
                             bytes=3_200_000_000, assigned_rate_bytes_per_s=60e6, downtime_s=48.0,
                             work_lost_s=0.0, success=True, finished_at=now + timedelta(seconds=48))
    Placement.objects.filter(job=job, ended_at__isnull=True).update(ended_at=now, end_reason="reclaimed")
    Placement.objects.create(job=job, node=destination, gpu_indices=[0])
    publish_live([f"job-{job.pk}", f"group-{job.group_id}"], "migration", job_id=job.pk, mode="planned",
            status="finished")

    migration = page.get_by_test_id("migration")
    expect(migration).to_contain_text("planned")
    expect(migration).to_contain_text("downtime 48 s")
    expect(page.locator("#timeline")).to_contain_text(f"Migration {source.name} → {destination.name}")
    expect(page.locator("#live-log .toast")).to_have_count(0)  # internal refresh events raise no toast
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded instead of updating live"
    screenshot(page, "migration-live")


def test_job_page_explains_the_interval(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    job = Job.objects.filter(group__name="NLP Group", decisions__kind="p1", migrations__isnull=False).distinct().first()
    login(page, "researcher")
    page.goto(f"/jobs/{job.pk}/")
    expect(page.get_by_test_id("interval")).to_be_visible()
    expect(page.get_by_text("Reclaim hazard λ⁺")).to_be_visible()
    expect(page.locator("#timeline li.migration").first).to_be_visible()
    expect(page.locator("#timeline li.checkpoints").first).to_be_visible()
    screenshot(page, "job-page")
