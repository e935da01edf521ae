"""The ladder (design §15): each priority class's published terms, read through one function.

:func:`class_policies` is the only reader of ``ClassPolicy``: the control tick, the job form, the submit checks,
the ladder page and ``GET /api/ladder/`` all ask it, so they never disagree. It reads the table once per
:data:`CACHE_S` per process (one statement); saving a policy clears this process's copy, and every other
process picks the change up within CACHE_S. A class with no row (a table emptied by hand) gets its published
default, never an error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models.signals import post_delete, post_save

from portal.control.models import ClassPolicy, LoanEnd
from portal.core.models import PriorityClass
from scheduler.loans import IDLE_UTIL_PCT, LoanPolicy

CACHE_S = 5.0

# What the migration seeds, for a class whose row is missing.
DEFAULTS: dict[str, dict[str, Any]] = {
    PriorityClass.INTERACTIVE: {"rank": 0, "summary": "Notebooks and debugging sessions: a person at the keyboard.",
                                "max_gpus_per_job": 2, "max_loan_s": 8 * 3600.0, "loan_end": LoanEnd.SUSPEND,
                                "idle_watch": True, "idle_limit_s": 1800.0, "notice_s": 600.0, "grace_s": 120.0},
    PriorityClass.STANDARD: {"rank": 1, "summary": "Training runs that checkpoint and report their progress.",
                             "max_gpus_per_job": 8, "max_loan_s": 72 * 3600.0, "loan_end": LoanEnd.REQUEUE,
                             "idle_watch": True, "idle_limit_s": 7200.0, "notice_s": 900.0, "grace_s": 300.0},
    PriorityClass.BEST_EFFORT: {"rank": 2,
                                "summary": "Sweeps and scavenger work: placed last, on GPUs nobody else asked for.",
                                "max_gpus_per_job": None, "max_loan_s": 24 * 3600.0, "loan_end": LoanEnd.REQUEUE,
                                "idle_watch": False, "idle_limit_s": 3600.0, "notice_s": 300.0, "grace_s": 120.0},
}


@dataclass(frozen=True)
class ClassTerms:
    """One rung of the ladder, as published."""

    priority_class: str
    label: str
    rank: int
    summary: str
    max_gpus_per_job: int | None
    max_loan_s: float | None
    loan_end: str
    idle_watch: bool
    idle_limit_s: float
    notice_s: float
    grace_s: float

    @property
    def policy(self) -> LoanPolicy:
        return LoanPolicy(max_loan_s=self.max_loan_s, idle_watch=self.idle_watch, idle_limit_s=self.idle_limit_s,
                          notice_s=self.notice_s, grace_s=self.grace_s)

    def as_dict(self) -> dict[str, Any]:
        return {"priority_class": self.priority_class, "label": self.label, "rank": self.rank,
                "summary": self.summary, "max_gpus_per_job": self.max_gpus_per_job, "max_loan_s": self.max_loan_s,
                "loan_end": self.loan_end, "idle_watch": self.idle_watch,
                "idle_limit_s": self.idle_limit_s if self.idle_watch else None, "notice_s": self.notice_s,
                "grace_s": self.grace_s}


_lock = threading.Lock()
_cache: list[tuple[float, dict[str, ClassTerms]]] = []


def _terms(priority_class: str, values: dict[str, Any]) -> ClassTerms:
    return ClassTerms(priority_class=str(priority_class), label=PriorityClass(priority_class).label,
                      rank=int(values["rank"]), summary=str(values["summary"]),
                      max_gpus_per_job=values["max_gpus_per_job"], max_loan_s=values["max_loan_s"],
                      loan_end=str(values["loan_end"]), idle_watch=bool(values["idle_watch"]),
                      idle_limit_s=float(values["idle_limit_s"]), notice_s=float(values["notice_s"]),
                      grace_s=float(values["grace_s"]))


def class_policies(fresh: bool = False) -> dict[str, ClassTerms]:
    """Priority class → its terms, in ladder order (rank, then name). One statement per CACHE_S per process;
    ``fresh``: read now (the control tick reads once per tick, so its statement count never depends on the
    cache)."""
    now = time.monotonic()
    with _lock:
        if not fresh and _cache and now - _cache[0][0] < CACHE_S:
            return _cache[0][1]
    fields = ["rank", "summary", "max_gpus_per_job", "max_loan_s", "loan_end", "idle_watch", "idle_limit_s",
              "notice_s", "grace_s"]
    rows = {r["priority_class"]: r for r in ClassPolicy.objects.values("priority_class", *fields)}
    terms = [_terms(pc, rows.get(pc, DEFAULTS[pc])) for pc in PriorityClass.values]
    ordered = {t.priority_class: t for t in sorted(terms, key=lambda t: (t.rank, t.priority_class))}
    with _lock:
        _cache[:] = [(now, ordered)]
    return ordered


def terms_of(priority_class: str) -> ClassTerms:
    policies = class_policies()
    return policies.get(priority_class) or policies[PriorityClass.STANDARD]


def clear_cache(**_: Any) -> None:
    with _lock:
        _cache.clear()


post_save.connect(clear_cache, sender=ClassPolicy, dispatch_uid="ladder-clear-on-save")
post_delete.connect(clear_cache, sender=ClassPolicy, dispatch_uid="ladder-clear-on-delete")


def borrow_refusal(priority_class: str, gpu_count: int) -> str | None:
    """Why a job of this class may not borrow ``gpu_count`` GPUs (the sentence a form or a 400 shows), or None."""
    terms = terms_of(priority_class)
    if terms.max_gpus_per_job is not None and gpu_count > terms.max_gpus_per_job:
        article = "An" if terms.label[:1] in "aeiou" else "A"
        return (f"{article} {terms.label} job may borrow at most {terms.max_gpus_per_job} "
                f"GPU{'s' if terms.max_gpus_per_job != 1 else ''}; choose another priority class or fewer GPUs.")
    return None


def class_gpu_limit_rule(values: Mapping[str, Any]) -> dict[str, str]:
    """The submit rule (``portal.core.services.jobs.SUBMIT_RULES``, registered by ``ControlConfig.ready``): what
    the job's class may borrow, refused on ``gpu_count``."""
    refusal = borrow_refusal(str(values["priority_class"]), int(values["gpu_count"]))
    return {"gpu_count": refusal} if refusal else {}


