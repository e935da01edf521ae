"""What a researcher sees is true: work done moves live while a job runs, a request no node could ever run is
refused on its field, a command and an image together are refused, and the request card says "any"."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.utils import timezone
from playwright.sync_api import Page, expect

from portal.control.link.handlers import HeartbeatSeen, record_heartbeats
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.models import Job, Node, Placement
from portal.core.services.jobs import campus_hardware, campus_limits
from tests.browser.conftest import publish_live


def _form(page: Page, name: str, **values: str) -> None:
    page.goto("/jobs/new/")
    page.get_by_label("Job name").fill(name)
    fields = {"gpus": "GPUs", "vram": "VRAM per GPU (GB)", "capability": "Minimum compute capability",
              "command": "Command", "image": "or container image"}
    for key, value in values.items():
        page.get_by_label(fields[key], exact=True).fill(value)
    page.get_by_role("button", name="Submit job").click()


def _heartbeat(node: Node, job: Job, step: int, at: Any) -> None:
    """What the agent link records for one heartbeat of ``node`` reporting ``job`` at ``step``."""
    msg: Any = {"type": "heartbeat", "seq": step, "gpu_util": [0.9], "egress": {}, "jobs": [{"job_id": job.pk,
                                                                                         "step": step}]}
    assert record_heartbeats([HeartbeatSeen(node.pk, None, None, at, msg)]) == []


def test_work_done_moves_live_while_the_job_runs(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    login(page, "researcher")
    _form(page, "browser-progress", command="python train.py")
    expect(page.locator(".messages")).to_contain_text("submitted")
    job = Job.objects.get(name="browser-progress")
    expect(page.get_by_test_id("work-done")).to_have_text("0 s")
    # the page follows the job's events only once its socket is open: an event published before is never seen
    expect(page.locator("body")).to_have_attribute("data-live-state", "open")

    # Play the control plane: the job starts on a node two minutes ago; its agent's heartbeats report steps.
    node = Node.objects.filter(state="online").order_by("name").first()
    started = timezone.now() - timedelta(seconds=120)
    Placement.objects.create(job=job, node=node, gpu_indices=[0])
    Placement.objects.filter(job=job, ended_at__isnull=True).update(started_at=started)
    job_lifecycle.start(job)
    publish_live([f"job-{job.pk}", f"group-{job.group_id}"], "job.state", job_id=job.pk, state="running")
    expect(page.get_by_test_id("job-state").first).to_have_text("running")
    page.evaluate("window.__sameDocument = true")

    _heartbeat(node, job, 1000, started + timedelta(seconds=120))  # 1,000 steps in 2 min
    expect(page.get_by_test_id("work-done")).to_have_text("2 min", timeout=15_000)
    expect(page.locator("#job-status")).to_contain_text("step 1000")
    _heartbeat(node, job, 1500, started + timedelta(seconds=180))  # a minute later, 500 more
    expect(page.get_by_test_id("work-done")).to_have_text("3 min", timeout=15_000)
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded instead of updating live"
    screenshot(page, "work-done-live")


def test_impossible_request_is_refused_on_its_field(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    gpus, vram_gb, _ = campus_limits(campus_hardware())
    login(page, "researcher")
    _form(page, "browser-impossible", gpus="16", vram="500", command="python train.py")
    gpu_field = page.locator(".field.invalid").filter(has=page.get_by_label("GPUs", exact=True))
    expect(gpu_field).to_contain_text(f"No node on this campus has 16 GPUs; the largest has {gpus}.")
    vram_field = page.locator(".field.invalid").filter(has=page.get_by_label("VRAM per GPU (GB)"))
    expect(vram_field).to_contain_text(f"No GPU on this campus has 500 GB of memory; the largest has {vram_gb:g} GB.")
    expect(page.locator(".field.invalid")).to_have_count(2)
    expect(page.get_by_label("GPUs", exact=True)).to_have_value("16")  # what was typed stays
    assert not Job.objects.filter(name="browser-impossible").exists()
    screenshot(page, "impossible-request")


def test_command_and_image_together_are_refused(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    login(page, "researcher")
    _form(page, "browser-both", command="python train.py", image="registry.campus/nlp/train:1.4")
    image_field = page.locator(".field.invalid").filter(has=page.get_by_label("or container image"))
    expect(image_field).to_contain_text("Give a command or a container image, not both")
    expect(page.locator(".field.invalid")).to_have_count(1)
    assert not Job.objects.filter(name="browser-both").exists()
    screenshot(page, "command-and-image")


def test_request_card_says_any_when_no_minimum_was_asked(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    login(page, "researcher")
    _form(page, "browser-any", vram="0", capability="0", command="python train.py")
    expect(page).to_have_url(re.compile(r"/jobs/\d+/$"))
    expect(page.get_by_test_id("gpu-request")).to_have_text("1 × any GPU")
    screenshot(page, "request-any")


def test_the_cancel_button_goes_away_live_when_the_job_fails(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    login(page, "researcher")
    _form(page, "browser-fails", command="python train.py")
    job = Job.objects.get(name="browser-fails")
    node = Node.objects.filter(state="online").order_by("name").first()
    Placement.objects.create(job=job, node=node, gpu_indices=[0])
    job_lifecycle.start(job)
    page.goto(f"/jobs/{job.pk}/")
    expect(page.get_by_test_id("job-cancel")).to_be_visible()
    expect(page.locator("body")).to_have_attribute("data-live-state", "open")  # following the job's events
    page.evaluate("window.__sameDocument = true")

    # Play the control plane: the job exits with an error; its page hears of it.
    job_lifecycle.fail(job, "exit code 2: exited")
    publish_live([f"job-{job.pk}", f"group-{job.group_id}"], "job.state", job_id=job.pk, state="failed")
    expect(page.get_by_test_id("job-state").first).to_have_text("failed")
    expect(page.get_by_test_id("job-cancel")).to_have_count(0)
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded instead of updating live"
    screenshot(page, "failed-no-cancel")
