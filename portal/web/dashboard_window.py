"""The admin dashboard's time range (docs/design.md §9.1): the last 24 hours, 7 days, 30 days or a custom range
of days, parsed from the query string with the field named on bad input, and its buckets (by hour up to two
days, by six hours up to ten, else by day). ``portal.web.dashboard`` re-exports these names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_date

HOUR = timedelta(hours=1)

PRESETS: dict[str, tuple[timedelta, str]] = {
    "24h": (timedelta(hours=24), "the last 24 hours"),
    "7d": (timedelta(days=7), "the last 7 days"),
    "30d": (timedelta(days=30), "the last 30 days"),
}
DEFAULT_RANGE = "7d"
MAX_RANGE_DAYS = 90
DATE_HELP = "use the form YYYY-MM-DD, e.g. 2025-03-01"


class WindowError(ValueError):
    """Query parameters that name no range the dashboard can show: ``errors`` is {field: what to do}."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


@dataclass(frozen=True)
class Window:
    """The range every number of one dashboard view covers: [since, until)."""

    key: str  # a PRESETS key or "custom"
    since: datetime
    until: datetime
    label: str
    from_date: date | None = None
    to_date: date | None = None
    live: bool = True  # it ends now (the read model's "now" numbers close it)
    _memo: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def query(self) -> str:
        """The URL query naming this range ("" for the default): what the page, its fragment, its chart data and
        its CSV links carry, so a bookmarked URL shows the same range."""
        if self.key == "custom":
            return f"range=custom&from={self.from_date}&to={self.to_date}"
        return "" if self.key == DEFAULT_RANGE else f"range={self.key}"

    @property
    def cache_id(self) -> str:
        return self.key if self.key != "custom" else f"custom:{self.from_date}:{self.to_date}"

    @property
    def step(self) -> timedelta:
        span = self.until - self.since
        if span <= timedelta(days=2):
            return HOUR
        return timedelta(hours=6) if span <= timedelta(days=10) else timedelta(days=1)

    def buckets(self) -> tuple[list[datetime], list[datetime]]:
        """(label times, edges): period i is [edges[i], edges[i+1]), labelled by the step boundary it starts
        at (the first one may start before ``since``; only its part inside the range is counted)."""
        step = self.step
        local = timezone.localtime(self.since)
        if step == timedelta(days=1):
            first = local.replace(hour=0, minute=0, second=0, microsecond=0)
        else:
            first = local.replace(hour=local.hour - local.hour % int(step / HOUR), minute=0, second=0,
                                  microsecond=0)
        labels, edges, t = [first], [self.since], first + step
        while t < self.until:
            labels.append(t)
            edges.append(t)
            t += step
        edges.append(self.until)
        return labels, edges

    def hours(self) -> list[datetime]:
        """Edges of the range's hours: ``since``, every hour boundary inside, ``until``."""
        edges, t = [self.since], self.since.replace(minute=0, second=0, microsecond=0) + HOUR
        while t < self.until:
            edges.append(t)
            t += HOUR
        edges.append(self.until)
        return edges


def _preset(key: str, now: datetime) -> Window:
    span, label = PRESETS[key]
    return Window(key, now - span, now, label)


def default_window(now: datetime | None = None) -> Window:
    return _preset(DEFAULT_RANGE, now or timezone.now())


def _day(value: str, name: str, errors: dict[str, str]) -> date | None:
    value = value.strip()
    if not value:
        return None
    try:
        parsed = parse_date(value)
    except ValueError:
        parsed = None
    if parsed is None:
        errors[name] = f"“{value[:40]}” is not a date: {DATE_HELP}."
    return parsed


def parse_window(params: Mapping[str, str], now: datetime | None = None) -> Window:
    """The range ``params`` name (``range`` = 24h, 7d, 30d or custom with ``from`` and ``to`` days, both
    included; ``from``/``to`` alone mean custom); the default (the last 7 days) when they name none.
    Raises :class:`WindowError` naming the field for an unknown range, a bad date, a start after the end or in
    the future, or a range longer than ``MAX_RANGE_DAYS``."""
    now = now or timezone.now()
    key = (params.get("range") or "").strip()
    from_s, to_s = params.get("from") or "", params.get("to") or ""
    if not key:
        key = "custom" if (from_s.strip() or to_s.strip()) else DEFAULT_RANGE
    if key in PRESETS:
        return _preset(key, now)
    if key != "custom":
        raise WindowError({"range": "Choose 24 hours, 7 days, 30 days or a custom range."})
    errors: dict[str, str] = {}
    first, last = _day(from_s, "from", errors), _day(to_s, "to", errors)
    today = timezone.localdate(now)
    if first is None and "from" not in errors:
        errors["from"] = f"Give the first day of the range ({DATE_HELP})."
    if errors:
        raise WindowError(errors)
    assert first is not None
    last = last or today
    if first > last:
        raise WindowError({"from": f"The range starts ({first:%d %b %Y}) after it ends ({last:%d %b %Y}): pick a "
                                   "start on or before the end."})
    if first > today:
        raise WindowError({"from": f"The range starts in the future ({first:%d %b %Y}): there is no data yet. "
                                   "Pick a start on or before today."})
    days = (last - first).days + 1
    if days > MAX_RANGE_DAYS:
        raise WindowError({"to": f"The range is {days} days; the dashboard shows at most {MAX_RANGE_DAYS}. Pick a "
                                 "shorter range."})
    tz = timezone.get_current_timezone()
    since = datetime(first.year, first.month, first.day, tzinfo=tz)
    end = last + timedelta(days=1)
    until = min(now, datetime(end.year, end.month, end.day, tzinfo=tz))
    label = f"{first:%d %b %Y}" if first == last else f"{first:%d %b %Y} to {last:%d %b %Y}"
    return Window("custom", since, until, label, first, last, live=until == now)
