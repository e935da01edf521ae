"""The published ladder (design §15): every signed-in user reaches it from the top bar and reads each class's
loan, idle rule, notice and grace and the reclaim sequence; the job form shows each class's limits beside the
priority field and refuses more GPUs than the chosen class may borrow."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import Page, expect


@pytest.mark.parametrize("role", ["researcher", "provider"])
def test_the_ladder_is_one_click_from_the_top_bar_and_says_each_class_terms(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any], role: str
) -> None:
    login(page, role)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Ladder").click()
    expect(page).to_have_url(re.compile(r"/ladder/$"))
    expect(page.get_by_role("heading", name="The ladder")).to_be_visible()
    interactive = page.get_by_test_id("ladder-interactive")
    expect(interactive).to_contain_text("up to 2 GPUs per job")
    expect(page.get_by_test_id("loan-interactive")).to_have_text("8 h")
    expect(page.get_by_test_id("idle-interactive")).to_contain_text("released after 30 min with no GPU use")
    expect(interactive).to_contain_text("10 min warning before the release")
    expect(page.get_by_test_id("idle-best_effort")).to_have_text("never touched by the idle watchdog")
    expect(page.get_by_test_id("watchdog-never")).to_have_text("best effort")
    sequence = page.get_by_test_id("reclaim-sequence")
    for step in ("Warn.", "Drain.", "Force."):
        expect(sequence).to_contain_text(step)
    screenshot(page, f"ladder-{role}")


def test_the_job_form_shows_each_class_limits_and_refuses_too_many_gpus_for_the_class(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    login(page, "researcher")
    page.goto("/jobs/new/")
    limits = page.get_by_test_id("class-limits")
    expect(limits.get_by_test_id("class-limits-interactive")).to_contain_text("8 h")
    expect(limits.get_by_test_id("class-limits-interactive")).to_contain_text("30 min")
    expect(limits.get_by_test_id("class-limits-best_effort")).to_contain_text("never")
    expect(page.locator("#id_priority_class_helptext")).to_contain_text("Interactive: loans up to 8 h")
    screenshot(page, "submit-class-limits")

    page.fill("#id_name", "too-big-notebook")
    page.fill("#id_gpu_count", "4")
    page.select_option("#id_priority_class", "interactive")
    page.fill("#id_command", "jupyter lab")
    page.get_by_role("button", name="Submit job").click()
    expect(page.locator(".field.invalid")).to_contain_text("An interactive job may borrow at most 2 GPUs")
