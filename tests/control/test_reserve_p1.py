"""P1 in the portal plans with the rate a job will actually get (design §4 "Work-conserving reserve": the idle part
of research's reserve is borrowed) and honours the job's loss budget mode (design §2 "Loss budget modes")."""

from __future__ import annotations

from typing import Any

import pytest
from control_helpers import make_node, make_running_job
from django.utils import timezone

pytestmark = pytest.mark.django_db


def _setup() -> tuple[Any, Any]:
    from portal.core.lifecycle import nodes as node_lifecycle

    node, _ = make_node("wc1")
    node_lifecycle.come_online(node)
    node.refresh_from_db()
    return node, make_running_job(node, ckpt_bytes=2_000_000_000)


def _research(node: Any, bytes_per_s: float) -> None:
    from portal.core.models import LinkClassSample

    LinkClassSample.objects.create(link_id=node.access_link_id, node=node, sampled_at=timezone.now(), interval_s=2.0,
                                   research_bytes=int(bytes_per_s * 2.0), checkpoint_bytes=0)


def _bandwidth(job: Any) -> float:
    from portal.control.loop.ticks import p1_tick
    from portal.core.models import Job

    Job.objects.filter(pk=job.pk).update(checkpoint_interval_s=None)
    p1_tick()
    return float(Job.objects.get(pk=job.pk).checkpoint_bandwidth_bytes_per_s)


def test_idle_research_reserve_is_lent_to_checkpoints_and_taken_back() -> None:
    node, job = _setup()
    cap = node.access_link.capacity_bytes_per_s
    unmeasured = _bandwidth(job)
    assert unmeasured == pytest.approx(0.3 * cap)  # CHECKPOINT_BUDGET_FRACTION·B, as before
    _research(node, 0.0)
    assert _bandwidth(job) == pytest.approx(0.6 * cap)  # + the whole idle reserve β·B
    _research(node, 0.1 * cap)
    assert _bandwidth(job) == pytest.approx(0.5 * cap)
    _research(node, 0.3 * cap)  # research uses its whole reserve: nothing to borrow
    assert _bandwidth(job) == pytest.approx(0.3 * cap)


def test_a_bound_job_is_planned_within_its_budget() -> None:
    from portal.control.loop.ticks import p1_tick
    from portal.core.models import Job

    _, job = _setup()
    Job.objects.filter(pk=job.pk).update(loss_budget_s=600.0, loss_budget_mode="expected")
    p1_tick()
    expected = Job.objects.get(pk=job.pk)
    Job.objects.filter(pk=job.pk).update(loss_budget_mode="bound", checkpoint_interval_s=None)
    p1_tick()
    bound = Job.objects.get(pk=job.pk)
    copy_s = 2_000_000_000 / bound.checkpoint_bandwidth_bytes_per_s
    assert bound.checkpoint_interval_s + copy_s <= 600.0 * (1 + 1e-9)
    assert bound.checkpoint_interval_s < expected.checkpoint_interval_s
    assert not bound.loss_budget_at_risk


def test_a_bound_jobs_copy_time_is_taken_at_the_guaranteed_budget_not_the_borrowed_one() -> None:
    """design §2 "Loss budget modes" with §4.2: research takes its idle reserve back within a heartbeat, so the
    bound holds at the guaranteed budget: Δ + C/(CHECKPOINT_BUDGET_FRACTION·B) ≤ L_max while the job is given (and
    plans its share with) the borrowed 0.6·B."""
    from portal.control.loop.ticks import p1_tick
    from portal.core.models import Job

    node, job = _setup()
    cap = node.access_link.capacity_bytes_per_s
    _research(node, 0.0)  # the whole reserve is idle: checkpoints borrow it
    Job.objects.filter(pk=job.pk).update(loss_budget_s=300.0, loss_budget_mode="bound", checkpoint_interval_s=None)
    p1_tick()
    bound = Job.objects.get(pk=job.pk)
    assert bound.checkpoint_bandwidth_bytes_per_s == pytest.approx(0.6 * cap)
    # L_max − T with T at 0.3·B (not 0.6·B, which would leave 300 − C/(0.6·B))
    assert bound.checkpoint_interval_s == pytest.approx(300.0 - 2_000_000_000 / (0.3 * cap))
    assert not bound.loss_budget_at_risk


