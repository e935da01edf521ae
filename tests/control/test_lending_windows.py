"""The control plane honours lending windows (design §9.13): placement never picks a node outside its window, a
window's end moves jobs off with notice through the reclaim path, the node lends again when its next window opens
with no manual step, the waiting reason says what placement does, and a lost window-end step is redone.

Every test runs on an injected clock (``django.utils.timezone.now`` patched), never the wall clock.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from control_helpers import make_node, make_running_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

WEDNESDAY = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)  # settings.TIME_ZONE is UTC in the tests
NIGHTS = [{"weekday": d, "start_time": dt.time(18), "end_time": dt.time(8)} for d in range(7)]  # 18:00–08:00


class Clock:
    def __init__(self) -> None:
        self.t = WEDNESDAY + dt.timedelta(hours=12)

    def at(self, hours: float) -> dt.datetime:
        """Wednesday (or later: hours past 24) at ``hours`` o'clock."""
        self.t = WEDNESDAY + dt.timedelta(hours=hours)
        return self.t


@pytest.fixture
def clock() -> Iterator[Clock]:
    c = Clock()
    with mock.patch("django.utils.timezone.now", new=lambda: c.t):
        yield c


def _online(name: str, windows: list[dict[str, Any]] | None = None, building: str = "A") -> Any:
    """A node with a connected agent (open session, hello with no jobs) and ``windows``."""
    from portal.control.link.handlers import hello, open_session
    from portal.core.models import LendingWindow

    node, _ = make_node(name, building)
    session = open_session(node.pk, f"chan-{name}", "127.0.0.1")
    hello(node.pk, session, {"type": "hello", "agent_version": "t", "gpus": [], "data_host": "127.0.0.1",
                             "data_port": 9000 + node.pk, "jobs": []})
    LendingWindow.objects.bulk_create([LendingWindow(node=node, **w) for w in windows or []])
    node.refresh_from_db()
    return node


def _tick(clock: Clock) -> dict[str, int]:
    """One control tick at the injected time, every agent having just sent a heartbeat."""
    from portal.control.loop.ticks import control_tick
    from portal.core.models import Node

    Node.objects.update(last_heartbeat_at=clock.t)
    return control_tick(clock.t)


def _queued(gpus: int = 1) -> Any:
    from django.contrib.auth import get_user_model

    from portal.core.models import Job, ResearchGroup

    group, _ = ResearchGroup.objects.get_or_create(slug="g", defaults={"name": "G"})
    user, _ = get_user_model().objects.get_or_create(username="researcher")
    return Job.objects.create(name="q", owner=user, group=group, command="python examples/train_numpy.py",
                              gpu_count=gpus, expected_runtime_s=600, ckpt_bytes_estimate=1000, restart_s=1.0,
                              loss_budget_s=10)


def _placed_on(job: Any) -> str | None:
    from portal.core.models import Placement

    return Placement.objects.filter(job=job, ended_at__isnull=True).values_list("node__name", flat=True).first()


def test_a_node_outside_its_window_is_never_chosen_and_lends_again_when_it_opens(clock: Clock) -> None:
    from portal.control.loop.ticks import place_queued
    from portal.core.services.explain import campus_facts, waiting_reason

    _online("night", NIGHTS)
    job = _queued()
    clock.at(12)
    assert place_queued() == 0 and _placed_on(job) is None
    reason = waiting_reason(job, campus_facts())
    assert "lent only 18:00–08:00 daily" in reason["text"] and "opens in 6 h" in reason["text"]
    assert reason["next_window_at"] == WEDNESDAY + dt.timedelta(hours=18)
    clock.at(18)  # the window opens: no "Lend again", the next placement takes it
    assert place_queued() == 1 and _placed_on(job) == "night"


def test_an_always_lent_node_is_chosen_over_one_outside_its_window(clock: Clock) -> None:
    from portal.control.loop.ticks import place_queued

    _online("night", NIGHTS)
    _online("day")
    jobs = [_queued(), _queued()]
    clock.at(9)
    place_queued()
    assert [_placed_on(j) for j in jobs].count("night") == 0
    assert [_placed_on(j) for j in jobs].count("day") == 2


def test_a_node_takes_nothing_new_within_the_notice_of_its_window_end(clock: Clock) -> None:
    from portal.control.loop.ticks import place_queued
    from portal.control.loop.windows import window_notice_s
    from portal.core.services.explain import campus_facts, waiting_reason

    _online("night", NIGHTS)
    job = _queued()
    clock.at(8 - (window_notice_s() - 60) / 3600)  # inside the window, its end within the notice
    assert place_queued() == 0 and _placed_on(job) is None
    reason = waiting_reason(job, campus_facts())
    assert "at the end of its lending window" in reason["text"]
    assert reason["reasons"] == [{"reason": "closing", "nodes": 1}]


def test_window_times_are_the_campus_local_time(clock: Clock, settings: Any) -> None:
    from portal.core import campus

    node = _online("night", NIGHTS)
    clock.at(17.5)  # 17:30 UTC
    assert campus.load().free_gpus[campus.load().index_of[node.pk]] == 0
    settings.TIME_ZONE = "Europe/Berlin"  # 18:30 there: inside the window
    snap = campus.load()
    assert snap.free_gpus[snap.index_of[node.pk]] == 2


