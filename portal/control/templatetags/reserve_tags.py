"""``{% reserve_panel %}``: the admin dashboard's research reserve per link (design §4 "Calibrated reserve"): what
P3 keeps for research on each link, where it comes from (calibrated, override, default) and the link to override
it in the admin."""

from __future__ import annotations

from typing import Any

from django import template

from portal.control.reserve import reserve_rows

register = template.Library()

PANEL_ROWS = 100


@register.filter
def mbit(bytes_per_s: float | None) -> str:
    """Bytes/s as Mbit/s for people ("300 Mbit/s"); "—" for none."""
    if bytes_per_s is None:
        return "—"
    return f"{bytes_per_s * 8 / 1e6:,.0f} Mbit/s"


@register.inclusion_tag("control/_reserve_panel.html")
def reserve_panel() -> dict[str, Any]:
    """Every link's reserve (two statements)."""
    rows = reserve_rows()
    return {"rows": rows[:PANEL_ROWS], "more": max(0, len(rows) - PANEL_ROWS),
            "calibrated": sum(1 for r in rows if r["source"] == "calibrated"),
            "overridden": sum(1 for r in rows if r["source"] == "override")}
