"""Formatting filters for the pages (units people read: GB, Mbit/s, "3 min ago") and the role-aware nav."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from portal.core.lifecycle.labels import degraded_reason_words
from portal.web.access import page_roles

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
    roles = page_roles(request)  # read once per request, however many times a page asks
    return {
        "admin": roles.admin,
        "provider": roles.provider,
        "researcher": roles.researcher,
        "current": SECTIONS.get(match.url_name if match else "", ""),
    }


@register.simple_tag
def submit_token() -> SafeString:
    """A one-time token for a POST form (``portal.web.views.common.submit_once``): a double submit or a
    browser retry of this form does its work once."""
    return format_html('<input type="hidden" name="submit_token" value="{}">', secrets.token_urlsafe(18))


@register.filter
def ago(when: datetime | None) -> str:
    """``age`` as ``<time datetime="ISO" data-age-s="…">3 min ago</time>``: frontend/src/times.js re-renders
    it every ~15 s in the same words, so a live page's relative times keep moving (hover: the exact time)."""
    if when is None:
        return "never"
    seconds = max(0.0, (timezone.now() - when).total_seconds())
    exact = timezone.localtime(when).strftime("%Y-%m-%d %H:%M:%S")
    return format_html('<time datetime="{}" data-age-s="{}" title="{}">{}</time>',
                       when.isoformat(), f"{seconds:.3f}", exact, age(when))


WEEKDAY_ABBR = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
DAY_SETS = {frozenset(range(7)): "every day", frozenset(range(5)): "weekdays", frozenset({5, 6}): "weekends"}


def _days(days: set[int]) -> str:
    """{0,1,2,3,4} → "weekdays"; {0,1,2,4} → "Mon–Wed, Fri"."""
    named = DAY_SETS.get(frozenset(days))
    if named:
        return named
    runs: list[list[int]] = []
    for day in sorted(days):
        if runs and day == runs[-1][-1] + 1:
            runs[-1].append(day)
        else:
            runs.append([day])
    return ", ".join(WEEKDAY_ABBR[r[0]] if len(r) == 1 else
                     f"{WEEKDAY_ABBR[r[0]]}{', ' if len(r) == 2 else '–'}{WEEKDAY_ABBR[r[-1]]}" for r in runs)


@register.filter
def lending_summary(windows: Any) -> str:
    """A node's weekly lending windows in a few words: "weekdays 18:00–08:00", "Sat 10:00–14:00; …", or
    "always" when it has none (lent whenever it is online, design §1)."""
    by_hours: dict[tuple[Any, Any], set[int]] = {}
    for w in windows or ():
        by_hours.setdefault((w.start_time, w.end_time), set()).add(int(w.weekday))
    if not by_hours:
        return "always"
    parts = sorted(by_hours.items(), key=lambda item: (min(item[1]), item[0][0]))
    return "; ".join(f"{_days(days)} {start:%H:%M}–{end:%H:%M}" for (start, end), days in parts)


@register.filter
def degraded_reason(reason: str | None) -> str:
    """Why a migration resumed from an earlier checkpoint, in plain words (never the stored value)."""
    return degraded_reason_words(reason)


@register.filter
def copies(checkpoint: Any, holders: Any = None) -> str:
    """Where a checkpoint was copied, truthfully: the nodes holding a copy now, copies made and since dropped
    (a newer copy replaces the older one there), a copy in flight, a failed one, or none at all.

    ``holders`` (the checkpoint's ``replica_nodes``, prefetched by the caller) saves a query; its transfers are
    read from ``checkpoint.transfers`` (prefetch ``transfers__destination`` to save one more)."""
    holders = list(checkpoint.replica_nodes.all() if holders is None else holders)
    return copies_words({n.pk: n.name for n in holders},
                        [(t.state, t.destination_id, t.destination.name) for t in checkpoint.transfers.all()])


def copies_words(holders: dict[int, str], transfers: list[tuple[str, int, str]]) -> str:
    """:func:`copies` from plain rows: the nodes holding a copy now ({pk: name}) and the checkpoint's transfers
    as (state, destination pk, destination name) — what the job timeline reads for many checkpoints at once."""
    held = set(holders)
    dropped = sorted({name for state, dest, name in transfers if state == "received" and dest not in held})
    flying = sorted({name for state, dest, name in transfers if state == "issued" and dest not in held})
    failed = sorted({name for state, _, name in transfers if state == "failed"} - set(dropped) - set(flying)
                    - set(holders.values()))
    parts = []
    if holders:
        parts.append("copied to " + ", ".join(sorted(holders.values())))
    if dropped:
        parts.append("was copied to " + ", ".join(dropped) + " (that copy has since been dropped)")
    if flying:
        parts.append("being copied to " + ", ".join(flying))
    if failed and not parts:
        parts.append("copy to " + ", ".join(failed) + " failed")
    return "; ".join(parts) or "not copied to another node"
