"""The estimators are a function of the recorded history, stored and shared (design §2 estimators, §9.5)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from control_helpers import make_node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _later(seconds: float) -> dt.datetime:
    from django.utils import timezone

    return timezone.now() + dt.timedelta(seconds=seconds)


def test_bandwidth_samples_and_departures_update_estimates() -> None:
    from django.utils import timezone

    from portal.control.loop import estimates
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import BandwidthSample, HazardEstimate, HazardScope, LinkEstimate, ReclaimEvent

    node, _ = make_node("n1")
    node_lifecycle.come_online(node)
    capacity = node.access_link.capacity_bytes_per_s
    BandwidthSample.objects.create(link=node.access_link, node=node, sampled_at=timezone.now(),
                                   bytes_per_s=0.25 * capacity)
    result = estimates.update_estimates(_later(estimates.SETTLE_S + 1))
    assert result == {"links": 1, "hazard_written": 1, "rebuilt": 1}
    estimate = LinkEstimate.objects.get(link=node.access_link)
    assert estimate.mean_bytes_per_s == pytest.approx(0.75 * capacity)
    assert 0 < estimate.lower_bytes_per_s <= estimate.mean_bytes_per_s
    hour = timezone.localtime(timezone.now()).hour
    before = HazardEstimate.objects.get(node=node, hour_of_day=hour).hazard_per_s
    assert HazardEstimate.objects.filter(scope=HazardScope.PROVIDER, provider=node.provider).count() == 24
    assert HazardEstimate.objects.filter(scope=HazardScope.CAMPUS).count() == 24
    departed = ReclaimEvent.objects.create(node=node, kind="emergency", notice_s=0, deadline_at=timezone.now())
    ReclaimEvent.objects.filter(pk=departed.pk).update(requested_at=_later(3))  # after what the first tick saw
    result = estimates.update_estimates(_later(3 + estimates.SETTLE_S + 1))
    assert result["hazard_written"] == 1 and result["rebuilt"] == 0  # continued from the stored snapshot
    after = HazardEstimate.objects.get(node=node, hour_of_day=hour)
    assert after.hazard_per_s > before and after.hazard_upper_per_s >= after.hazard_per_s


def test_exposure_is_counted_from_the_availability_record() -> None:
    """Exposure (lent time) comes from the availability record, not from whatever state a node is in when a
    tick looks: lent 4 h, 2 h and never, whatever the nodes' states now."""
    from django.utils import timezone

    from portal.control.loop import estimates
    from portal.core.models import NodeAvailability

    long, _ = make_node("long-lent")
    short, _ = make_node("short-lent")
    never, _ = make_node("never-lent")
    now = timezone.now()
    NodeAvailability.objects.create(node=long, at=now - dt.timedelta(hours=4), state="online", lent=True)
    NodeAvailability.objects.create(node=short, at=now - dt.timedelta(hours=3), state="online", lent=True)
    NodeAvailability.objects.create(node=short, at=now - dt.timedelta(hours=1), state="offline", lent=False)
    state = estimates.rebuild(*estimates.campus_layout(), estimates.clock_s(now))
    exposure_s = state.hazard.to_arrays()["exposure_s"].sum(axis=0)
    i = state.node_index
    assert exposure_s[i[long.pk]] == pytest.approx(4 * 3600)
    assert exposure_s[i[short.pk]] == pytest.approx(2 * 3600)
    assert exposure_s[i[never.pk]] == 0
    assert list(state.lent[[i[long.pk], i[short.pk], i[never.pk]]]) == [True, False, False]


def test_replaying_in_pieces_equals_replaying_at_once() -> None:
    """Cut the same hour of records into ticks of any length: the state comes out the same."""
    from django.utils import timezone

    from portal.control.loop import estimates
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import BandwidthSample, NodeAvailability, ReclaimEvent

    rng = np.random.default_rng(7)
    now = timezone.now()
    nodes = [make_node(f"piece-{k}", "AB"[k % 2])[0] for k in range(4)]
    for node in nodes:
        node_lifecycle.come_online(node)
    NodeAvailability.objects.update(at=now - dt.timedelta(minutes=70))
    for _ in range(40):
        node = nodes[int(rng.integers(len(nodes)))]
        at = now - dt.timedelta(seconds=float(rng.uniform(0, 3600)))
        kind = rng.choice(["sample", "departure", "away", "back"])
        if kind == "sample":
            BandwidthSample.objects.create(link=node.access_link, node=node, sampled_at=at,
                                           bytes_per_s=float(rng.uniform(0, 1e8)))
        elif kind == "departure":
            event = ReclaimEvent.objects.create(node=node, kind="emergency", notice_s=0, deadline_at=at)
            ReclaimEvent.objects.filter(pk=event.pk).update(requested_at=at)
        else:
            NodeAvailability.objects.create(node=node, at=at, state="online", lent=kind == "back")
    layout = estimates.campus_layout()
    end_s = estimates.clock_s(now)
    whole = estimates.rebuild(*layout, end_s)
    pieces = estimates.rebuild(*layout, end_s - 3600)
    t_s = pieces.until_s
    while t_s < end_s:
        t_s = min(end_s, t_s + float(rng.uniform(1, 400)))
        # Through a snapshot each time, as another worker would continue it.
        estimates.save(pieces)
        from portal.control.models import EstimatorSnapshot

        pieces = estimates.EstimatorState.from_snapshot(EstimatorSnapshot.objects.get())
        estimates.advance(pieces, t_s)
    np.testing.assert_allclose(pieces.hazard.hourly_profile_upper_per_s(end_s),
                               whole.hazard.hourly_profile_upper_per_s(end_s), rtol=1e-9)
    fresh = estimates.fresh_links(whole)
    assert fresh.any() and (fresh == estimates.fresh_links(pieces)).all()
    np.testing.assert_allclose(pieces.bandwidth.mean_bytes_per_s()[fresh], whole.bandwidth.mean_bytes_per_s()[fresh],
                               rtol=1e-9)
    np.testing.assert_allclose(pieces.bandwidth.lower_bytes_per_s()[fresh],
                               whole.bandwidth.lower_bytes_per_s()[fresh], rtol=1e-9, atol=1e-6)
    assert (pieces.lent == whole.lent).all()
