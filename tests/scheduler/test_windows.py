"""Lending-window arithmetic (design §9.13, ``scheduler.windows``): crossing midnight, weekday boundaries, the
next opening and the end of the open stretch, checked against a minute-by-minute brute force."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from scheduler import explain
from scheduler.windows import WEEK_MIN, closes_in_s, is_open, local_clock, next_window_opens_s, window_text

MON, TUE, WED, SUN = 0, 1, 2, 6
H = 60  # minutes per hour


def _brute_week(windows: list[tuple[int, int, int]]) -> list[bool]:
    """Each minute of the week: in a window or not, by listing every minute each window covers."""
    week = [not windows] * WEEK_MIN
    for day, start, end in windows:
        length = end - start if end > start else 1440 - start + end
        for k in range(length):
            week[(day * 1440 + start + k) % WEEK_MIN] = True
    return week


def test_an_overnight_window_is_open_after_its_start_and_on_the_next_morning_only() -> None:
    night = [(MON, 18 * H, 8 * H)]  # Monday 18:00 – Tuesday 08:00
    assert is_open(night, MON, 18 * H) and is_open(night, MON, 23 * H + 59.5)
    assert is_open(night, TUE, 0) and is_open(night, TUE, 8 * H - 0.01)
    assert not is_open(night, TUE, 8 * H)  # the end is excluded
    assert not is_open(night, MON, 17 * H + 59) and not is_open(night, MON, 7 * H)  # Monday morning: Sunday's
    assert not is_open(night, TUE, 18 * H)  # only Monday's night was given


def test_a_sunday_night_window_runs_into_monday_across_the_week_boundary() -> None:
    sunday = [(SUN, 22 * H, 6 * H)]
    assert is_open(sunday, SUN, 23 * H) and is_open(sunday, MON, 5 * H)
    assert not is_open(sunday, MON, 6 * H)
    assert closes_in_s(sunday, SUN, 23 * H) == pytest.approx(7 * 3600)
    assert next_window_opens_s(sunday, MON, 6 * H) == pytest.approx((6 * 24 + 16) * 3600)


def test_no_windows_means_always_lent_and_never_closing() -> None:
    assert is_open([], WED, 3 * H)
    assert next_window_opens_s([], WED, 3 * H) is None and closes_in_s([], WED, 3 * H) is None


def test_the_next_opening_is_the_soonest_start_ahead_and_none_while_open() -> None:
    weekdays = [(d, 18 * H, 8 * H) for d in range(5)]
    assert next_window_opens_s(weekdays, WED, 15 * H) == pytest.approx(3 * 3600)
    assert next_window_opens_s(weekdays, WED, 20 * H) is None
    # Saturday 08:00 after Friday's night: the next one is Monday 18:00.
    assert next_window_opens_s(weekdays, 5, 8 * H) == pytest.approx((2 * 24 + 10) * 3600)


def test_touching_windows_close_once_at_the_end_of_the_whole_stretch() -> None:
    weekend = [(5, 0, 0), (6, 0, 0)]  # a whole Saturday and a whole Sunday
    assert closes_in_s(weekend, 5, 12 * H) == pytest.approx((12 + 24) * 3600)
    chained = [(MON, 18 * H, 0), (TUE, 0, 8 * H)]  # 18:00–24:00 then 00:00–08:00
    assert closes_in_s(chained, MON, 20 * H) == pytest.approx(12 * 3600)
    assert closes_in_s(chained, TUE, 9 * H) == 0.0  # outside: already closed
    every_day = [(d, 0, 0) for d in range(7)]
    assert closes_in_s(every_day, WED, 5 * H) is None  # covers the week: never closes


def test_the_local_clock_counts_seconds_as_fractions_of_a_minute() -> None:
    weekday, minute = local_clock(dt.datetime(2026, 12, 2, 17, 59, 30))  # a Wednesday
    assert weekday == WED and minute == pytest.approx(17 * H + 59.5)


def test_window_words_group_days_sharing_a_time() -> None:
    assert window_text([(d, 18 * H, 8 * H) for d in range(5)]) == "18:00–08:00 on weekdays"
    assert window_text([(5, 9 * H, 17 * H), (6, 9 * H, 17 * H)]) == "09:00–17:00 at weekends"
    assert window_text([]) == ""


def test_the_explanation_keeps_importing_the_window_helpers() -> None:
    assert explain.next_window_opens_s is next_window_opens_s and explain.window_text is window_text


@pytest.mark.parametrize("seed", range(4))
def test_open_next_opening_and_closing_agree_with_a_minute_by_minute_walk(seed: int) -> None:
    rng = random.Random(seed)
    windows = [(rng.randrange(7), rng.randrange(0, 1440, 30), rng.randrange(0, 1440, 30))
               for _ in range(rng.randint(1, 4))]
    week = _brute_week(windows)

    def brute_open(t: int) -> bool:
        return week[t % WEEK_MIN]

    for _ in range(60):
        t = rng.randrange(WEEK_MIN)
        weekday, minute = divmod(t, 1440)
        now_open = brute_open(t)
        assert is_open(windows, weekday, minute) is now_open
        opens = next_window_opens_s(windows, weekday, minute)
        closes = closes_in_s(windows, weekday, minute)
        if now_open:
            assert opens is None
            if closes is not None:
                k = round(closes / 60)
                assert k > 0 and all(brute_open(t + j) for j in range(k))
                assert not brute_open(t + k)
        else:
            assert closes == 0.0
            k = round(opens / 60)
            assert k > 0 and not any(brute_open(t + j) for j in range(k))
            assert brute_open(t + k)
