"""The what-if report in the portal (docs/design.md §7 "The what-if report"): an admin opens What-if from the top
bar, uploads a small campus trace, chooses two policies and two seeds, watches the progress bar move and reads the
finished report (tables, the Pareto plot, per-class loss, downloads). The evaluation worker is played in this
process with the task's own body (``portal.whatif.services.run_evaluation``): the browser stack runs no Celery
worker."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connections
from playwright.sync_api import Page, expect

from portal.whatif import services
from portal.whatif.models import Evaluation
from scheduler.sim.trace import save
from scheduler.sim.tracegen import GenConfig, generate

SMALL = GenConfig(days=6.0, n_jobs=10, total_gpu_h=120.0, departures=24, node_scale=0.2, drift_start_day=3.0,
                  drift_days=1.0)


def _play_worker(evaluation_id: int, go: threading.Event, result: list[str]) -> None:
    """What the evaluation worker does with the queued task, once the page shows the bar at its start."""
    try:
        if go.wait(20):
            result.append(services.run_evaluation(evaluation_id))
    finally:
        connections.close_all()


def test_an_admin_runs_a_what_if_and_reads_the_report(
        page: Page, base_url: str, login: Callable[[Page, str], None], screenshot: Callable[[Any, str], Any],
        tmp_path: Path) -> None:
    trace_file = tmp_path / "campus.json"
    save(generate(SMALL), trace_file)
    progress_seen: list[tuple[str, float]] = []

    def on_response(response: Any) -> None:
        if response.url.endswith("/progress.json") and response.ok:
            data = response.json()
            progress_seen.append((data["state"], data["progress"]))

    page.on("response", on_response)
    login(page, "admin")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="What-if").click()
    expect(page).to_have_url(re.compile(r"/whatif/$"))
    form = page.get_by_test_id("whatif-start")
    form.get_by_label("An uploaded trace").check()
    form.get_by_label("Trace file").set_input_files(str(trace_file))
    for name in ("slurm-pr", "static", "reclaimnet"):  # the defaults: keep two of them
        box = form.get_by_label(name, exact=True)
        box.set_checked(name != "slurm-pr")
    form.get_by_label("Seeds").fill("0,1")
    with page.expect_navigation():
        form.get_by_role("button", name="Start").click()
    expect(page).to_have_url(re.compile(r"/whatif/\d+/$"))
    ev = Evaluation.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
    assert sorted(ev.policies) == ["reclaimnet", "static"] and ev.seeds == [0, 1] and ev.state == "queued"
    bar = page.locator("#whatif-progress")
    expect(bar).to_have_attribute("value", "0.0")
    screenshot(page, "queued")

    go, result = threading.Event(), []
    worker = threading.Thread(target=_play_worker, args=(ev.pk, go, result), daemon=True)
    worker.start()
    go.set()
    expect(page.get_by_test_id("whatif-report")).to_be_visible(timeout=25_000)
    worker.join(10)
    assert result == ["done"]
    values = [p for _, p in progress_seen]
    # the bar moved: a value went up while running, or the run ended between two polls, or the page showed the
    # run part-way (0 < progress < 1) and then its report (a fast run: done came with the reload)
    assert any(b > a for a, b in itertools.pairwise(values)) or ("done", 1.0) in progress_seen \
        or any(state == "running" and 0 < value < 1 for state, value in progress_seen), progress_seen
    table = page.get_by_test_id("whatif-table")
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table.locator("tr[data-policy='reclaimnet']")).to_be_visible()
    expect(page.get_by_test_id("whatif-pareto").locator("svg circle")).to_have_count(2)
    expect(page.get_by_test_id("whatif-classes")).to_contain_text("checkpoint")
    screenshot(page, "report")
    with page.expect_download() as download:
        page.get_by_role("link", name="CSV", exact=True).click()
    assert download.value.suggested_filename == f"whatif-{ev.pk}-table.csv"
    page.get_by_role("link", name="All evaluations").click()
    row = page.get_by_test_id("whatif-list").locator(f"tr[data-evaluation='{ev.pk}']")
    expect(row).to_contain_text("done")
