"""An admin opens the dashboard and every chart has data; each table exports as CSV."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, expect

EXPECTED_CHARTS = 10


def test_every_chart_has_data(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    login(page, "admin")
    expect(page).to_have_url(re.compile(r"/dashboard/$"))
    canvases = page.locator("canvas[data-chart]")
    expect(canvases).to_have_count(EXPECTED_CHARTS)
    page.wait_for_function(
        "[...document.querySelectorAll('canvas[data-chart]')].every(c => Number(c.dataset.points) > 0)"
    )
    # Read what Chart.js actually drew: at least one point per chart, and not all of them zero (an empty
    # campus draws a flat line of zeros, which is not "data").
    drawn = page.eval_on_selector_all(
        "canvas[data-chart]",
        """cs => cs.map(c => {
            const chart = Chart.getChart(c);
            const values = chart ? chart.data.datasets.flatMap(d => d.data).filter(v => v !== null) : [];
            return [c.dataset.key, values.length, values.filter(v => Number(v) !== 0).length];
        })""",
    )
    assert len(drawn) == EXPECTED_CHARTS
    assert all(n > 0 and nonzero > 0 for _, n, nonzero in drawn), drawn
    expect(page.get_by_test_id("adaptivity-gap")).to_have_text(re.compile(r"^\d+(\.\d+)?%$"))
    screenshot(page, "dashboard")

    # Every table's CSV link answers with that table (the download below opens one of them in full).
    hrefs = sorted(set(page.eval_on_selector_all("a[href$='.csv']", "as => as.map(a => a.getAttribute('href'))")))
    assert len(hrefs) == 8, hrefs
    for href in hrefs:
        response = page.request.get(href)
        assert response.status == 200 and response.headers["content-type"].startswith("text/csv"), href
        assert len(response.text().splitlines()) > 1, href

    with page.expect_download() as download:
        page.locator("#groups-title").locator("xpath=..").get_by_role("link", name="CSV").click()
    path = download.value.path()
    header = Path(path).read_text(encoding="utf-8").splitlines()[0]
    assert header == "group,jobs,running,gpu_hours_used,work_lost_gpu_h,migrations,charged_gpu_h,charged_lost_gpu_h"


def test_dashboard_at_phone_width(
    page: Page, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any]
) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    login(page, "admin")
    page.wait_for_function(
        "[...document.querySelectorAll('canvas[data-chart]')].every(c => Number(c.dataset.points) > 0)"
    )
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    screenshot(page, "dashboard-phone")
