"""Why, in plain words (design §2, §3): a queued job's waiting reason, and the reasons behind each placement,
migration and checkpoint interval on a job's timeline.

Reads only: the campus read model (``portal.core.campus.load``, design §9.1) for what the campus looks like now,
and the decision log (``DecisionLog``, design §5) for what the scheduler decided then. The words themselves come
from the pure ``scheduler.explain``; this module translates rows into its inputs and node pks into names.

The waiting reason is computed when read, not stored by the placement tick: the tick skips reading the campus
when no queued job can fit anywhere (design §9.4), which is exactly when a reason is wanted, and a stored reason
would be stale by up to a period. A read costs a fixed number of statements (the snapshot's, lending windows
included, two more for node states and GPUs, and one about the job), and only for a queued job; any other job answers None without a query. Within one process the snapshot is shared
for as long as the dashboard's read-model numbers are (``RECLAIMNET_DASHBOARD_MAX_AGE_S``, 5 s): a queued job's
detail then costs one statement of its own.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.conf import settings
from django.db.models import Count, Min, OuterRef, Q, Subquery
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from portal.core import campus as campus_model
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Checkpoint, DecisionLog, Gpu, Job, Migration, Node, Placement
from scheduler import explain as words
from scheduler.explain import CampusNodes, Candidate, JobNeeds
from scheduler.windows import local_clock

__all__ = [
    "REASON_WORDS", "CampusFacts", "DecisionWords", "campus_facts", "decision_words", "reason_rows",
    "shared_campus_facts", "waiting_reason",
]

REASON_WORDS = {  # scheduler.explain.REASONS for the page's counts, after "N nodes"
    "vram": "with too little memory per GPU",
    "capability": "with too low a compute capability",
    "compatibility": "unable to restore its checkpoint",
    "too_small": "with fewer GPUs than it asks for",
    "reclaiming": "being reclaimed",
    "closing": "whose lending window is about to end",
    "not_lent": "not lent now",
    "offline": "offline",
    "busy": "busy with other jobs",
}


# --- why a queued job waits ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CampusFacts:
    """The campus as the waiting reason sees it: the read model's snapshot plus each node's state, size, GPU model
    and lending windows (design §9.1). One per request is enough for any number of jobs."""

    nodes: CampusNodes
    node_pks: list[int]
    capability: np.ndarray
    live: set[int]
    at: dt.datetime


def _availability(state: str, killswitch: bool, live: bool, window: str = "open") -> str:
    """``window``: ``open`` (or no windows), ``closed`` (outside every lending window) or ``closing`` (its window's
    end is near or being drained) — as the campus read model decided it (design §9.13), so the words match placement."""
    if state == NodeState.DRAINING:
        return "reclaiming"
    if state == NodeState.RECLAIMED or killswitch:
        return "not_lent"
    if state == NodeState.ONLINE and live:
        return {"closed": "not_lent", "closing": "closing"}.get(window, "lent")
    return "offline"  # offline, registered (its agent never connected), or online with no live agent


def campus_facts(now: dt.datetime | None = None) -> CampusFacts:
    """Read the snapshot (``portal.core.campus.load``, lending windows included) and two more statements: node
    states, GPU counts and models. Retired nodes are not part of the campus."""
    now = now or timezone.now()
    snap = campus_model.load(now)
    state = {pk: (s, k, floor) for pk, s, k, floor in
             Node.objects.values_list("pk", "state", "killswitch_engaged", "gpu_floor")}
    gpus = {pk: (n, model) for pk, n, model in
            Gpu.objects.values("node_id").annotate(n=Count("pk"), model=Min("model")).values_list("node_id", "n",
                                                                                                  "model")}
    windows = snap.windows  # the read model's, so placement and these words see the same windows
    keep = [i for i, pk in enumerate(snap.node_pks) if state.get(pk, (NodeState.RETIRED,))[0] != NodeState.RETIRED]
    pks = [snap.node_pks[i] for i in keep]
    local = timezone.localtime(now)
    weekday, minute = local_clock(local)  # the read model's clock reading
    next_s = [words.next_window_opens_s(windows.get(pk, []), weekday, minute) for pk in pks]
    window = snap.window_state  # the read model's verdict, so these words say what placement does
    nodes = CampusNodes(
        availability=np.array([_availability(state[pk][0], state[pk][1], pk in snap.live, window.get(pk, "open"))
                               for pk in pks], dtype=object),
        lendable_gpus=np.array([Node.lendable_of(gpus.get(pk, (0, ""))[0], state[pk][2]) for pk in pks], dtype=int),
        free_gpus=snap.free_gpus[keep], vram_gb=snap.vram_gb[keep], capability=snap.capability[keep],
        label=[gpus.get(pk, (0, ""))[1] or "" for pk in pks],
        window=[words.window_text(windows.get(pk, [])) for pk in pks],
        next_window_s=np.array([np.nan if s is None else s for s in next_s], dtype=float),
    )
    return CampusFacts(nodes=nodes, node_pks=pks, capability=snap.capability[keep], live=snap.live, at=now)


_cached: tuple[float, CampusFacts] | None = None
_cache_lock = threading.Lock()


def shared_campus_facts() -> CampusFacts:
    """:func:`campus_facts`, read at most once per ``RECLAIMNET_DASHBOARD_MAX_AGE_S`` per process (the bound the
    dashboard's read-model numbers keep, design §10; 0, the test suite's default, reads on every call): every
    queued job's page and API detail in that time share one snapshot."""
    global _cached
    max_age_s = float(getattr(settings, "RECLAIMNET_DASHBOARD_MAX_AGE_S", 0.0))
    if max_age_s <= 0:
        return campus_facts()
    with _cache_lock:
        if _cached is not None and 0 <= time.monotonic() - _cached[0] <= max_age_s:
            return _cached[1]
        read_at = time.monotonic()
        facts = campus_facts()
        _cached = (read_at, facts)
        return facts


