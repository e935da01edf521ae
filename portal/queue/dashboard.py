"""The admin dashboard's fair-share panel (design §16.6): each group's share, decayed usage, fair-share factor,
GPUs held now and quota use, from the same reading the placement pass uses (five statements)."""

from __future__ import annotations

from typing import Any

from django.db.models import Sum
from django.utils import timezone

from portal.core.lifecycle.jobs import TERMINAL
from portal.core.models import Placement
from portal.queue.models import FairShareConfig
from portal.queue.standing import group_standing


def fair_share_rows() -> dict[str, Any]:
    config = FairShareConfig.current()
    standing = group_standing(timezone.now(), config)
    held = dict(Placement.objects.filter(ended_at__isnull=True).exclude(job__state__in=TERMINAL)
                .values("job__group_id").annotate(n=Sum("job__gpu_count")).values_list("job__group_id", "n"))
    total_share = float(standing.shares.sum()) or 1.0
    total_usage = float(standing.usage_gpu_s.sum())
    rows = []
    for pk, i in standing.index.items():
        cap, hours = float(standing.max_gpus[i]), float(standing.max_gpu_s_30d[i]) / 3600.0
        rows.append({
            "group": standing.names[i],
            "share_pct": 100.0 * float(standing.shares[i]) / total_share,
            "usage_pct": 100.0 * float(standing.usage_gpu_s[i]) / total_usage if total_usage > 0 else 0.0,
            "usage_gpu_h": float(standing.usage_gpu_s[i]) / 3600.0,
            "factor": float(standing.factor[i]),
            "held_gpus": int(held.get(pk, 0) or 0),
            "max_gpus": None if cap == float("inf") else int(cap),
            "used_30d_gpu_h": float(standing.used_30d_gpu_s[i]) / 3600.0,
            "max_gpu_h_30d": None if hours == float("inf") else hours,
        })
    return {"rows": rows, "half_life_h": config.half_life_s / 3600.0}
