"""Formatting filters for the pages (units people read: GB, Mbit/s, "3 min ago") and the role-aware nav."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from portal.web.access import is_admin, is_provider_member, is_researcher

register = template.Library()


@register.filter
def human_bytes(value: float | int | None) -> str:
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


@register.filter
def mbit(value: float | None) -> str:
    """Bytes per second as Mbit/s."""
    return "—" if value is None else f"{value * 8 / 1e6:,.0f} Mbit/s"


@register.filter
def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    s = float(seconds)
    if s < 60:
        return f"{s:.1f} s" if s < 10 and s != int(s) else f"{s:.0f} s"
    if s < 3600:
        minutes, rest = divmod(round(s), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(round(s / 60), 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


@register.filter
def age(when: datetime | None) -> str:
    if when is None:
        return "never"
    seconds = (timezone.now() - when).total_seconds()
    return "just now" if seconds < 1 else duration(seconds) + " ago"  # not "0.0 s ago"


@register.filter
def percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f}%"


SECTIONS = {
    "dashboard": "dashboard",
    "provider-home": "nodes",
    "node-register": "nodes",
    "node-detail": "nodes",
    "reclaim-dialog": "nodes",
    "reclaim-history": "reclaims",
    "job-list": "jobs",
    "job-detail": "jobs",
    "job-submit": "submit",
}


@register.simple_tag
def nav_roles(request: Any) -> dict[str, Any]:
    """Which sections the navigation shows for this user, and which one the page belongs to."""
    user = request.user
    if not user.is_authenticated:
        return {}
    match = getattr(request, "resolver_match", None)
    return {
        "admin": is_admin(user),
        "provider": is_provider_member(user),
        "researcher": is_researcher(user),
        "current": SECTIONS.get(match.url_name if match else "", ""),
    }


@register.simple_tag
def submit_token() -> SafeString:
    """A one-time token for a POST form (``portal.web.views.common.submit_once``): a double submit or a
    browser retry of this form does its work once."""
    return format_html('<input type="hidden" name="submit_token" value="{}">', secrets.token_urlsafe(18))
