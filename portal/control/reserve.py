"""The research reserve per link, calibrated from the campus's own traffic (design §4 "Calibrated reserve").

- :func:`calibrate_reserves` (daily, Celery on the ``evaluation`` queue): for every link, B_min =
  max(p95 of research's share over the last 7 days × B, β·B) from the agents' class samples, stored with its
  source (calibrated / override / default); old samples are pruned (design §9.8 bounded tables).
- :func:`set_reserve_override` (admin page, API): an admin's B_min wins over the calibration; None clears it.
- :func:`reserve_min_by_link` and :func:`research_use_by_link`: what P3 and P1 read (one statement each).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from portal.control.link import commands
from portal.core.campus import IN_LIST_MAX
from portal.core.models import Link, LinkClassSample, LinkReserve, LinkScope, Node, ReserveSource
from portal.core.services.audit import audit
from scheduler.reserve import (
    RESERVE_QUANTILE,
    RESERVE_WINDOW_S,
    calibrate_reserve_bytes_per_s,
    research_shares,
)

SAMPLE_KEEP_S = RESERVE_WINDOW_S + 86400.0  # the window plus a day of slack for a late calibration
RESEARCH_USE_MAX_AGE_S = 120.0  # research use older than this is not "measured now"


class ReserveError(ValueError):
    """A bad override; ``field`` names the input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _fraction() -> float:
    return float(settings.RECLAIMNET["RESERVE_FRACTION"])


def _effective(link: Link, row: LinkReserve) -> tuple[float, str]:
    """What counts: the override, else the calibration, else β·B."""
    if row.override_bytes_per_s is not None:
        return float(row.override_bytes_per_s), ReserveSource.OVERRIDE
    if row.calibrated_bytes_per_s is not None and row.samples:
        return float(row.calibrated_bytes_per_s), ReserveSource.CALIBRATED
    return _fraction() * float(link.capacity_bytes_per_s), ReserveSource.DEFAULT


def calibrate_reserves(now: dt.datetime | None = None) -> dict[str, int]:
    """Recompute every link's calibrated B_min from the last 7 days of class samples and store it (design §4).

    A link with no samples in the window gets β·B (source ``default``); an admin's override still wins. Samples
    older than the window (plus a day) are deleted. Returns counts for the log."""
    now = now or timezone.now()
    since = now - dt.timedelta(seconds=RESERVE_WINDOW_S)
    links = {link.pk: link for link in Link.objects.all()}
    per_link: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
    for link_id, at, interval_s, research in (LinkClassSample.objects.filter(sampled_at__gt=since,
                                                                             sampled_at__lte=now)
                                              .values_list("link_id", "sampled_at", "interval_s", "research_bytes")
                                              .iterator(chunk_size=5000)):
        per_link[link_id].append(((at - now).total_seconds(), float(interval_s), float(research)))
    existing = {r.link_id: r for r in LinkReserve.objects.all()}
    before = {pk: r.reserve_bytes_per_s for pk, r in existing.items()}
    created, updated = [], []
    for pk, link in links.items():
        samples = per_link.get(pk, [])
        arr = np.array(samples, dtype=float).reshape(-1, 3)
        shares = research_shares(arr[:, 2], arr[:, 1], link.capacity_bytes_per_s)
        b_min, q = calibrate_reserve_bytes_per_s(link.capacity_bytes_per_s, shares, arr[:, 0], 0.0,
                                                 reserve_fraction=_fraction(), quantile=RESERVE_QUANTILE)
        row = existing.get(pk) or LinkReserve(link=link, reserve_bytes_per_s=b_min)
        row.calibrated_bytes_per_s, row.p95_share, row.samples, row.calibrated_at = b_min, q, len(samples), now
        row.reserve_bytes_per_s, row.source = _effective(link, row)
        (updated if row.pk else created).append(row)
    with transaction.atomic():
        LinkReserve.objects.bulk_create(created)
        LinkReserve.objects.bulk_update(updated, ["calibrated_bytes_per_s", "p95_share", "samples", "calibrated_at",
                                                  "reserve_bytes_per_s", "source", "updated_at"])
        pruned, _ = LinkClassSample.objects.filter(sampled_at__lt=now - dt.timedelta(seconds=SAMPLE_KEEP_S)).delete()
        changed = [r for r in created + updated if before.get(r.link_id) != r.reserve_bytes_per_s]
        tell_agents(changed)
    return {"links": len(links), "calibrated": sum(1 for r in created + updated if r.samples), "pruned": pruned}


def validate_override(link: Link, override_bytes_per_s: Any) -> float | None:
    """An override as given (None or "" clears it): a finite number of bytes/s in [β·B, B] — below β·B P3's own
    floor would win anyway, above B nothing is left. Raises :class:`ReserveError` naming the field."""
    value: float | None
    if override_bytes_per_s is None or override_bytes_per_s == "":
        value = None
    else:
        try:
            value = float(override_bytes_per_s)
        except (TypeError, ValueError):
            raise ReserveError("override_bytes_per_s", "a number of bytes per second, or empty") from None
        if isinstance(override_bytes_per_s, bool) or not math.isfinite(value):
            raise ReserveError("override_bytes_per_s", "a finite number of bytes per second")
        cap = float(link.capacity_bytes_per_s)
        if not _fraction() * cap * (1 - 1e-9) <= value <= cap:
            raise ReserveError("override_bytes_per_s",
                               f"between β·B = {_fraction() * cap:.0f} and the link's capacity {cap:.0f} bytes/s")
    return value


