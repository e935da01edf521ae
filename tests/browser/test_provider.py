"""A provider registers a node, the node gets a job, and the provider reclaims it with a notice, seeing each
hosted job's predicted outcome first."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.utils import timezone
from playwright.sync_api import Page, expect

from portal.control.models import AgentSession
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.lifecycle import nodes as node_lifecycle
from portal.core.models import Checkpoint, Job, Node, Placement, ReclaimEvent, ResearchGroup
from portal.core.models.nodes import hash_agent_token
from tests.browser.conftest import publish_live


def _simulate_agent_and_job(node: Node) -> Job:
    """What the control plane would do next: the agent says hello, a job is placed, it checkpoints. The other
    online nodes' agents are connected too (they are where the job can go)."""
    node_lifecycle.come_online(node)
    for i, pk in enumerate(Node.objects.filter(state="online").values_list("pk", flat=True)):
        AgentSession.objects.get_or_create(node_id=pk, closed_at=None, defaults={
            "channel_name": f"browser-{pk}", "data_host": "127.0.0.1", "data_port": 9100 + i})
    group = ResearchGroup.objects.get(name="NLP Group")
    job = Job.objects.create(
        name="browser-llm-ft", owner=group.members.first(), group=group, command="python train.py",
        gpu_count=1, expected_runtime_s=7200, ckpt_bytes_estimate=4_000_000_000, restart_s=30,
    )
    Placement.objects.create(job=job, node=node, gpu_indices=[0])
    job_lifecycle.start(job)
    done = timezone.now() - timedelta(minutes=7)
    Checkpoint.objects.create(job=job, node=node, sequence=1, size_bytes=4_000_000_000, sha256="0" * 64,
                              taken_at=done - timedelta(seconds=20), completed_at=done)
    return job


def test_register_then_reclaim_with_preview(
    page: Page, base_url: str, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    login(page, "provider")
    expect(page).to_have_url(re.compile(r"/provider/$"))
    page.get_by_role("link", name="Register a node").click()

    # A bad name first: the form refuses it and keeps what was typed.
    page.get_by_label("Node name").fill("bad name!")
    page.get_by_label("Building").select_option(label="Engineering")
    page.get_by_label("GPU model").select_option("RTX 4090")
    page.get_by_label("Number of GPUs").fill("2")
    page.get_by_role("button", name="Register node").click()
    expect(page.locator(".field.invalid")).to_contain_text("Use letters, digits")
    expect(page.get_by_label("Node name")).to_have_value("bad name!")
    expect(page.get_by_label("Number of GPUs")).to_have_value("2")

    page.get_by_label("Node name").fill("eng-browser-01")
    page.get_by_role("button", name="Register node").click()
    expect(page.get_by_role("heading", name="eng-browser-01 is registered")).to_be_visible()
    token = page.get_by_test_id("agent-token").inner_text().strip()
    command = page.get_by_test_id("agent-command").inner_text().strip()
    assert command == f"python -m nodeagent --portal {base_url} --token {token}"
    node = Node.objects.get(name="eng-browser-01")
    assert node.agent_token_hash == hash_agent_token(token) and node.gpus.count() == 2
    screenshot(page, "token-shown-once")

    job = _simulate_agent_and_job(node)
    page.get_by_role("link", name="Go to eng-browser-01").click()
    expect(page.get_by_test_id("node-state").first).to_have_text("online")
    expect(page.locator("#node-jobs")).to_contain_text("browser-llm-ft")
    assert token not in page.content()

    page.get_by_role("link", name="Reclaim…").click()
    # 30 s is too short for a 4 GB checkpoint: the preview says what the job would lose.
    page.get_by_label("30 s").check()
    row = page.locator(f'#reclaim-preview tr[data-job="{job.pk}"]')
    expect(row.get_by_test_id("outcome")).to_contain_text("loses")
    expect(page.get_by_test_id("shortest-notice")).to_contain_text("Shortest notice with no loss")
    screenshot(page, "preview-30s-loses-work")

    # The preview offers the shortest loss-free notice; with it the job leaves with no loss.
    page.get_by_role("button", name=re.compile(r"^Use ")).click()
    expect(row.get_by_test_id("outcome")).to_have_text("leaves with no loss")
    notice = float(page.get_by_label("Notice (seconds)").input_value())
    assert notice > 30
    screenshot(page, "preview-loss-free")
    page.get_by_role("button", name=re.compile(r"^Confirm reclaim with")).click()

    expect(page.locator(".messages")).to_contain_text("requested")
    reclaim = ReclaimEvent.objects.get(node=node)
    assert reclaim.kind == "scheduled" and reclaim.notice_s == notice
    assert reclaim.requested_by.username == "provider"
    expect(page.get_by_test_id("node-state").first).to_have_text("draining")
    expect(page.locator("#reclaims")).to_contain_text("scheduled (with notice)")
    screenshot(page, "reclaim-requested")


def test_emergency_reclaim_needs_confirmation(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    node = Node.objects.filter(provider__name="Vision Lab", state="online").order_by("name").last()
    login(page, "provider")
    page.goto(f"/provider/nodes/{node.pk}/reclaim/")
    page.get_by_role("button", name="Emergency reclaim now").click()
    expect(page.locator("#emergency-confirm-error")).to_contain_text("Tick the box to confirm")
    assert not ReclaimEvent.objects.filter(node=node, kind="emergency", requested_by__username="provider").exists()
    screenshot(page, "confirmation-required")
    page.locator("#emergency-confirm").check()
    page.get_by_role("button", name="Emergency reclaim now").click()
    expect(page.locator(".messages")).to_contain_text("Emergency")
    expect(page.get_by_test_id("node-state").first).to_have_text("reclaimed")
    screenshot(page, "emergency-done")


def test_node_state_change_appears_live(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    """The control plane marks a node offline (heartbeat lost): the provider's list updates without a reload."""
    node = (
        Node.objects.filter(provider__name="Vision Lab", state="online", placements__isnull=True)
        .order_by("name").first()
        or Node.objects.filter(provider__name="Vision Lab", state="online").order_by("name").first()
    )
    login(page, "provider")
    expect(page.locator("body")).to_have_attribute("data-live-state", "open")
    page.evaluate("window.__sameDocument = true")
    node_lifecycle.go_offline(node)
    publish_live([f"provider-{node.provider_id}", f"node-{node.pk}", "dashboard"], "node.state", node_id=node.pk,
                 state="offline")
    expect(page.locator(f"#node-{node.pk}").get_by_test_id("node-state")).to_have_text("offline")
    expect(page.locator("#live-log .toast")).to_have_count(0)  # internal refresh events raise no toast
    assert page.evaluate("window.__sameDocument === true")
    screenshot(page, "node-offline-live")
    node_lifecycle.come_online(node)  # leave the shared campus as it was