def waiting_reason(job: Job, facts: CampusFacts | None = None) -> dict[str, Any] | None:
    """Why ``job`` is still queued: ``{text, reasons: [{reason, nodes}], next_window_at}`` (design §3); None when
    it is not queued (no statement). Otherwise the campus snapshot (:func:`shared_campus_facts`, or ``facts``)
    and one statement about the job: where it is starting or being copied to, and the capability of the newest
    checkpoint a live node holds (placement resumes from it; only nodes at least that capable restore it)."""
    if job.state != JobState.QUEUED:
        return None
    facts = facts or shared_campus_facts()
    live = sorted(facts.live)
    restorable = (Checkpoint.objects.filter(job=OuterRef("pk"), completed_at__isnull=False)
                  .filter(Q(node__in=live) | Q(replica_nodes__in=live)).order_by("-sequence"))
    row = Job.objects.filter(pk=job.pk).annotate(
        starting_on=Subquery(Placement.objects.filter(job=OuterRef("pk"), ended_at__isnull=True)
                             .values("node__name")[:1]),
        # A migration sent back to placement has no destination (``to_waiting``); one with a destination is moving.
        moving_to=Subquery(Migration.objects.filter(job=OuterRef("pk"), finished_at__isnull=True,
                                                    destination__isnull=False).values("destination__name")[:1]),
        restore_cc=Subquery(restorable.values("compute_capability")[:1]),
    ).values_list("starting_on", "moving_to", "restore_cc", "queue_entry__reason", "queue_entry__reason_text",
                  ).first()
    # The fair queue's reason (design §16.6), read in the same statement: the last control period's verdict.
    starting_on, moving_to, cc, queue_reason, queue_text = row or (None, None, None, None, None)
    if starting_on is not None:
        return {"text": f"It is starting on {starting_on}: the scheduler is waiting for the node to confirm the "
                        f"start.", "reasons": [], "next_window_at": None}
    if moving_to is not None:
        return {"text": f"Its checkpoint is being copied to {moving_to}; it resumes there when the copy arrives.",
                "reasons": [], "next_window_at": None}
    needs = JobNeeds(gpus=int(job.gpu_count), vram_gb=float(job.vram_gb_per_gpu),
                     min_capability=float(job.min_capability),
                     compatible=None if cc is None else facts.capability >= float(cc))
    summary = words.summarise(facts.nodes, needs)
    reason = summary.as_dict()
    reason["queue_reason"] = queue_reason or None
    reason["text"] = words.with_queue_words(reason["text"], queue_text or "", summary.fits_now)
    reason["next_window_at"] = None
    if summary.next_window_s is not None:  # windows open on the minute
        opens = facts.at + dt.timedelta(seconds=summary.next_window_s + 30)
        reason["next_window_at"] = opens.replace(second=0, microsecond=0)
    return reason


