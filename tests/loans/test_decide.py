"""The pure loan decisions (scheduler/loans.py, design §15): what counts as use, how holding time accrues, and
warn → release → nothing for the idle watchdog and the loan timer."""

from __future__ import annotations

import pytest

from scheduler.loans import (
    IDLE_UTIL_PCT,
    MAX_REPORT_GAP_S,
    Action,
    LoanPolicy,
    LoanView,
    decide,
    held_between_reports_s,
    loan_left_s,
    shows_use,
)

INTERACTIVE = LoanPolicy(max_loan_s=8 * 3600.0, idle_watch=True, idle_limit_s=1800.0, notice_s=600.0, grace_s=120.0)
NEVER = LoanPolicy(max_loan_s=None, idle_watch=False, idle_limit_s=1800.0, notice_s=600.0, grace_s=120.0)


def test_a_gpu_below_the_threshold_with_no_new_step_shows_no_use() -> None:
    assert not shows_use(IDLE_UTIL_PCT - 0.1, step=10, previous_step=10)
    assert shows_use(IDLE_UTIL_PCT, step=10, previous_step=10)


def test_a_new_step_is_use_though_the_gpu_is_quiet() -> None:
    assert shows_use(0.0, step=11, previous_step=10)


def test_a_report_without_utilisation_is_never_taken_for_idleness() -> None:
    assert shows_use(None, step=10, previous_step=10)
    assert shows_use(float("nan"), step=10, previous_step=10)


def test_holding_time_is_the_gap_between_reports_unless_the_job_was_not_running() -> None:
    assert held_between_reports_s(2.0) == 2.0
    assert held_between_reports_s(MAX_REPORT_GAP_S) == MAX_REPORT_GAP_S
    assert held_between_reports_s(MAX_REPORT_GAP_S + 1) == 0.0  # moved, queued or paused meanwhile
    assert held_between_reports_s(-1.0) == 0.0


def test_loan_left_is_none_without_a_limit() -> None:
    assert loan_left_s(NEVER, 1e9) is None
    assert loan_left_s(INTERACTIVE, 3600.0) == 7 * 3600.0


def test_an_idle_job_is_warned_at_the_idle_limit_with_the_notice() -> None:
    assert decide(LoanView(held_s=1900, idle_s=1799.0), INTERACTIVE).action == Action.NOTHING
    decision = decide(LoanView(held_s=1900, idle_s=1800.0), INTERACTIVE)
    assert decision.action == Action.WARN_IDLE and decision.release_in_s == 600.0


def test_a_warned_idle_job_is_released_when_the_notice_ends_and_not_before() -> None:
    warned = LoanView(held_s=2500, idle_s=2400.0, warning="idle", release_in_s=1.0)
    assert decide(warned, INTERACTIVE).action == Action.NOTHING
    due = LoanView(held_s=2500, idle_s=2400.0, warning="idle", release_in_s=0.0)
    assert decide(due, INTERACTIVE).action == Action.RELEASE_IDLE


def test_use_during_the_warning_lifts_it() -> None:
    used = LoanView(held_s=2500, idle_s=5.0, warning="idle", release_in_s=0.0, used_since_warning=True)
    assert decide(used, INTERACTIVE).action == Action.CLEAR


def test_a_busy_job_is_never_touched() -> None:
    for held_s in (0.0, 3600.0, 7 * 3600.0):
        assert decide(LoanView(held_s=held_s, idle_s=0.0), INTERACTIVE).action == Action.NOTHING


def test_a_class_the_watchdog_never_touches_is_never_warned_for_idling() -> None:
    assert decide(LoanView(held_s=1e6, idle_s=1e6), NEVER).action == Action.NOTHING
    # a warning from before the policy changed is lifted
    assert decide(LoanView(held_s=1e6, idle_s=1e6, warning="idle", release_in_s=-5), NEVER).action == Action.CLEAR


def test_the_loan_timer_warns_a_notice_before_the_loan_ends_and_releases_at_its_end_busy_or_not() -> None:
    before = decide(LoanView(held_s=8 * 3600 - 601, idle_s=0.0), INTERACTIVE)
    assert before.action == Action.NOTHING
    warn = decide(LoanView(held_s=8 * 3600 - 600, idle_s=0.0), INTERACTIVE)
    assert warn.action == Action.WARN_LOAN and warn.release_in_s == 600.0
    due = LoanView(held_s=8 * 3600, idle_s=0.0, warning="loan", release_in_s=0.0)
    assert decide(due, INTERACTIVE).action == Action.RELEASE_LOAN


def test_a_job_already_past_its_loan_still_gets_the_whole_notice() -> None:
    decision = decide(LoanView(held_s=10 * 3600, idle_s=0.0), INTERACTIVE)
    assert decision.action == Action.WARN_LOAN and decision.release_in_s == pytest.approx(600.0)


def test_the_loan_ending_overrides_an_idle_warning() -> None:
    view = LoanView(held_s=8 * 3600 - 100, idle_s=4000.0, warning="idle", release_in_s=300.0)
    assert decide(view, INTERACTIVE).action == Action.WARN_LOAN


def test_a_loan_warning_is_lifted_when_the_limit_is_removed() -> None:
    view = LoanView(held_s=1e6, idle_s=0.0, warning="loan", release_in_s=-1.0)
    assert decide(view, NEVER).action == Action.CLEAR
