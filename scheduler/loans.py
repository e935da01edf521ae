"""Loans: the idle watchdog and the loan timer, as pure decisions (design §15). No Django, no I/O.

Borrowed capacity is a loan. Each priority class publishes a :class:`LoanPolicy` (the ladder): the longest loan,
whether the idle watchdog may touch its jobs and after how long, the notice a job gets before it is released
and the grace it gets to write its final checkpoint. Every control tick asks :func:`decide` about each running
job, from what its heartbeats said (:class:`LoanView`):

- a job that showed no use — its GPUs below :data:`IDLE_UTIL_PCT` and, for a job that reports progress, no new
  step — for the class's idle limit is warned (``warn_idle``), and released at the end of the notice if it
  stayed idle (``release_idle``); any use meanwhile lifts the warning (``clear``);
- a job whose loan (the time it has held its GPUs since it was placed from the queue) reaches the class's
  maximum less the notice is warned (``warn_loan``) and released when the loan ends (``release_loan``), busy or
  not: the loan timer overrides an idle warning;
- a busy job, a class the watchdog never touches, a class with no loan limit: nothing.

The release itself (final checkpoint within the grace, forced at its end) is the caller's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

IDLE_UTIL_PCT = 5.0  # below this mean GPU utilisation (percent) a job's GPUs "show no use"
MAX_REPORT_GAP_S = 30.0  # a longer gap between two reports is time the job did not hold GPUs (moved, queued)


@dataclass(frozen=True)
class LoanPolicy:
    """One class's published terms (design §15)."""

    max_loan_s: float | None  # None: no limit
    idle_watch: bool  # False: the watchdog never touches the class
    idle_limit_s: float
    notice_s: float  # warning → release
    grace_s: float  # release → forced (the final checkpoint's deadline)


@dataclass(frozen=True)
class LoanView:
    """What the portal knows of one running job now."""

    held_s: float  # seconds of this loan it has held its GPUs
    idle_s: float | None  # seconds since it last showed use; None: not known yet (no report)
    warning: str = ""  # "", "idle" or "loan": the warning it is under
    release_in_s: float | None = None  # under a warning: seconds until the release is due (≤ 0: due)
    used_since_warning: bool = False  # under an idle warning: it showed use after it was warned


class Action(StrEnum):
    NOTHING = "nothing"
    WARN_IDLE = "warn_idle"
    WARN_LOAN = "warn_loan"
    CLEAR = "clear"  # lift an idle warning: the job showed use again (or the class is no longer watched)
    RELEASE_IDLE = "release_idle"
    RELEASE_LOAN = "release_loan"


@dataclass(frozen=True)
class Decision:
    action: Action
    release_in_s: float | None = None  # for a warning: when the release will be due, from now


def shows_use(util_pct: float | None, step: int, previous_step: int | None) -> bool:
    """Whether one report shows the job using its loan: its GPUs at or above IDLE_UTIL_PCT, or a step past the
    previous report's. A report without utilisation (an older agent) is never taken for idleness."""
    if util_pct is None or not math.isfinite(util_pct):
        return True
    if previous_step is not None and step > previous_step:
        return True
    return util_pct >= IDLE_UTIL_PCT


def held_between_reports_s(gap_s: float) -> float:
    """Seconds of holding that one report adds: the gap since the previous report of the same run, unless the
    gap is so long (over MAX_REPORT_GAP_S) that the job was not running meanwhile (a move, a queue, a pause)."""
    return gap_s if 0.0 < gap_s <= MAX_REPORT_GAP_S else 0.0


def loan_left_s(policy: LoanPolicy, held_s: float) -> float | None:
    """Seconds left on the loan (negative: overdue); None when the class has no loan limit."""
    return None if policy.max_loan_s is None else policy.max_loan_s - held_s


def decide(view: LoanView, policy: LoanPolicy) -> Decision:
    """What to do with one running job now (module docstring). A warning always gives at least the notice."""
    left = loan_left_s(policy, view.held_s)
    if view.warning == "loan":
        if left is None:
            return Decision(Action.CLEAR)  # the limit was lifted meanwhile
        due = view.release_in_s is not None and view.release_in_s <= 0
        return Decision(Action.RELEASE_LOAN) if due else Decision(Action.NOTHING)
    if left is not None and left <= policy.notice_s:
        return Decision(Action.WARN_LOAN, max(left, policy.notice_s))
    if view.warning == "idle":
        if not policy.idle_watch or view.used_since_warning:
            return Decision(Action.CLEAR)
        due = view.release_in_s is not None and view.release_in_s <= 0
        return Decision(Action.RELEASE_IDLE) if due else Decision(Action.NOTHING)
    if policy.idle_watch and view.idle_s is not None and view.idle_s >= policy.idle_limit_s:
        return Decision(Action.WARN_IDLE, policy.notice_s)
    return Decision(Action.NOTHING)
