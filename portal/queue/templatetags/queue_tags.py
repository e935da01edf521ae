"""``{% fair_share_panel %}``: the admin dashboard's fair-share panel (design §16.6)."""

from __future__ import annotations

from typing import Any

from django import template

from portal.queue.dashboard import fair_share_rows

register = template.Library()


@register.inclusion_tag("queue/_fair_share.html")
def fair_share_panel() -> dict[str, Any]:
    return fair_share_rows()
