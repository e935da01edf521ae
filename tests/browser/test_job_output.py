"""A researcher watches a job's output arrive on its page while it runs, escaped and scrolled to the end, and
sees its last lines in the status when it fails (design §9.11). The test plays the agent: its reports go
through the portal's own handlers, whose live events reach the browser."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.contrib.auth import get_user_model
from playwright.sync_api import Page, expect

from portal.core.models import Job, JobOutput, Node, Placement, ResearchGroup

_sent = [0]


def _agent_says(node: Node, msg: dict[str, Any]) -> None:
    """One agent report, handled as the consumer handles it (in a worker thread: Playwright's sync API keeps an
    event loop in this one)."""
    from django.db import connection

    from portal.control.link import handlers

    _sent[0] += 1
    msg = {**msg, "msg_id": f"browser-output-{msg['job_id']}-{_sent[0]}"}

    def handle() -> None:
        try:
            handlers.handle(node.pk, msg["type"], msg)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(handle).result(timeout=20)


def _output(node: Node, job: Job, text: str) -> None:
    """A report of new output, some seconds after the previous one (outside the live events' one-second
    throttle, as the agent's two-second batches are)."""
    JobOutput.objects.filter(pk=job.pk).update(published_at=None)
    _agent_says(node, {"type": "job_output", "job_id": job.pk, "text": text})


def test_the_log_tail_appears_live_while_the_job_runs(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    group = ResearchGroup.objects.get(name="NLP Group")
    owner = get_user_model().objects.get(username="researcher")
    node = Node.objects.filter(state="online", killswitch_engaged=False).order_by("name").first()
    job = Job.objects.create(name="browser-logs", owner=owner, group=group, command="python train.py",
                             gpu_count=1, expected_runtime_s=3600, ckpt_bytes_estimate=1_000_000_000)
    Placement.objects.create(job=job, node=node, gpu_indices=[0])

    login(page, "researcher")
    page.goto(f"/jobs/{job.pk}/")
    panel = page.locator("#job-output")
    expect(panel).to_contain_text("The job has not started yet")
    expect(page.locator("body")).to_have_attribute("data-live-state", "open")
    page.evaluate("window.__sameDocument = true")

    _agent_says(node, {"type": "job_started", "job_id": job.pk, "restored_sequence": None, "restored_step": None})
    expect(page.get_by_test_id("job-state").first).to_have_text("running")
    log = page.get_by_test_id("job-output")
    expect(log).to_contain_text(f"— run 1 on node {node.name} —")

    _output(node, job, "epoch 1 loss 0.912\n<b>not bold</b> & <script>alert(1)</script>\n")
    expect(log).to_contain_text("epoch 1 loss 0.912")
    expect(log).to_contain_text("<b>not bold</b> & <script>alert(1)</script>")  # shown as text, not markup
    expect(panel.locator("b")).to_have_count(0)

    _output(node, job, "".join(f"step {i:04d} loss {1 / (i + 1):.4f}\n" for i in range(300)))
    expect(log).to_contain_text("step 0299 loss 0.0033")
    at_end = page.evaluate("""() => {
        const box = document.querySelector('#job-output .output-scroll');
        const pre = box.querySelector('pre');
        return box.scrollHeight > box.clientHeight
            && Math.abs(pre.getBoundingClientRect().bottom - box.getBoundingClientRect().bottom) < 2;
    }""")
    assert at_end, "the output panel is not scrolled to its newest line"
    expect(panel.get_by_test_id("output-capped")).to_have_count(0)
    assert page.evaluate("window.__sameDocument === true"), "the page reloaded instead of updating live"
    screenshot(page, "output-live")

    _agent_says(node, {"type": "job_exited", "job_id": job.pk, "returncode": 2, "step": 300, "result": {},
                       "reason": "exited",
                       "output_tail": "step 0299 loss 0.0033\nValueError: learning rate must be positive\n"})
    expect(page.get_by_test_id("job-state").first).to_have_text("failed")
    expect(page.locator("#job-status")).to_contain_text("Last output: step 0299 loss 0.0033 | "
                                                        "ValueError: learning rate must be positive")
    expect(log).to_contain_text("step 0299 loss 0.0033")  # kept after the job ended
    screenshot(page, "output-failed")
