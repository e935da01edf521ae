"""Store the heartbeats' bytes per traffic class as per-link, per-class samples (design §4 "Calibrated reserve");
``class_bytes`` was checked at the boundary by :mod:`portal.control.link.class_bytes`."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db.models import Max

from portal.control.link.class_bytes import MAX_SOURCE_CHARS
from portal.core.models import Link, LinkClassSample, LinkScope

DEFAULT_SAMPLE_PERIOD_S = 60.0  # one stored sample per node and scope per minute (design §9.8 bounded tables)


def sample_class_bytes(beats: list[Any], access_of: dict[int, int | None]) -> int:
    """Store one class sample per node and scope per sampling period (the newest heartbeat's delta), on the
    node's access link and, for ``trunk``, on the uplink of its building switch. Returns the rows written."""
    reports = [(h, h.msg["class_bytes"]) for h in beats
               if isinstance(h.msg.get("class_bytes"), dict) and access_of.get(h.node_id)]
    if not reports:
        return 0
    period = dt.timedelta(seconds=float(settings.RECLAIMNET.get("CLASS_SAMPLE_PERIOD_S", DEFAULT_SAMPLE_PERIOD_S)))
    nodes = {h.node_id for h, _ in reports}
    last = {(n, s): t for n, s, t in LinkClassSample.objects.filter(node_id__in=nodes).values("node_id", "scope")
            .annotate(last=Max("sampled_at")).values_list("node_id", "scope", "last")}
    trunk_of: dict[int, int] = {}
    if any("trunk" in cb for _, cb in reports):
        access_links = {access_of[h.node_id] for h, cb in reports if "trunk" in cb}
        upper = dict(Link.objects.filter(pk__in=access_links).values_list("pk", "upper_id"))
        uplink = dict(Link.objects.filter(lower_switch_id__in=set(upper.values())).values_list("lower_switch_id",
                                                                                              "pk"))
        trunk_of = {a: uplink[u] for a, u in upper.items() if u in uplink}
    rows = []
    for h, cb in reports:
        access = access_of[h.node_id]
        for scope, link in ((LinkScope.ACCESS, access), (LinkScope.TRUNK, trunk_of.get(access))):
            counts = cb.get(scope.value)
            if link is None or counts is None:
                continue
            seen = last.get((h.node_id, scope.value))
            if seen is not None and h.received_at - seen < period:
                continue
            rows.append(LinkClassSample(
                link_id=link, node_id=h.node_id, scope=scope, sampled_at=h.received_at,
                interval_s=float(cb["interval_s"]), research_bytes=counts.get("research", 0),
                checkpoint_bytes=counts.get("checkpoint", 0), other_bytes=counts.get("other", 0),
                source=str(cb.get("source", ""))[:MAX_SOURCE_CHARS]))
    LinkClassSample.objects.bulk_create(rows)
    return len(rows)
