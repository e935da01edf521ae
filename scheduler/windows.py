"""Lending windows, pure (design §9.13): when a node with weekly windows is lent.

A window is ``(weekday, start minute, end minute)`` in the campus's local time (``settings.TIME_ZONE``), weekday
0 = Monday; ``end <= start`` means it runs past midnight into the next day (``18:00–08:00``; ``end == start`` is
a whole day). A node with no windows is always lent. On a minute-of-the-week clock each window is the half-open
interval ``[day·1440 + start, … + length)``, possibly wrapping past Sunday midnight; windows that touch or overlap
make one stretch.

The campus read model (``portal.core.campus.load``: placement's feasibility), the window-end drain
(``portal.control.loop.windows``) and the explanation (``scheduler.explain``) all ask these functions, so
they cannot disagree about whether a node is lent now.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

__all__ = ["DAY_NAMES", "WEEK_MIN", "Window", "closes_in_s", "is_open", "local_clock", "next_window_opens_s",
           "window_text"]

Window = tuple[int, int, int]  # (weekday 0 = Monday, start minute of day, end minute of day; end <= start: overnight)
DAY_MIN = 1440
WEEK_MIN = 7 * DAY_MIN
DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def local_clock(local: dt.datetime) -> tuple[int, float]:
    """``(weekday, minute of the day with its fraction)`` of a local time (the arguments below take)."""
    return local.weekday(), local.hour * 60 + local.minute + (local.second + local.microsecond / 1e6) / 60


def _interval(window: Window) -> tuple[int, int]:
    day, start, end = window
    length = end - start if end > start else DAY_MIN - start + end
    return day * DAY_MIN + start, day * DAY_MIN + start + length


def _covering(windows: Sequence[Window], t: float) -> float | None:
    """The furthest end (minute of the week, may exceed the week) of the windows containing ``t``, else None."""
    ends = [e - s0 + (t - ((t - s0) % WEEK_MIN))
            for s0, e in map(_interval, windows) if (t - s0) % WEEK_MIN < e - s0]
    return max(ends) if ends else None


def _inside(window: Window, weekday: int, minute: float) -> bool:
    """``minute`` of ``weekday`` lies in ``window``."""
    start, end = _interval(window)
    return (weekday * DAY_MIN + minute - start) % WEEK_MIN < end - start


def is_open(windows: Sequence[Window], weekday: int, minute: float) -> bool:
    """The node is lent at ``minute`` of ``weekday``: it has no windows, or one of them is open."""
    return not windows or any(_inside(w, weekday, minute) for w in windows)


def next_window_opens_s(windows: Sequence[Window], weekday: int, minute: float) -> float | None:
    """Seconds until the next of ``windows`` opens, seen at ``weekday`` and ``minute`` of the day (local time);
    None when the node has no windows (always lent) or one is open now."""
    if is_open(windows, weekday, minute):
        return None
    now = weekday * DAY_MIN + minute
    return min(((day * DAY_MIN + start - now) % WEEK_MIN) * 60.0 for day, start, _ in windows)


def closes_in_s(windows: Sequence[Window], weekday: int, minute: float) -> float | None:
    """Seconds until the open stretch the node is in ends (touching windows are one stretch); None when it has
    no windows or its windows cover the whole week (never closes); 0 when it is outside every window now."""
    if not windows:
        return None
    now = weekday * DAY_MIN + minute
    end = _covering(windows, now)
    if end is None:
        return 0.0
    while end - now < WEEK_MIN:
        further = _covering(windows, end)
        if further is None or further <= end:
            return (end - now) * 60.0
        end = further
    return None


def _days(days: Sequence[int]) -> str:
    days = sorted(set(days))
    if len(days) == 7:
        return "daily"
    if days == [0, 1, 2, 3, 4]:
        return "on weekdays"
    if days == [5, 6]:
        return "at weekends"
    return "on " + ", ".join(DAY_NAMES[d] for d in days)


def window_text(windows: Sequence[Window]) -> str:
    """``18:00–08:00 daily``, ``09:00–17:00 on Sat, Sun``; "" without windows."""
    by_time: dict[tuple[int, int], list[int]] = {}
    for day, start, end in windows:
        by_time.setdefault((start, end), []).append(day)
    return "; ".join(f"{start // 60:02d}:{start % 60:02d}–{end // 60:02d}:{end % 60:02d} {_days(days)}"
                     for (start, end), days in sorted(by_time.items()))