# How a reclaim proceeds (design §1, §9.2), in the words the ladder page and ``GET /api/ladder/`` publish.
RECLAIM_SEQUENCE: tuple[dict[str, str], ...] = (
    {"step": "warn", "text": "A lab that takes a node back with notice warns every job on it: by when it must "
                             "leave and where it will go."},
    {"step": "drain", "text": "Each job writes a final checkpoint that is copied to its new node at a rate that "
                              "leaves research traffic its share; a job that can do this within the notice loses "
                              "nothing."},
    {"step": "force", "text": "At the deadline the lab always wins: the node is switched off for borrowers and a "
                              "job that has not left resumes from its freshest checkpoint copied off the node "
                              "(pre-sync), losing the work since."},
)
RECLAIM_ORDER = ("A reclaim is not preemption: every job on the reclaimed node leaves, whatever its class; they are "
                 "planned in the order they were submitted, each taking its destination's GPUs before the next. An "
                 "emergency reclaim or the kill-switch gives no notice: every job resumes from its freshest copied "
                 "checkpoint at once. Loans end the same way, one job at a time: warned with the class's notice, "
                 "drained (a final checkpoint within the grace), forced at the grace's end.")


def ladder_facts() -> dict[str, Any]:
    """The ladder as published (the page and ``GET /api/ladder/``): classes in order with their terms, the
    classes the idle watchdog never touches, what counts as idle, and how a reclaim proceeds."""
    classes = list(class_policies().values())
    return {
        "classes": [t.as_dict() for t in classes],
        "watchdog_never": [t.priority_class for t in classes if not t.idle_watch],
        "idle_util_pct": IDLE_UTIL_PCT,
        "reclaim_sequence": [dict(step) for step in RECLAIM_SEQUENCE],
        "reclaim_order": RECLAIM_ORDER,
    }
