"""Bounded tables (design §9.8): bandwidth samples rolled up, decision logs pruned.

Agents report one egress sample per access link every heartbeat period (about 466,000 rows a day on a
54-node campus). Samples older than a day become 1-minute means, 1-minute means older than 30 days become hourly
means; each step replaces its rows in one transaction, period by whole period (the cutoff is aligned to the
period, so a period is never rolled up twice). The estimators read only the last minutes of raw samples; the
dashboard reads whichever resolution a time has. Decision logs older than ``DECISION_LOG_KEEP_DAYS`` are deleted.
The agent link's bookkeeping (design §9.9) is pruned too: commands acked, superseded or expired over an hour ago,
reliable reports handled over a day ago.
"""

from __future__ import annotations

import datetime as dt

from django.db import transaction
from django.db.models import Avg, QuerySet
from django.db.models.functions import TruncHour, TruncMinute
from django.utils import timezone

from portal.control.config import rn
from portal.control.link import commands, handlers, presence
from portal.core.models import BandwidthSample, DecisionLog
from portal.core.services.results import prune_old_results

RAW_KEEP_S = 86400.0
MINUTE_KEEP_S = 30 * 86400.0
MINUTE_S, HOUR_S = 60, 3600


def _aligned(when: dt.datetime, period_s: int) -> dt.datetime:
    seconds = int(when.timestamp()) // period_s * period_s
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


def _roll_up(source: QuerySet, truncate: type, period_s: int) -> int:
    """Replace ``source``'s rows by their per-link means over ``period_s`` periods; returns the rows removed."""
    means = list(source.annotate(period=truncate("sampled_at")).values("link_id", "period")
                 .annotate(mean=Avg("bytes_per_s")).values_list("link_id", "period", "mean"))
    if not means:
        return 0
    BandwidthSample.objects.bulk_create(
        [BandwidthSample(link_id=link_id, sampled_at=period, bytes_per_s=float(mean), resolution_s=period_s)
         for link_id, period, mean in means], batch_size=5000)
    removed, _ = source.delete()
    return removed


def roll_up_samples(now: dt.datetime | None = None) -> dict[str, int]:
    """Raw samples older than a day → 1-minute means; 1-minute means older than 30 days → hourly means."""
    now = now or timezone.now()
    with transaction.atomic():
        raw = _roll_up(BandwidthSample.objects.filter(
            resolution_s=0, sampled_at__lt=_aligned(now - dt.timedelta(seconds=RAW_KEEP_S), MINUTE_S)),
            TruncMinute, MINUTE_S)
        minutes = _roll_up(BandwidthSample.objects.filter(
            resolution_s=MINUTE_S, sampled_at__lt=_aligned(now - dt.timedelta(seconds=MINUTE_KEEP_S), HOUR_S)),
            TruncHour, HOUR_S)
    return {"raw_rolled_up": raw, "minutes_rolled_up": minutes}


def prune_decision_logs(now: dt.datetime | None = None) -> int:
    now = now or timezone.now()
    removed, _ = DecisionLog.objects.filter(
        created_at__lt=now - dt.timedelta(days=float(rn("DECISION_LOG_KEEP_DAYS")))).delete()
    return removed


def housekeeping(now: dt.datetime | None = None) -> dict[str, int]:
    """What beat runs every ten minutes (and the embedded default beside its outbox pruning)."""
    return {**roll_up_samples(now), "decision_logs_pruned": prune_decision_logs(now),
            "commands_pruned": commands.prune(now), "reports_pruned": handlers.prune_received(now),
            "link_servers_pruned": presence.prune(now),
            "results_files_pruned": prune_old_results(now)}  # jobs ended over RESULTS_KEEP_DAYS ago (design §14)
