"""Bounded tables (design §9.8): a month of bandwidth samples at the demo campus's rate stays under a stated
bound, and old decision logs are pruned."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import pytest
from control_helpers import load_script, make_node
from django.db import connection
from django.utils import timezone

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]
PER_DAY = 8640  # one sample every 10 s per access link (the demo agents' heartbeat telemetry)
DAYS = 32


def _tickcampus() -> Any:
    return load_script("tickcampus")


def test_a_month_of_samples_stays_bounded_and_keeps_its_means() -> None:
    from portal.control.loop.housekeeping import roll_up_samples
    from portal.core.models import BandwidthSample

    node, _ = make_node("sampled")
    link = node.access_link
    rng = random.Random(3)
    start = timezone.now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(days=DAYS)
    day_means = []
    for day in range(DAYS):
        end = start + dt.timedelta(days=day + 1)
        before = BandwidthSample.objects.filter(resolution_s=0).count()
        _tickcampus().add_samples([link], PER_DAY, end, rng, connection, spacing_s=10.0)
        fresh = BandwidthSample.objects.filter(resolution_s=0, sampled_at__gt=end - dt.timedelta(days=1))
        day_means.append(sum(fresh.values_list("bytes_per_s", flat=True)) / fresh.count())
        assert BandwidthSample.objects.filter(resolution_s=0).count() == before + PER_DAY
        roll_up_samples(end)  # beat runs it every ten minutes; once a day is the worst case for the bound
    total = BandwidthSample.objects.count()
    # A day of raw samples (+ up to a minute of them before the aligned cutoff), 1-minute means for the 29 days
    # before it (+1 partial), hourly means for what is older.
    bound = PER_DAY + 6 + 1440 * 30 + 24 * (DAYS - 30) + 2
    inserted = PER_DAY * DAYS
    print(f"{inserted} samples inserted over {DAYS} days, {total} rows kept (bound {bound})")
    assert total <= bound < inserted / 5
    assert BandwidthSample.objects.filter(resolution_s=3600).exists()
    # The rolled-up means keep the mean of what they replaced (equal weights: every minute holds six samples; the
    # first and last minute of a day also hold a sample of the neighbouring day, hence rel=1e-3).
    old_day = start + dt.timedelta(days=5)
    kept = BandwidthSample.objects.filter(sampled_at__gte=old_day - dt.timedelta(days=1), sampled_at__lt=old_day)
    values = list(kept.values_list("bytes_per_s", flat=True))
    assert sum(values) / len(values) == pytest.approx(day_means[4], rel=1e-3)


def test_decision_logs_older_than_the_keep_period_are_pruned(settings: Any) -> None:
    from portal.control.loop.housekeeping import prune_decision_logs
    from portal.core.models import DecisionLog

    settings.RECLAIMNET = {**settings.RECLAIMNET, "DECISION_LOG_KEEP_DAYS": 30.0}
    old = DecisionLog.objects.create(kind="p1", request={}, response={})
    DecisionLog.objects.filter(pk=old.pk).update(created_at=timezone.now() - dt.timedelta(days=31))
    recent = DecisionLog.objects.create(kind="p2", request={}, response={})
    assert prune_decision_logs() == 1
    assert list(DecisionLog.objects.values_list("pk", flat=True)) == [recent.pk]