def test_at_window_end_a_running_job_is_checkpointed_and_moved_with_the_notice(clock: Clock) -> None:
    from portal.control.loop.windows import window_notice_s
    from portal.control.models import AgentCommand
    from portal.core import campus
    from portal.core.models import Job, Migration, Node, ReclaimEvent

    night = _online("night", NIGHTS)
    day = _online("day")
    clock.at(24 + 6)  # Thursday 06:00, inside the night window
    job = make_running_job(night)
    notice_s = window_notice_s()
    clock.at(24 + 8 - (notice_s + 60) / 3600)  # a minute before the notice starts: nothing yet
    _tick(clock)
    assert not ReclaimEvent.objects.exists() and Job.objects.get(pk=job.pk).state == "running"

    clock.at(24 + 8 - (notice_s - 60) / 3600)  # inside the notice
    assert _tick(clock)["window_ends"] == 1
    reclaim = ReclaimEvent.objects.get(node=night)
    assert reclaim.kind == "window" and reclaim.get_kind_display() == "lending window ends"
    assert reclaim.deadline_at == WEDNESDAY + dt.timedelta(hours=32)
    assert reclaim.notice_s == pytest.approx(notice_s - 60)
    assert Job.objects.get(pk=job.pk).state == "migrating"
    mig = Migration.objects.get(job=job)
    assert mig.mode == "planned" and mig.destination_id == day.pk and mig.reclaim_id == reclaim.pk
    final = AgentCommand.objects.filter(node=night, kind="checkpoint").values_list("payload", flat=True).get()
    assert final["final"] is True and final["job_id"] == job.pk
    assert not AgentCommand.objects.filter(node=night, kind__in=["killswitch", "reclaim_notice"]).exists()
    snap = campus.load()
    assert snap.free_gpus[snap.index_of[night.pk]] == 0  # closing: nothing new starts there
    assert _tick(clock)["window_ends"] == 0  # one reclaim per window end

    clock.at(24 + 8 + 1 / 3600)  # the window ended with the final checkpoint not written: forced
    _tick(clock)
    reclaim.refresh_from_db()
    assert reclaim.outcome == "forced" and reclaim.finished_at is not None
    assert Job.objects.get(pk=job.pk).state != "running" and _placed_on(job) != "night"
    night.refresh_from_db()
    assert night.state == "online" and not night.killswitch_engaged  # still lent, outside its window
    assert not AgentCommand.objects.filter(node=night, kind="killswitch").exists()

    clock.at(24 + 18)  # the next window opens: placeable again, nobody pressed "Lend again"
    snap = campus.load()
    assert snap.free_gpus[snap.index_of[night.pk]] == 2
    assert Node.objects.get(pk=night.pk).state == "online"


def test_a_job_still_running_after_its_window_closed_moves_at_once(clock: Clock) -> None:
    from portal.core.models import Job, ReclaimEvent

    night = _online("night", NIGHTS)
    _online("day")
    clock.at(6)
    job = make_running_job(night)
    clock.at(9)  # e.g. a tick lost over the whole notice: no time is left
    _tick(clock)
    reclaim = ReclaimEvent.objects.get(node=night)
    assert reclaim.kind == "window" and reclaim.notice_s == 0 and reclaim.finished_at is not None
    assert _placed_on(job) != "night" and Job.objects.get(pk=job.pk).state in ("queued", "migrating", "running")


def test_a_lost_window_end_step_is_redone_by_the_next_tick(clock: Clock) -> None:
    from portal.control.loop import windows
    from portal.core.models import Job, ReclaimEvent

    night = _online("night", NIGHTS)
    _online("day")
    clock.at(6)
    job = make_running_job(night)
    clock.at(7.95)  # 3 minutes before the end

    class Killed(Exception):  # noqa: N818
        pass

    with mock.patch.object(windows.outbox, "enqueue", side_effect=Killed):
        assert windows.start_window_ends(clock.t) == []  # the step fails before it commits
    assert not ReclaimEvent.objects.exists() and Job.objects.get(pk=job.pk).state == "running"
    clock.at(7.96)
    _tick(clock)
    assert ReclaimEvent.objects.filter(node=night, kind="window").count() == 1
    assert Job.objects.get(pk=job.pk).state == "migrating"
    assert windows.start_window_ends(clock.t) == []  # redone once, not twice


def test_the_waiting_reason_and_placement_agree_on_random_windows_and_times(clock: Clock) -> None:
    from portal.core import campus
    from portal.core.services.explain import campus_facts

    rng = random.Random(7)
    nodes = []
    for k in range(4):
        windows = [{"weekday": rng.randrange(7), "start_time": dt.time(rng.randrange(24), rng.choice([0, 30])),
                    "end_time": dt.time(rng.randrange(24), rng.choice([0, 30]))} for _ in range(rng.randint(0, 3))]
        nodes.append(_online(f"n{k}", windows, building="AB"[k % 2]))
    for _ in range(25):
        clock.at(rng.uniform(0, 7 * 24))
        snap = campus.load()
        facts = campus_facts()
        for node in nodes:
            placeable = snap.free_gpus[snap.index_of[node.pk]] > 0
            i = facts.node_pks.index(node.pk)
            assert placeable == (facts.nodes.availability[i] == "lent"), (node.name, clock.t)
            opens = facts.nodes.next_window_s[i]
            assert placeable == (not (opens > 0)), (node.name, clock.t)  # NaN: a window is open or none
