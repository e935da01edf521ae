"""Owner activity and MIG on pages (design §1 "Owner activity and MIG"): ``{{ gpu|mig_summary }}``,
``{{ gpu|owner_use_summary }}`` for a GPU row, and ``{% owner_use_panel %}``, the admin dashboard's list of lent
GPUs the labs are using."""

from __future__ import annotations

from typing import Any

from django import template
from django.db.models import Q
from django.utils.translation import ngettext

from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Gpu

register = template.Library()

PANEL_ROWS = 50


@register.filter
def mig_summary(gpu: Any) -> str:
    """"MIG: 3 instances", "MIG on, no instances", "MIG off", or "" for a GPU without MIG (or not reported)."""
    mode = getattr(gpu, "mig_mode", "")
    if mode == "enabled":
        n = len(getattr(gpu, "mig_instances", None) or [])
        return ngettext("MIG: %(n)d instance", "MIG: %(n)d instances", n) % {"n": n} if n else "MIG on, no instances"
    return "MIG off" if mode == "disabled" else ""


@register.filter
def owner_use_summary(gpu: Any) -> str:
    """"in use by owner (2 processes, 5.1 GB)", or "" when no foreign process was reported."""
    count = int(getattr(gpu, "foreign_process_count", 0) or 0)
    if not count:
        return ""
    memory_gb = int(getattr(gpu, "foreign_memory_bytes", 0) or 0) / 1e9
    return ngettext("in use by owner (%(n)d process, %(gb).1f GB)", "in use by owner (%(n)d processes, %(gb).1f GB)",
                    count) % {"n": count, "gb": memory_gb}


@register.inclusion_tag("control/_owner_use_panel.html")
def owner_use_panel() -> dict[str, Any]:
    """GPUs of online nodes with foreign processes, and the MIG GPUs (one query)."""
    rows = list(Gpu.objects.filter(Q(foreign_process_count__gt=0) | Q(mig_mode="enabled"),
                                   node__state__in=[NodeState.ONLINE, NodeState.DRAINING])
                .select_related("node", "node__provider").order_by("-foreign_process_count", "node__name", "index")
                [:PANEL_ROWS])
    return {"rows": rows, "in_use": sum(1 for g in rows if g.foreign_process_count > 0)}