def test_short_notice_scheduled_reclaims_count_as_hazard() -> None:
    """design §2 "Estimators": scheduled reclaims whose notice is shorter than the final checkpoint needs behave as
    emergencies, so the tick's estimator state adds their rate to λ; a one-off P1 without it plans as before."""
    import datetime as dt

    from portal.control.loop import estimates
    from portal.control.loop.ticks import p1_tick
    from portal.core.models import DecisionLog, Job, NodeAvailability, ReclaimEvent
    from scheduler.contract import decide

    node, job = _setup()
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(loss_budget_s=1e9)
    NodeAvailability.objects.create(node=node, at=now - dt.timedelta(hours=5), state="online", lent=True)
    for minutes in (200, 140, 80, 20):  # four reclaims with 10 s of notice in the last hours
        at = now - dt.timedelta(minutes=minutes)
        event = ReclaimEvent.objects.create(node=node, kind="scheduled", notice_s=10, deadline_at=at + dt.timedelta(
            seconds=10))
        ReclaimEvent.objects.filter(pk=event.pk).update(requested_at=at)

    def plan(state: Any) -> tuple[float, float]:
        Job.objects.filter(pk=job.pk).update(checkpoint_interval_s=None)
        p1_tick(now, state)
        log = DecisionLog.objects.filter(kind="p1", job=job).latest("pk")
        planned = log.response["jobs"][0]["planned_hazard_per_s"]
        asked = log.request["jobs"][0]
        assert planned == pytest.approx(asked["hazard_per_s"] + asked["short_notice_hazard_per_s"])
        # the logged request is a p1 request of the contract (design §5): replayed, it plans the same interval
        replayed = decide("p1", log.request)["jobs"][0]
        assert replayed["interval_s"] == pytest.approx(log.response["jobs"][0]["interval_s"])
        assert replayed["planned_hazard_per_s"] == pytest.approx(planned)
        return float(Job.objects.get(pk=job.pk).checkpoint_interval_s), planned

    plain_interval, plain_hazard = plan(None)
    state = estimates.rebuild(*estimates.campus_layout(), estimates.clock_s(now))
    assert state.hazard.short_notice_rates_per_s(state.until_s)[state.node_index[node.pk]].max() > 0
    interval, hazard = plan(state)
    assert hazard > plain_hazard and interval < plain_interval


def test_short_notice_test_uses_the_links_calibrated_reserve() -> None:
    """design §4.1 with §2 "Estimators": P1 counts a scheduled reclaim as short-notice when its notice is shorter
    than C/b + T_r at the rate P3 would give the final checkpoint — B⁻ less the link's calibrated reserve. A notice
    that is enough at 70% of the link is too short once research's calibrated reserve is 60% of it."""
    import datetime as dt

    from portal.control.loop import estimates
    from portal.control.loop.ticks import p1_tick
    from portal.core.models import DecisionLog, Job, LinkReserve, NodeAvailability, ReclaimEvent

    node, job = _setup()
    cap = float(node.access_link.capacity_bytes_per_s)
    at_beta_s = 2_000_000_000 / (0.7 * cap) + float(job.restart_s)
    at_calibrated_s = 2_000_000_000 / (0.4 * cap) + float(job.restart_s)
    notice_s = (at_beta_s + at_calibrated_s) / 2
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(loss_budget_s=1e9)
    NodeAvailability.objects.create(node=node, at=now - dt.timedelta(hours=5), state="online", lent=True)
    for minutes in (200, 140, 80, 20):
        at = now - dt.timedelta(minutes=minutes)
        event = ReclaimEvent.objects.create(node=node, kind="scheduled", notice_s=notice_s,
                                            deadline_at=at + dt.timedelta(seconds=notice_s))
        ReclaimEvent.objects.filter(pk=event.pk).update(requested_at=at)
    state = estimates.rebuild(*estimates.campus_layout(), estimates.clock_s(now))

    def short_notice_hazard() -> float:
        Job.objects.filter(pk=job.pk).update(checkpoint_interval_s=None)
        p1_tick(now, state)
        return float(DecisionLog.objects.filter(kind="p1", job=job).latest("pk").request["jobs"][0]
                     ["short_notice_hazard_per_s"])

    assert short_notice_hazard() == 0.0  # β·B reserve: every notice was long enough
    LinkReserve.objects.create(link=node.access_link, reserve_bytes_per_s=0.6 * cap, source="calibrated")
    assert short_notice_hazard() > 0.0
