"""The admin dashboard in a browser tells the truth: a time-range picker that changes the charts and a
bookmarkable URL (and refuses a bad range with a message), definitions on hover, "in flight now" apart from
history, and every chart's axes titled with units (docs/design.md §9.1)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from portal.core.services.summary import DEFINITIONS

DRAWN = "[...document.querySelectorAll('canvas[data-chart]')].every(c => Number(c.dataset.points) > 0)"
LABELS = "key => Chart.getChart(document.querySelector(`canvas[data-key='${key}']`)).data.labels"


def _open(page: Page, login: Callable[[Page, str], None], base_url: str, query: str = "") -> None:
    login(page, "admin")
    page.goto(base_url + "/dashboard/" + query)
    page.wait_for_function(DRAWN)


def test_the_range_picker_changes_the_charts_and_the_url(
    page: Page, login: Callable[[Page, str], None], base_url: str, screenshot: Callable[[Any, str], Any],
) -> None:
    _open(page, login, base_url)
    week = page.evaluate(LABELS, "utilisation")
    expect(page.get_by_test_id("range-shown")).to_contain_text("the last 7 days")

    with page.expect_navigation():
        page.get_by_role("radio", name="24 hours").check()
    expect(page).to_have_url(re.compile(r"/dashboard/\?range=24h$"))
    page.wait_for_function(DRAWN)
    day = page.evaluate(LABELS, "utilisation")
    assert day != week and len(day) in (24, 25) and all(re.fullmatch(r"\w{3} \d\d:00", label) for label in day)
    expect(page.get_by_test_id("stats-range")).to_be_visible()
    expect(page.get_by_role("heading", name="The last 24 hours")).to_be_visible()
    expect(page.locator("a[href='/dashboard/export/groups.csv?range=24h']")).to_have_count(1)

    # A custom range of days, typed: the URL carries it, so a bookmark shows the same range. Two whole past
    # days, so the range differs from "the last 24 hours" at any time of day (just after midnight, yesterday
    # to today would start at the same hour as the last 24 hours and end at the same hour too).
    today = timezone.localdate()
    first, last = today - dt.timedelta(days=2), today - dt.timedelta(days=1)
    page.get_by_label("From (day)").fill(first.isoformat())
    page.get_by_label("To (day, included)").fill(last.isoformat())
    expect(page.get_by_role("radio", name="Custom")).to_be_checked()
    with page.expect_navigation():
        page.get_by_role("button", name="Show").click()
    expect(page).to_have_url(re.compile(rf"range=custom&from={first}&to={last}$"))
    page.wait_for_function(DRAWN)
    custom = page.evaluate(LABELS, "utilisation")
    assert custom[0] == first.strftime("%a") + " 00:00" and custom[-1] == last.strftime("%a") + " 23:00"
    assert custom[0] != day[0]
    bookmark = page.url
    page.goto(base_url + "/dashboard/")
    page.goto(bookmark)
    expect(page.get_by_role("radio", name="Custom")).to_be_checked()
    expect(page.get_by_label("From (day)")).to_have_value(first.isoformat())
    screenshot(page, "custom-range")

    # A start after the end: a message naming the field, no chart, no server error.
    page.get_by_label("From (day)").fill(last.isoformat())
    page.get_by_label("To (day, included)").fill(first.isoformat())
    with page.expect_navigation() as navigation:
        page.get_by_role("button", name="Show").click()
    assert navigation.value.status == 400
    expect(page.get_by_test_id("range-errors")).to_contain_text("after it ends")
    expect(page.locator("#range-from-error")).to_contain_text("pick a start on or before the end")
    expect(page.get_by_label("From (day)")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("canvas[data-chart]")).to_have_count(0)
    screenshot(page, "range-refused")


def test_every_headline_number_shows_its_definition_on_hover_and_focus(
    page: Page, login: Callable[[Page, str], None], base_url: str, screenshot: Callable[[Any, str], Any],
) -> None:
    _open(page, login, base_url, "?range=24h")
    lent = page.get_by_test_id("stat-gpus_lent")
    tip = page.locator("#def-gpus_lent")
    expect(tip).to_be_hidden()
    lent.hover()
    expect(tip).to_be_visible()
    expect(tip).to_contain_text(DEFINITIONS["gpus_lent"])
    expect(tip).to_contain_text("reclaimnet_gpus_lendable")
    screenshot(page, "gpus-lent-definition")
    page.mouse.move(0, 0)
    page.get_by_test_id("stat-work_lost").focus()  # the keyboard reaches it too
    expect(page.locator("#def-work_lost")).to_be_visible()
    for stat in page.locator("[data-testid^='stat-']").all():
        described = stat.get_attribute("aria-describedby")
        assert described and page.locator(f"#{described}").get_attribute("role") == "tooltip"
        assert len(page.locator(f"#{described}").text_content() or "") > 20
    # Each chart's definition is under it and on hover of its title.
    expect(page.locator("#utilisation-def")).to_contain_text("GPU-hours lent")
    expect(page.locator("#utilisation-title")).to_have_attribute("title", re.compile("GPU-hours lent"))


@pytest.fixture
def finished_migration() -> Iterator[dict[str, Any]]:
    """A migration whose copy arrived a minute ago and its P3 decision, over a link named for the test;
    removed afterwards (the browser session's database is shared by every browser test)."""
    from portal.control.models import Transfer, TransferPurpose, TransferState, hash_transfer_token
    from portal.core.models import Checkpoint, DecisionLog, Migration, Node

    checkpoint = Checkpoint.objects.filter(completed_at__isnull=False, node__isnull=False).select_related(
        "job", "node").first()
    assert checkpoint is not None and checkpoint.node is not None
    source = checkpoint.node
    destination = Node.objects.exclude(pk=source.pk).exclude(building=source.building).order_by("pk").first()
    assert destination is not None
    now = timezone.now()
    migration = Migration.objects.create(job=checkpoint.job, source=source, destination=destination, mode="planned",
                                         bytes=checkpoint.size_bytes, success=True, finished_at=now)
    transfer = Transfer.objects.create(
        job=checkpoint.job, checkpoint=checkpoint, migration=migration, source=source, destination=destination,
        purpose=TransferPurpose.MIGRATION, token_hash=hash_transfer_token("browser"), rate_bytes_per_s=40e6,
        state=TransferState.RECEIVED, finished_at=now - dt.timedelta(minutes=1),
        expires_at=now + dt.timedelta(minutes=10))
    access = source.access_link
    decision = DecisionLog.objects.create(
        kind=DecisionLog.Kind.P3,
        request={"links": [{"id": access.pk, "bytes_per_s": 1.25e8}], "reserve_fraction": 0.3,
                 "flows": [{"id": f"job-{checkpoint.job_id}", "bytes": 3e9, "notice_s": 120, "restart_s": 30,
                            "links": [0]}]},
        response={"admitted": [{"id": f"job-{checkpoint.job_id}", "min_rate": 3.3e7, "rate": 4e7}], "degraded": []},
    )
    try:
        yield {"transfer": transfer, "link": access.name}
    finally:
        Transfer.objects.filter(migration=migration).delete()
        decision.delete()
        migration.delete()


def test_in_flight_now_is_empty_while_history_lists_the_finished_migration(
    page: Page, login: Callable[[Page, str], None], base_url: str, finished_migration: dict[str, Any],
    screenshot: Callable[[Any, str], Any],
) -> None:
    from portal.control.models import Transfer, TransferState

    _open(page, login, base_url, "?range=24h")
    now_card = page.get_by_test_id("traffic-now")
    expect(now_card.get_by_test_id("traffic-now-empty")).to_be_visible()
    expect(now_card).not_to_contain_text(finished_migration["link"])
    history = page.locator("#traffic-title").locator("xpath=ancestor::section[1]")
    expect(history.get_by_role("heading")).to_have_text("P3 admissions per bottleneck (history)")
    history.locator("summary").click()
    expect(history.locator("table")).to_contain_text(finished_migration["link"])
    assert finished_migration["link"] in page.evaluate(LABELS, "traffic")
    screenshot(page, "history-not-in-flight")

    # The same copy on the wire now is listed in flight, on every link of its path.
    transfer = finished_migration["transfer"]
    Transfer.objects.filter(pk=transfer.pk).update(state=TransferState.ISSUED, finished_at=None)
    page.reload()
    expect(now_card.locator("table")).to_contain_text(finished_migration["link"])
    expect(now_card.get_by_test_id("traffic-now-empty")).to_have_count(0)


def test_every_chart_titles_its_axes_and_skips_labels_instead_of_overlapping(
    page: Page, login: Callable[[Page, str], None], base_url: str,
) -> None:
    _open(page, login, base_url, "?range=30d")
    scales = page.evaluate("""() => [...document.querySelectorAll('canvas[data-chart]')].map(c => {
        const chart = Chart.getChart(c);
        const out = {key: c.dataset.key, index: chart.options.indexAxis};
        for (const [id, s] of Object.entries(chart.options.scales)) {
            out[id] = {title: s.title.display ? s.title.text : null, autoSkip: s.ticks.autoSkip,
                       rotation: s.ticks.maxRotation, position: s.position};
        }
        return out;
    })""")
    assert len(scales) == 10
    for chart in scales:
        category = "y" if chart["index"] == "y" else "x"
        value = "x" if category == "y" else "y"
        assert chart[category]["title"] and chart[value]["title"], chart
        assert chart[category]["autoSkip"] is True and chart[category]["rotation"] <= 45, chart
    groups = next(c for c in scales if c["key"] == "groups")
    assert groups["index"] == "y"
    assert groups["x"]["title"].startswith("GPU-hours used") and groups["x1"]["title"].startswith("GPU-hours lost")
    assert groups["x1"]["position"] == "top"
    migrations = next(c for c in scales if c["key"] == "migrations")
    assert migrations["y"]["title"] == "Work lost (GPU-hours)" and migrations["y1"]["title"] == "Migration success (%)"
    utilisation = next(c for c in scales if c["key"] == "utilisation")
    assert utilisation["y"]["title"] == "GPU utilisation (%)" and utilisation["x"]["title"].startswith("Day")
