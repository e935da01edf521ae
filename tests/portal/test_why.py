"""Why in plain words (design §2, §3): a queued job's ``waiting_reason`` in the API and on its page, computed on
read from the campus read model; the timeline's placements, migrations and intervals explained from the decision
log by node name."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from portal.control.loop.ticks import p1_tick, place_job
from portal.control.reclaim.apply import run_reclaim
from portal.core.models import DecisionLog, Job, LendingWindow, Migration, Node
from portal.core.services import explain
from portal.core.services.reclaims import request_reclaim
from tests.portal import factories as f
from tests.portal.conftest import World

pytestmark = pytest.mark.django_db


def _page(world: World, role: str = "researcher") -> Client:
    client = Client()
    client.force_login(world.users[role])
    return client


def _a100(world: World, name: str, state: str, *, live: bool = False) -> Node:
    node, _ = f.make_node(world.lab, world.building, name=name, gpus=4, model="A100", state=state)
    if live:
        f.connect_agent(node, 9100 + node.pk)
    return node


def _night_window_in_3_hours(node: Node) -> dt.datetime:
    """A one-hour lending window that opens 3 h (and under a minute) from now, local time."""
    opens = timezone.localtime(timezone.now() + dt.timedelta(hours=3, minutes=1)).replace(second=0, microsecond=0)
    closes = opens + dt.timedelta(hours=1)
    LendingWindow.objects.create(node=node, weekday=opens.weekday(), start_time=opens.time(), end_time=closes.time())
    return opens


# --- why it waits: the API --------------------------------------------------------------------------------------------


def test_job_detail_says_why_a_queued_job_waits_with_counts_and_the_next_window(
        world: World, client_for: Callable[[str | None], APIClient]) -> None:
    # vision-01 (2 GPUs) and robotics-01 (1 GPU) are lent; two A100 ×4 nodes would fit: one taken back by its
    # owner (lent at night only), one being reclaimed.
    night = _a100(world, "a100-night", "reclaimed")
    opens = _night_window_in_3_hours(night)
    _a100(world, "a100-draining", "draining", live=True)
    job = f.make_job(world.group, world.users["researcher"], name="llama-4gpu", gpu_count=4)
    body = client_for("researcher").get(f"/api/jobs/{job.pk}/").json()
    why = body["waiting_reason"]
    assert why["text"].startswith("No lent node has 4 GPUs free right now. Of the 2 A100 nodes that would fit, ")
    assert "1 is lent only" in why["text"] and "(the next window opens in 3 h" in why["text"]
    assert "1 is being reclaimed by its owner" in why["text"]
    assert why["reasons"] == [{"reason": "too_small", "nodes": 2}, {"reason": "reclaiming", "nodes": 1},
                              {"reason": "not_lent", "nodes": 1}]
    assert dt.datetime.fromisoformat(why["next_window_at"]) == opens
    assert "#" not in why["text"] and "not_lent" not in why["text"]  # words, no internal ids or codes


def test_a_request_the_campus_can_never_satisfy_says_what_it_offers(
        world: World, client_for: Callable[[str | None], APIClient]) -> None:
    job = f.make_job(world.group, world.users["researcher"], gpu_count=1, vram_gb_per_gpu=500)
    why = client_for("researcher").get(f"/api/jobs/{job.pk}/").json()["waiting_reason"]
    assert why["text"].startswith("No node on the campus can run it as requested: 2 have less than 500 GB per GPU.")
    assert why["reasons"] == [{"reason": "vram", "nodes": 2}] and why["next_window_at"] is None


def test_a_job_with_room_now_is_told_it_starts_at_the_next_round(
        world: World, client_for: Callable[[str | None], APIClient]) -> None:
    why = client_for("researcher").get(f"/api/jobs/{world.job.pk}/").json()["waiting_reason"]
    assert why["text"] == "2 lent nodes have 1 GPU free for it now: it starts at the scheduler's next round."


def test_only_queued_jobs_have_a_waiting_reason_and_the_list_stays_without_one(
        world: World, client_for: Callable[[str | None], APIClient]) -> None:
    f.place_job(world.job, world.node)
    client = client_for("researcher")
    assert client.get(f"/api/jobs/{world.job.pk}/").json()["waiting_reason"] is None
    assert all("waiting_reason" not in row for row in client.get("/api/jobs/").json()["results"])
    assert client_for("other_researcher").get(f"/api/jobs/{world.job.pk}/").status_code == 404


def test_a_job_starting_or_receiving_its_checkpoint_says_where(world: World) -> None:
    job = f.make_job(world.group, world.users["researcher"])
    place_job(job.pk)  # the control plane's own placement: a start sent, not yet confirmed (still queued)
    job.refresh_from_db()
    assert job.state == "queued"
    text = explain.waiting_reason(job)["text"]  # type: ignore[index]
    assert re.fullmatch(r"It is starting on (vision-01|robotics-01): the scheduler is waiting for the node to "
                        r"confirm the start\.", text)


def test_a_queued_jobs_detail_costs_the_same_statements_on_a_larger_campus(
        world: World, client_for: Callable[[str | None], APIClient]) -> None:
    job = f.make_job(world.group, world.users["researcher"], gpu_count=4)
    client = client_for("researcher")

    def statements() -> int:
        client.get(f"/api/jobs/{job.pk}/")
        with CaptureQueriesContext(connection) as captured:
            assert client.get(f"/api/jobs/{job.pk}/").status_code == 200
        return len(captured.captured_queries)

    small = statements()
    for k in range(6):
        node = _a100(world, f"more-{k}", "online" if k % 2 else "reclaimed", live=bool(k % 2))
        _night_window_in_3_hours(node)
    assert statements() == small


def test_queued_details_share_one_campus_snapshot_within_the_read_models_age_bound(
        world: World, client_for: Callable[[str | None], APIClient], monkeypatch: pytest.MonkeyPatch,
        settings: Any) -> None:
    settings.RECLAIMNET_DASHBOARD_MAX_AGE_S = 600  # production keeps 5 s; long enough here not to expire mid-test
    monkeypatch.setattr(explain, "_cached", None)
    client = client_for("researcher")
    ended = f.make_job(world.group, world.users["researcher"], state="cancelled")  # no placement, like the others
    first, second = (f.make_job(world.group, world.users["researcher"], gpu_count=4) for _ in range(2))

    def statements(job: Job) -> tuple[int, dict[str, Any]]:
        with CaptureQueriesContext(connection) as captured:
            body = client.get(f"/api/jobs/{job.pk}/").json()
        return len(captured.captured_queries), body

    client.get(f"/api/jobs/{ended.pk}/")  # the session and the like, cached by a first request
    plain, _ = statements(ended)  # not queued: no waiting reason to read
    reading, one = statements(first)
    sharing, two = statements(second)
    assert reading > sharing == plain + 1  # the snapshot once; then one statement about the job itself
    assert one["waiting_reason"]["text"] == two["waiting_reason"]["text"]


# --- why it waits: the page -------------------------------------------------------------------------------------------


def test_job_page_shows_why_it_waits_and_refreshes_it_live(world: World) -> None:
    job = f.make_job(world.group, world.users["researcher"], name="wide", gpu_count=4)
    _a100(world, "a100-busy", "online", live=True)
    f.place_job(f.make_job(world.group, world.users["researcher"], gpu_count=1), Node.objects.get(name="a100-busy"))
    client = _page(world)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    section = html[html.index('id="waiting-reason"'):]
    section = section[:section.index("</section>")]
    assert f'data-live="job-{job.pk}"' in section and "?fragment=waiting" in section and "every 30s" in section
    assert "Why it is waiting" in section
    assert "No lent node has 4 GPUs free right now. The A100 node that would fit is busy with other jobs." in section
    fragment = client.get(f"/jobs/{job.pk}/?fragment=waiting")
    assert fragment.status_code == 200 and b"<html" not in fragment.content
    assert b"busy with other jobs" in fragment.content


def test_a_running_jobs_page_keeps_an_empty_live_slot(world: World) -> None:
    f.place_job(world.job, world.node)
    html = _page(world).get(f"/jobs/{world.job.pk}/?fragment=waiting").content.decode()
    assert 'id="waiting-reason"' in html and "Why it is waiting" not in html and "every 30s" not in html


# --- why it went there: the timeline ----------------------------------------------------------------------------------


def _timeline(world: World, job: Job) -> str:
    return _page(world).get(f"/jobs/{job.pk}/?fragment=timeline").content.decode()


def test_a_placement_says_why_that_node_and_names_the_runners_up(world: World) -> None:
    third, _ = f.make_node(world.other_lab, world.building, name="robotics-02", state="online")
    f.connect_agent(third, 9003)
    job = f.make_job(world.group, world.users["researcher"], name="fresh", expected_runtime_s=7200)
    assert place_job(job.pk).startswith("placed")
    row = DecisionLog.objects.get(job=job, kind="p2")
    names = dict(Node.objects.values_list("pk", "name"))
    chosen, runners = names[row.response["destination"]], [names[r["id"]] for r in row.response["runners_up"]]
    assert len(runners) == 2
    html = _timeline(world, job)
    why = re.search(r'data-testid="placement-why"><strong>Why here:</strong> (.*?)</p>', html, re.S).group(1)  # type: ignore[union-attr]
    assert f"{chosen} was chosen: the lowest reclaim risk" in why and "chance it stays lent for the 2 h left" in why
    assert f"Runners-up: {runners[0]} (reclaim risk" in why and runners[1] in why
    assert "3 nodes had room for it" in why
    assert not re.search(r"#\d|node \d", why)


def test_a_migration_says_where_it_went_and_the_interval_its_rule(world: World, dispatch_spy: Any) -> None:
    job = f.make_job(world.group, world.users["researcher"], name="moving", ckpt_bytes_estimate=2_000_000_000,
                     loss_budget_s=3600)
    f.place_job(job, world.node, started_at=timezone.now() - dt.timedelta(minutes=5))
    assert p1_tick() == 1  # P1 sets the interval of the running job and logs why
    reclaim = request_reclaim(world.node, world.users["provider"], notice_s=600)
    assert run_reclaim(reclaim.pk) == "planned"
    migration = Migration.objects.get(job=job)
    assert migration.destination == world.other_node
    html = _timeline(world, job)
    why = re.search(r'data-testid="migration-why"><strong>Why there:</strong> (.*?)</p>', html, re.S).group(1)  # type: ignore[union-attr]
    assert why.startswith("robotics-01 was chosen: ") and "MB/s to the checkpoint" in why
    assert "to copy and restart" in why and "reclaim risk" in why
    interval = re.search(r'data-testid="interval-why"><strong>Checkpoints here:</strong> (.*?)</p>', html, re.S).group(1)  # type: ignore[union-attr]
    assert re.search(r"Every \d.*: a checkpoint takes .* to write and send \(2\.0 GB at \d+ MB/s\); this node is "
                     r"reclaimed ", interval)


def test_presync_choices_are_not_mistaken_for_placements(world: World) -> None:
    job = f.make_job(world.group, world.users["researcher"])
    placement = f.place_job(job, world.node)
    DecisionLog.objects.create(kind="p2", job=job, request={"presync": {"checkpoint": 1}},
                               response={"holder": world.other_node.pk, "destination": world.node.pk})
    assert explain.decision_words(job, [placement], []).placement == {}