def set_reserve_override(actor: Any, link: Link, override_bytes_per_s: Any) -> LinkReserve:
    """An admin's B_min for ``link`` (None clears it and the calibration counts again), validated, audited."""
    value = validate_override(link, override_bytes_per_s)
    with transaction.atomic():
        row = (LinkReserve.objects.select_for_update().filter(link=link).first()
               or LinkReserve(link=link, reserve_bytes_per_s=_fraction() * float(link.capacity_bytes_per_s)))
        old = row.override_bytes_per_s
        row.override_bytes_per_s = value
        row.reserve_bytes_per_s, row.source = _effective(link, row)
        row.save()
        audit(actor, "link.reserve_override", link, old=old, new=value)
        tell_agents([row])
    return row


def tell_agents(rows: Sequence[LinkReserve]) -> int:
    """Send each node whose access link's reserve changed a ``set_reserve`` (its share of the link): the agent's
    research class keeps it and its checkpoint ceiling follows (design §4). Three statements; returns the count."""
    if not rows:
        return 0
    caps = dict(Link.objects.filter(pk__in=[r.link_id for r in rows]).values_list("pk", "capacity_bytes_per_s"))
    share = {r.link_id: r.reserve_bytes_per_s / float(caps[r.link_id]) for r in rows}
    nodes = Node.objects.filter(access_link_id__in=list(share)).values_list("pk", "access_link_id")
    orders = [(pk, "set_reserve", {"reserve_share": min(1.0, max(0.0, share[link]))}) for pk, link in nodes]
    commands.send_many(orders)
    return len(orders)


def reserve_min_by_link(link_pks: Sequence[int]) -> np.ndarray:
    """B_min per link for P3 (design §4): the stored reserve where there is one, else the global
    ``RESERVE_MIN_BYTES_PER_S``; P3 keeps max(β·B, B_min) as before. One statement (the whole table, one row
    per link at most, instead of a long IN list)."""
    stored = dict(rows_of_links(LinkReserve.objects, link_pks).values_list("link_id", "reserve_bytes_per_s"))
    default = float(settings.RECLAIMNET["RESERVE_MIN_BYTES_PER_S"])
    return np.array([max(default, float(stored[pk])) if pk in stored else default for pk in link_pks], dtype=float)


def rows_of_links(rows: Any, link_pks: Sequence[int]) -> Any:
    """``rows`` of the links ``link_pks`` — filtered by an IN list when it is short, else all of them (the
    caller looks its links up): compiling and binding hundreds of parameters costs more than the rows read."""
    return rows.filter(link_id__in=list(link_pks)) if len(link_pks) <= IN_LIST_MAX else rows.all()


def research_use_by_link(link_pks: Sequence[int], now: dt.datetime | None = None) -> dict[int, float]:
    """The newest measured research rate (bytes/s) per access link, summed over its reporting nodes, from class
    samples at most RESEARCH_USE_MAX_AGE_S old; links without a recent sample are absent (not measured). One
    statement: each (link, node)'s newest sample by a window, rank 1."""
    now = now or timezone.now()
    since = now - dt.timedelta(seconds=RESEARCH_USE_MAX_AGE_S)
    wanted = set(link_pks)
    newest = (rows_of_links(LinkClassSample.objects, link_pks).filter(scope=LinkScope.ACCESS, sampled_at__gt=since)
              .annotate(rank=Window(RowNumber(), partition_by=[F("link_id"), F("node_id")],
                                    order_by=F("sampled_at").desc()))
              .filter(rank=1).values_list("link_id", "research_bytes", "interval_s"))
    out: dict[int, float] = {}
    for link_id, research, interval_s in newest:
        if link_id in wanted:
            out[link_id] = out.get(link_id, 0.0) + research / interval_s
    return out


def reserve_rows() -> list[dict[str, Any]]:
    """Every link's reserve for the admin dashboard (links without a stored row show β·B, source default)."""
    stored = {r.link_id: r for r in LinkReserve.objects.all()}
    out = []
    for link in Link.objects.order_by("kind", "name"):
        row = stored.get(link.pk)
        cap = float(link.capacity_bytes_per_s)
        reserve = float(row.reserve_bytes_per_s) if row else _fraction() * cap
        out.append({"link": link, "capacity_bytes_per_s": cap, "reserve_bytes_per_s": reserve,
                    "reserve_share": reserve / cap, "source": row.source if row else ReserveSource.DEFAULT,
                    "p95_share": row.p95_share if row else None, "samples": row.samples if row else 0,
                    "calibrated_at": row.calibrated_at if row else None,
                    "override_bytes_per_s": row.override_bytes_per_s if row else None})
    return out
