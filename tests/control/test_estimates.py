"""The control tick keeps the estimates fresh from telemetry and departures (design §2 estimators)."""

from __future__ import annotations

import datetime as dt

import pytest
from control_helpers import make_node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(30)]


def test_bandwidth_samples_and_departures_update_estimates() -> None:
    from django.utils import timezone

    from portal.control import estimates
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import BandwidthSample, HazardEstimate, LinkEstimate, ReclaimEvent

    estimates._state = None
    node, _ = make_node("n1")
    node_lifecycle.come_online(node)
    capacity = node.access_link.capacity_bytes_per_s
    BandwidthSample.objects.create(link=node.access_link, node=node, sampled_at=timezone.now(),
                                   bytes_per_s=0.25 * capacity)
    estimates._state = None
    estimates._current().seen_sample_id = 0
    result = estimates.update_estimates()
    assert result["links"] == 1 and result["hazard_written"] == 1
    estimate = LinkEstimate.objects.get(link=node.access_link)
    assert estimate.mean_bytes_per_s == pytest.approx(0.75 * capacity)
    assert 0 < estimate.lower_bytes_per_s <= estimate.mean_bytes_per_s
    hour = timezone.localtime(timezone.now()).hour
    before = HazardEstimate.objects.get(node=node, hour_of_day=hour).hazard_per_s
    now = timezone.now()
    ReclaimEvent.objects.create(node=node, kind="emergency", notice_s=0, deadline_at=now + dt.timedelta(0))
    assert estimates.update_estimates()["hazard_written"] == 1
    after = HazardEstimate.objects.get(node=node, hour_of_day=hour)
    assert after.hazard_per_s > before and after.hazard_upper_per_s >= after.hazard_per_s