def reason_rows(reason: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The counts of a waiting reason in words, for the page."""
    return [{"nodes": r["nodes"], "words": REASON_WORDS.get(r["reason"], r["reason"])}
            for r in (reason or {}).get("reasons", [])]


# --- why the job went there: the timeline --------------------------------------------------------------------------


@dataclass
class DecisionWords:
    """Plain-words reasons for one job's timeline, by placement pk and migration pk (design §2, §3)."""

    placement: dict[int, str] = field(default_factory=dict)
    migration: dict[int, str] = field(default_factory=dict)
    interval: dict[int, str] = field(default_factory=dict)  # placement pk -> its latest checkpoint interval


_P2_FIELDS = ("placement", "ckpt_bytes", "restart_s", "remaining_s", "k_min", "feasible")


def _p2_rows(job: Job) -> list[dict[str, Any]]:
    """The job's P2 decisions (not the pre-sync holder choices), oldest first, with only the request fields the
    words need (a reclaim's request lists every node of the campus)."""
    return list(DecisionLog.objects.filter(job=job, kind=DecisionLog.Kind.P2)
                .exclude(request__has_key="presync").order_by("created_at", "id")
                .values("decision_id", "created_at", "reclaim_id", "response",
                        **{f"q_{k}": KeyTransform(k, "request") for k in _P2_FIELDS}))


def _p1_rows(job: Job, placements: Sequence[Placement]) -> dict[int, dict[str, Any]]:
    """The latest P1 decision for the job during each placement (two statements: the times, then the chosen)."""
    times = list(DecisionLog.objects.filter(job=job, kind=DecisionLog.Kind.P1).order_by("created_at", "id")
                 .values_list("id", "created_at"))
    chosen: dict[int, int] = {}
    for p in placements:
        during = [pk for pk, at in times if at >= p.started_at and (p.ended_at is None or at <= p.ended_at)]
        if during:
            chosen[p.pk] = during[-1]
    if not chosen:
        return {}
    rows = {r["id"]: r for r in DecisionLog.objects.filter(pk__in=set(chosen.values()))
            .values("id", "request", "response")}
    return {placement: rows[pk] for placement, pk in chosen.items() if pk in rows}


def _names(pks: Iterable[Any]) -> dict[int, str]:
    wanted = {int(pk) for pk in pks if isinstance(pk, int | str) and str(pk).isdigit()}
    return dict(Node.objects.filter(pk__in=wanted).values_list("pk", "name")) if wanted else {}


def _excluded(response: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in response.get("excluded") or []:
        reason = str(row.get("reason", ""))
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def _referenced(response: dict[str, Any]) -> list[Any]:
    return [response.get("destination"), *[c.get("id") for c in response.get("candidates") or []][:8],
            *[c.get("id") for c in response.get("runners_up") or []]]


def p2_words(row: dict[str, Any], names: dict[int, str], job: Job) -> str | None:
    """One P2 decision in words: a holder that restarts in place, a fresh start on the node most likely to stay
    lent, or P2's scored choice (design §3); None when the row says nothing we can tell."""
    response = row.get("response") or {}
    dest = response.get("destination")

    def name(pk: Any) -> str:
        return names.get(int(pk), "a node since removed") if str(pk).isdigit() else "a node since removed"

    if dest is None:
        return words.no_destination_words(_excluded(response)) if "candidates" in response else None
    if response.get("reason") == "holder has the checkpoint":
        return (f"{name(dest)} was chosen: it already holds the job's newest checkpoint copy, so nothing had to be "
                f"copied before the restart.")
    remaining = float(row.get("q_remaining_s") or job.expected_runtime_s or 0.0)
    if "candidates" not in response:  # a fresh start: no checkpoint to copy, so only survival counts
        chosen = Candidate(name(dest), survival=response.get("survival"))
        runners = [Candidate(name(c.get("id")), survival=c.get("survival")) for c in response.get("runners_up") or []]
        text = words.placement_words(chosen, runners, remaining_s=remaining)
        feasible = row.get("q_feasible")
        if isinstance(feasible, list) and len(feasible) > 1:
            text += (f" {len(feasible)} nodes had room for it; with no checkpoint to copy, the one most likely to "
                     f"stay lent for the whole run wins.")
        return text
    candidates = response.get("candidates") or []
    ranked = sorted(candidates, key=lambda c: (c.get("score", 0.0), str(c.get("id"))))
    by_id = {str(c.get("id")): c for c in candidates}
    won = by_id.get(str(dest))
    if won is None:
        return f"{name(dest)} was chosen."

    def candidate(c: dict[str, Any]) -> Candidate:
        return Candidate(name(c.get("id")), transfer_s=c.get("transfer_s"), survival=c.get("survival"),
                         score=c.get("score"), local=c.get("local"))

    runners = [candidate(c) for c in ranked if str(c.get("id")) != str(dest)]
    k_min = int(row.get("q_k_min") or 2)
    all_local = len(candidates) >= k_min and all(c.get("local") for c in candidates)
    return words.placement_words(candidate(won), runners, ckpt_bytes=row.get("q_ckpt_bytes"),
                                 restart_s=float(row.get("q_restart_s") or job.restart_s),
                                 remaining_s=remaining, excluded=_excluded(response), all_local=all_local)


def planned_hazard_per_s(job_request: dict[str, Any], job_response: dict[str, Any]) -> float:
    """The λ one job's P1 decision planned with: the estimate plus the rate of short-notice scheduled reclaims
    (design §2 "Estimators"), as the response states it; older decisions logged the sum as ``hazard_per_s``."""
    if job_response.get("planned_hazard_per_s") is not None:
        return float(job_response["planned_hazard_per_s"])
    return float(job_request.get("hazard_per_s") or 0) + float(job_request.get("short_notice_hazard_per_s") or 0)


def p1_words(row: dict[str, Any], job: Job) -> str | None:
    """This job's line of one P1 decision in words (design §2, Eq. 9)."""
    request, response = row.get("request") or {}, row.get("response") or {}
    wanted = {str(job.pk), f"job-{job.pk}"}
    req = next((j for j in request.get("jobs", []) if str(j.get("id")) in wanted), None)
    res = next((j for j in response.get("jobs", []) if str(j.get("id")) in wanted), None)
    if req is None or res is None or not res.get("interval_s"):
        return None
    return words.interval_words(
        float(res["interval_s"]), ckpt_bytes=float(req.get("ckpt_bytes") or 0),
        bandwidth_bytes_per_s=float(res.get("bandwidth_bytes_per_s") or 0),
        hazard_per_s=planned_hazard_per_s(req, res), beta=float(request.get("beta", 0.2)),
        loss_budget_s=req.get("loss_budget_s"), at_risk=bool(res.get("loss_budget_at_risk")),
        min_interval_s=request.get("min_interval_s") or req.get("min_interval_s"),
    )


def decision_words(job: Job, placements: Sequence[Placement], migrations: Sequence[Migration]) -> DecisionWords:
    """Reasons for the timeline's placements and migrations from the decision log, in a fixed number of
    statements: a migration takes the P2 decision its work recorded (else its reclaim's), a placement the latest
    P2 decision for its node since the job's previous placement, unless a migration already shows it."""
    out = DecisionWords()
    rows = _p2_rows(job)
    if rows or placements:
        by_id = {r["decision_id"]: r for r in rows}
        works = dict(Migration.objects.filter(pk__in=[m.pk for m in migrations], work__isnull=False)
                     .values_list("pk", "work__p2_decision_id")) if migrations else {}
        names = _names(pk for r in rows for pk in _referenced(r["response"] or {}))
        used: set[Any] = set()
        for m in migrations:
            row = by_id.get(works.get(m.pk)) if works.get(m.pk) else None
            if row is None and m.reclaim_id is not None:
                row = next((r for r in reversed(rows) if r["reclaim_id"] == m.reclaim_id), None)
            if row is not None and (text := p2_words(row, names, job)):
                out.migration[m.pk] = text
                used.add(row["decision_id"])
        slack = dt.timedelta(seconds=1)
        ordered = sorted(placements, key=lambda p: (p.started_at, p.pk))
        for k, p in enumerate(ordered):
            since = ordered[k - 1].started_at if k else None
            row = next((r for r in reversed(rows) if r["created_at"] <= p.started_at + slack
                        and (since is None or r["created_at"] > since)
                        and str((r["response"] or {}).get("destination")) == str(p.node_id)), None)
            if row is not None and row["decision_id"] not in used and (text := p2_words(row, names, job)):
                out.placement[p.pk] = text
        for placement_pk, row in _p1_rows(job, ordered).items():
            if text := p1_words(row, job):
                out.interval[placement_pk] = text
    return out
