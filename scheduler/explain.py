"""The scheduler's decisions in plain words (design §2, §3): why a queued job waits, why a job went where it went,
why it checkpoints as often as it does.

Pure numpy and dataclasses, no Django (the portal's side, ``portal.core.services.explain``, reads the campus read
model and the decision log and hands the numbers here).

- :func:`classify` gives every node its reason for not taking a queued job now, from P2's own feasibility checks
  (``scheduler.p2.feasibility_checks``): a node P2 would take is :data:`FITS`; P2's "busy" (too few free GPUs) is
  refined into why they are not free — too few GPUs to lend at all, being reclaimed, at the end of its lending
  window, not lent now (with its lending windows), offline, or busy with other jobs.
- :func:`summarise` turns those reasons into one or two sentences and counts (:class:`WaitingReason`).
- :func:`placement_words` and :func:`interval_words` explain a P2 choice (score terms, runners-up and why they
  lost) and a P1 interval (Lemma 1 / Eq. 9 with the numbers).

Nothing here names internal ids: callers pass node names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler.p2 import feasibility_checks
from scheduler.windows import DAY_NAMES, Window, next_window_opens_s, window_text

__all__ = [
    "DAY_NAMES",
    "FITS",
    "REASONS",
    "CampusNodes",
    "Candidate",
    "JobNeeds",
    "WaitingReason",
    "Window",
    "classify",
    "hazard_evidence_words",
    "human_bytes",
    "human_duration",
    "human_rate",
    "interval_words",
    "next_window_opens_s",
    "no_destination_words",
    "placement_words",
    "summarise",
    "window_text",
]

FITS = "fits"
# A node's reason for not taking the job now, in the order checked: P2's hardware checks first (they never change
# while the job waits), then why its GPUs are not free (P2's "busy", refined).
REASONS = ("vram", "capability", "compatibility", "too_small", "reclaiming", "closing", "not_lent", "offline",
           "busy")
HARDWARE = frozenset({"vram", "capability", "compatibility", "too_small"})
# What the caller says of each node's state; "closing": its lending window ends within the window notice (§9.13).
AVAILABILITY = ("lent", "reclaiming", "closing", "not_lent", "offline")
WEEK_S = 7 * 24 * 3600.0
P2_EXCLUDED_WORDS = {  # scheduler.p2.EXCLUSION_REASONS in words, after "N nodes"
    "vram": "had too little memory per GPU",
    "capability": "had too low a compute capability",
    "compatibility": "could not restore the checkpoint",
    "busy": "had too few free GPUs",
    "deadline": "could not receive the checkpoint before the deadline",
}


# --- units people read ---------------------------------------------------------------------------------------------


def human_duration(seconds: float | None) -> str:
    """``9 min 40 s``, ``3 h``, ``2 h 5 min``, ``1.5 s``, ``3 d 4 h`` (the pages' ``duration`` filter, plus days)."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{s:.1f} s" if s < 10 and round(s, 1) != int(s) else f"{s:.0f} s"
    if s < 3600:
        minutes, rest = divmod(round(s), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if s < 48 * 3600:
        hours, rest = divmod(round(s / 60), 60)
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    days, rest = divmod(round(s / 3600), 24)
    return f"{days} d {rest} h" if rest else f"{days} d"


def human_bytes(value: float | None) -> str:
    """``3.2 GB``, ``120 MB`` (decimal units, as the pages write them)."""
    if value is None or not math.isfinite(value):
        return "—"
    size = float(value)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"  # pragma: no cover (the loop returns at TB)


def human_rate(bytes_per_s: float | None) -> str:
    """``2.1 GB/s``, ``118 MB/s``."""
    if bytes_per_s is None or not math.isfinite(bytes_per_s):
        return "—"
    if bytes_per_s >= 1e9:
        return f"{bytes_per_s / 1e9:.1f} GB/s"
    if bytes_per_s >= 1e6:
        return f"{bytes_per_s / 1e6:.0f} MB/s"
    return f"{bytes_per_s / 1e3:.0f} KB/s"


def _per_hour(rate_per_s: float) -> str:
    """A reclaim rate as people say it: ``0.4 times an hour`` or ``about once every 30 h``."""
    per_hour = rate_per_s * 3600.0
    if per_hour >= 0.095:
        return f"about {per_hour:.1f} times an hour"
    if per_hour <= 0:
        return "almost never"
    return f"about once every {human_duration(1 / rate_per_s)}"


def _risk(per_hour: float) -> str:
    return f"{per_hour:.2g}/h" if per_hour >= 0.01 else "under 0.01/h"


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _join(parts: Sequence[str]) -> str:
    parts = [p for p in parts if p]
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


# --- lending windows: scheduler.windows (re-exported here for the explanation's callers) -------------------------

# --- why a queued job waits -----------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class CampusNodes:
    """What the explanation knows of each node; arrays are per node, like P2's (design §3, §9.1)."""

    availability: np.ndarray  # one of AVAILABILITY per node
    lendable_gpus: np.ndarray  # GPUs it lends when lent: its GPUs minus its floor
    free_gpus: np.ndarray  # free now, as P2 sees them (0 unless lent with a live agent)
    vram_gb: np.ndarray  # per GPU (the smallest of the node's)
    capability: np.ndarray
    label: Sequence[str] | None = None  # e.g. the GPU model, to say "2 A100 nodes"
    window: Sequence[str] | None = None  # per node: its lending windows in words ("" = none)
    next_window_s: np.ndarray | None = None  # seconds until its next window opens (NaN: none, or one is open)

    @property
    def n(self) -> int:
        return int(np.asarray(self.free_gpus).shape[0])


@dataclass(frozen=True)
class JobNeeds:
    """A queued job's request: GPUs on one node, VRAM per GPU, minimum capability, and (when it resumes from a
    checkpoint) the nodes able to restore it."""

    gpus: int
    vram_gb: float = 0.0
    min_capability: float = 0.0
    compatible: np.ndarray | None = None


@dataclass(frozen=True)
class WaitingReason:
    text: str
    reasons: tuple[tuple[str, int], ...]  # (reason, nodes), in REASONS order, nodes > 0
    next_window_s: float | None  # the soonest lending window to open among nodes that would fit
    fits_now: int  # nodes P2 would take now

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "reasons": [{"reason": r, "nodes": n} for r, n in self.reasons]}


def classify(nodes: CampusNodes, needs: JobNeeds) -> np.ndarray:
    """Per node, :data:`FITS` or its reason (one of :data:`REASONS`) for not taking the job now.

    A node is FITS exactly when P2's feasibility (``scheduler.p2.feasible_mask``) holds: its first failing P2
    check names the reason, and P2's "busy" is refined by why the GPUs are not free — fewer lendable GPUs than
    asked (``too_small``), then the node's availability, else ``busy`` (other jobs hold them)."""
    checks = feasibility_checks(nodes.free_gpus, nodes.vram_gb, nodes.capability, needs.compatible,
                                gpus=needs.gpus, vram_gb_needed=needs.vram_gb, min_capability=needs.min_capability)
    out = np.full(nodes.n, FITS, dtype=object)
    undecided = np.ones(nodes.n, dtype=bool)
    availability = np.asarray(nodes.availability, dtype=object)
    not_free = ~checks["busy"]
    steps = [
        ("vram", ~checks["vram"]),
        ("capability", ~checks["capability"]),
        ("compatibility", ~checks["compatibility"]),
        ("too_small", not_free & (np.asarray(nodes.lendable_gpus) < needs.gpus)),
        ("reclaiming", not_free & (availability == "reclaiming")),
        ("closing", not_free & (availability == "closing")),
        ("not_lent", not_free & (availability == "not_lent")),
        ("offline", not_free & (availability == "offline")),
        ("busy", not_free),
    ]
    for reason, failed in steps:
        hit = undecided & failed
        out[hit] = reason
        undecided &= ~hit
    return out


_VERBS = {  # (one node, several nodes)
    "busy": ("is busy with other jobs", "are busy with other jobs"),
    "reclaiming": ("is being reclaimed by its owner", "are being reclaimed by their owners"),
    "closing": ("is at the end of its lending window", "are at the end of their lending windows"),
    "offline": ("is offline (its agent is not connected)", "are offline (their agents are not connected)"),
    "not_lent": ("is not lent now (its owner took it back)", "are not lent now (their owners took them back)"),
}


def _hardware_words(reason: str, needs: JobNeeds) -> str:
    """What the nodes failing a hardware check lack, after "N have"."""
    return {
        "vram": f"less than {needs.vram_gb:g} GB per GPU",
        "capability": f"compute capability below {needs.min_capability:g}",
        "compatibility": "older GPUs than the one its checkpoint was taken on",
        "too_small": f"fewer than {_plural(needs.gpus, 'GPU')} to lend",
    }[reason]


def _label(indices: np.ndarray, labels: Sequence[str] | None) -> str:
    """The label the nodes share ("A100"), else ""."""
    names = {labels[int(i)] for i in indices} if labels is not None else set()
    return next(iter(names)) if len(names) == 1 else ""


def _counted(indices: np.ndarray, verb: tuple[str, str], labels: Sequence[str] | None) -> str:
    """``2 A100 nodes are …`` when they share a label, else ``2 are …``."""
    k, label = len(indices), _label(indices, labels)
    subject = _plural(k, f"{label} node") if label else str(k)
    return f"{subject} {verb[0] if k == 1 else verb[1]}"


def _availability_groups(nodes: CampusNodes, codes: np.ndarray,
                         would_fit: np.ndarray) -> list[tuple[np.ndarray, tuple[str, str]]]:
    """The nodes that would fit, grouped by why their GPUs are not free now (nodes not lent, by lending window)."""
    groups: list[tuple[np.ndarray, tuple[str, str]]] = []
    for reason in ("busy", "not_lent", "closing", "reclaiming", "offline"):
        idx = would_fit[codes[would_fit] == reason]
        if not idx.size:
            continue
        if reason != "not_lent" or nodes.window is None:
            groups.append((idx, _VERBS[reason]))
            continue
        by_window: dict[str, list[int]] = {}
        for i in idx.tolist():
            by_window.setdefault(nodes.window[i], []).append(i)
        for window, members in sorted(by_window.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            group = np.array(members)
            if not window:
                groups.append((group, _VERBS["not_lent"]))
                continue
            waits = (np.asarray(nodes.next_window_s, dtype=float)[group] if nodes.next_window_s is not None
                     else np.array([np.nan]))
            waits = waits[np.isfinite(waits)]
            when = (f" (the next window opens in {human_duration(float(waits.min()))})" if waits.size
                    else " (a window is open now, but the owner took it back)")
            groups.append((group, (f"is lent only {window}{when}", f"are lent only {window}{when}")))
    return groups


def summarise(nodes: CampusNodes, needs: JobNeeds, codes: np.ndarray | None = None) -> WaitingReason:
    """One or two sentences and the counts behind them (design §3): why no node takes the job now, which nodes
    would fit and when they might, or why nothing on the campus ever could."""
    codes = classify(nodes, needs) if codes is None else np.asarray(codes, dtype=object)
    counts = tuple((r, int((codes == r).sum())) for r in REASONS if (codes == r).any())
    fits = int((codes == FITS).sum())
    would_fit = np.flatnonzero(~np.isin(codes, list(HARDWARE)))
    next_s: float | None = None
    if nodes.next_window_s is not None:
        waits = np.asarray(nodes.next_window_s, dtype=float)[would_fit[codes[would_fit] == "not_lent"]]
        waits = waits[np.isfinite(waits)]
        next_s = float(waits.min()) if waits.size else None
    gpus = _plural(needs.gpus, "GPU")
    if nodes.n == 0:
        text = "No node is registered on the campus yet: the job starts when a lab lends one."
    elif fits:
        text = (f"{_plural(fits, 'lent node')} {'has' if fits == 1 else 'have'} {gpus} free for it now: "
                f"it starts at the scheduler's next round.")
    elif would_fit.size == 0:
        lacking = _join([f"{n} {'has' if n == 1 else 'have'} {_hardware_words(r, needs)}" for r, n in counts])
        most_gpus = int(np.max(nodes.lendable_gpus))
        most_vram = float(np.max(nodes.vram_gb))
        text = (f"No node on the campus can run it as requested: {lacking}. The most one node lends is "
                f"{_plural(most_gpus, 'GPU')}, with at most {most_vram:g} GB each: cancel it and ask for less.")
    else:
        vram = f" with {needs.vram_gb:g} GB{' each' if needs.gpus > 1 else ''}" if needs.vram_gb > 0 else ""
        groups = _availability_groups(nodes, codes, would_fit)
        k = int(would_fit.size)
        if len(groups) == 1:
            idx, verb = groups[0]
            label = _label(idx, nodes.label)
            subject = "The node" if k == 1 else f"The {k} nodes"
            if label:
                subject = f"The {label} node" if k == 1 else f"The {k} {label} nodes"
            second = f"{subject} that would fit {verb[0] if k == 1 else verb[1]}."
        else:
            label = _label(would_fit, nodes.label)  # all of one kind: say it once
            said = [_counted(i, v, None if label else nodes.label) for i, v in groups]
            second = f"Of the {k} {label + ' ' if label else ''}nodes that would fit, {_join(said)}."
        text = f"No lent node has {gpus} free{vram} right now. {second}"
    return WaitingReason(text=text, reasons=counts, next_window_s=next_s, fits_now=fits)


# --- why a job went where it went (P2) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One node P2 compared (design §5 p2 response ``candidates``), named."""

    name: str
    transfer_s: float | None = None  # T_mig: the copy from the checkpoint's holder plus the restart
    survival: float | None = None  # S_d over the job's remaining runtime
    score: float | None = None  # T_mig + α (1 − S_d) T̄_mig(d)
    local: bool | None = None


def _copy_rate(c: Candidate, ckpt_bytes: float | None, restart_s: float) -> float | None:
    """The bottleneck bandwidth from the checkpoint's holder, recovered from T_mig = C / bw + T_r (inf when the
    node holds the copy itself)."""
    if c.transfer_s is None or not ckpt_bytes:
        return None
    copy_s = c.transfer_s - restart_s
    return math.inf if copy_s <= 1e-9 else ckpt_bytes / copy_s


def _risk_per_hour(c: Candidate, remaining_s: float) -> float | None:
    """The mean reclaim rate over the job's remaining runtime: −ln S_d / remaining."""
    if c.survival is None or remaining_s <= 0:
        return None
    return -math.log(min(1.0, max(c.survival, 1e-300))) / remaining_s * 3600.0


def _why_lost(c: Candidate, won: Candidate, *, ckpt_bytes: float | None, restart_s: float,
              remaining_s: float) -> str:
    risk = _risk_per_hour(c, remaining_s)
    if c.score is not None and won.score is not None and c.transfer_s is not None and won.transfer_s is not None:
        if abs(c.score - won.score) <= 1e-9 * max(1.0, abs(won.score)):
            return "as good; the earlier registered node wins a tie"
        copy_gap = c.transfer_s - won.transfer_s
        risk_gap = (c.score - c.transfer_s) - (won.score - won.transfer_s)
        if copy_gap >= risk_gap:
            rate = _copy_rate(c, ckpt_bytes, restart_s)
            if rate is not None and math.isfinite(rate):
                return f"only {human_rate(rate)} to the copy"
            return f"its copy takes {human_duration(copy_gap)} longer"
    if risk is not None:
        return f"reclaim risk {_risk(risk)}"
    return "scored lower"


def placement_words(
    chosen: Candidate, runners_up: Sequence[Candidate] = (), *, ckpt_bytes: float | None = None,
    restart_s: float = 0.0, remaining_s: float = 0.0, excluded: Mapping[str, int] | None = None,
    all_local: bool = False, max_runners_up: int = 3, hazard_evidence: str | None = None,
) -> str:
    """A P2 choice in words (design §3): the chosen node and its score terms, the runners-up (best first) and what
    each lost on — the copy (T_mig) or the chance of being reclaimed again (1 − S_d) — and why other nodes were not
    candidates. ``hazard_evidence`` (`hazard_evidence_words` of the chosen node) follows the terms: what its reclaim
    risk rests on and how far it was shrunk toward its provider's rate (design §2 "Estimators")."""
    compared = [chosen, *runners_up]
    terms: list[str] = []
    rate = _copy_rate(chosen, ckpt_bytes, restart_s)
    if rate is not None:
        if math.isinf(rate):
            terms.append("it already holds the checkpoint's copy")
        else:
            fastest = all((_copy_rate(c, ckpt_bytes, restart_s) or 0) <= rate for c in runners_up)
            terms.append(f"{human_rate(rate)} to the checkpoint's copy{' (the fastest)' if fastest and runners_up else ''}"
                         f", {human_duration(chosen.transfer_s)} to copy and restart")
    risk = _risk_per_hour(chosen, remaining_s)
    if risk is not None and chosen.survival is not None:
        lowest = all(c.survival is None or c.survival <= chosen.survival for c in runners_up)
        label = "the lowest reclaim risk" if lowest and runners_up else "reclaim risk"
        terms.append(f"{label} {_risk(risk)} ({100 * chosen.survival:.0f} % chance it stays lent for the "
                     f"{human_duration(remaining_s)} left)")
    text = f"{chosen.name} was chosen" + (f": {', '.join(terms)}." if terms else ".")
    if hazard_evidence:
        text += f" {hazard_evidence}"
    if runners_up:
        shown = [f"{c.name} ({_why_lost(c, chosen, ckpt_bytes=ckpt_bytes, restart_s=restart_s, remaining_s=remaining_s)})"
                 for c in runners_up[:max_runners_up]]
        more = len(runners_up) - len(shown)
        text += f" Runners-up: {', '.join(shown)}" + (f" and {_plural(more, 'other')}." if more > 0 else ".")
    if all_local and len(compared) > 1:
        text += " Only nodes in the same building were compared: a copy inside a building is faster."
    if excluded and (shown := _excluded_words(excluded)):
        total = sum(n for n in excluded.values() if n > 0)
        if len(shown) == 1:
            subject = "The other node" if total == 1 else f"The {total} other nodes"
            text += f" {subject} {shown[0][1]}."
        else:
            text += f" {total} other nodes could not take it: {_join([f'{n} {w}' for n, w in shown])}."
    return text


def _excluded_words(excluded: Mapping[str, int]) -> list[tuple[int, str]]:
    """P2's exclusion counts, most first, each with its words."""
    return [(n, P2_EXCLUDED_WORDS.get(r, r)) for r, n in sorted(excluded.items(), key=lambda kv: (-kv[1], kv[0]))
            if n > 0]


def hazard_evidence_words(events: float, exposure_s: float, prior_per_s: float, level_per_s: float, *,
                          prior_name: str = "its provider") -> str:
    """What a node's reclaim risk rests on (design §2 "Estimators", design §3's survival term): its departures over
    its lent time, and how far the Gamma–Poisson shrinkage pulled it toward ``prior_name``'s rate
    (`scheduler.estimators.shrinkage_weight`: the weight of the node's own rate)."""
    from scheduler.estimators import shrinkage_weight  # pure; imported here to keep explain's imports light

    k = round(events)
    seen = f"{_plural(k, 'departure')} in {human_duration(exposure_s)} lent" if exposure_s > 0 else "no lent time yet"
    own = float(shrinkage_weight(exposure_s, prior_per_s))
    if own >= 0.95:
        return f"Its reclaim risk {_risk(3600.0 * level_per_s)} rests on its own history ({seen})."
    return (f"Its reclaim risk {_risk(3600.0 * level_per_s)} rests on {seen}, so it is {100 * (1 - own):.0f} % "
            f"{prior_name}'s rate ({_per_hour(prior_per_s)}) and {100 * own:.0f} % its own.")


def no_destination_words(excluded: Mapping[str, int] | None) -> str:
    """P2 found no feasible node (design §3: degraded recovery, the job waits in the queue)."""
    text = "No node could take it, so it waits in the queue and resumes from its freshest checkpoint when one can"
    shown = _excluded_words(excluded or {})
    return f"{text}: {_join([f'{n} {w}' for n, w in shown])}." if shown else text + "."


# --- why this checkpoint interval (P1) ------------------------------------------------------------------------------


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.01 * max(abs(a), abs(b), 1e-9)


def interval_words(
    interval_s: float, *, ckpt_bytes: float, bandwidth_bytes_per_s: float, hazard_per_s: float, beta: float = 0.2,
    loss_budget_s: float | None = None, at_risk: bool = False, min_interval_s: float | None = None,
) -> str:
    """A P1 interval in words with its numbers (design §2, Lemma 1 and Eq. 9): Δ* = √(2C/(λb)) balances time
    spent writing against work lost at a reclaim, kept at least C/(βb) (writing at most β of the time) and at most
    2 L_max (the loss budget)."""
    text = f"Every {human_duration(interval_s)}"
    if bandwidth_bytes_per_s <= 0 or hazard_per_s <= 0 or ckpt_bytes <= 0:
        return text + "."
    write_s = ckpt_bytes / bandwidth_bytes_per_s
    text += (f": a checkpoint takes {human_duration(write_s)} to write and send ({human_bytes(ckpt_bytes)} at "
             f"{human_rate(bandwidth_bytes_per_s)}); this node is reclaimed {_per_hour(hazard_per_s)}.")
    balance = math.sqrt(2 * ckpt_bytes / (hazard_per_s * bandwidth_bytes_per_s))
    lower = write_s / beta if beta > 0 else 0.0
    upper = 2 * loss_budget_s if loss_budget_s else math.inf
    if min_interval_s and _close(interval_s, min_interval_s) and balance < min_interval_s:
        text += (f" The balance point would be {human_duration(balance)}; the campus floor of "
                 f"{human_duration(min_interval_s)} keeps checkpoint traffic reasonable.")
    elif _close(interval_s, lower) and balance < lower:
        text += (f" The balance point would be {human_duration(balance)}, but writing may take at most "
                 f"{100 * beta:.0f} % of the job's time.")
    elif math.isfinite(upper) and _close(interval_s, upper) and balance > upper:
        text += (f" The balance point would be {human_duration(balance)}, but your loss budget of "
                 f"{human_duration(loss_budget_s)} caps it at twice that (a reclaim loses half an interval on "
                 f"average).")
    else:
        text += (" Checkpointing more often would spend more time writing than it saves; less often would lose "
                 "more work at a reclaim (half an interval on average).")
    if at_risk and loss_budget_s:
        text += (f" Your loss budget of {human_duration(loss_budget_s)} cannot be met at this bandwidth: the job "
                 f"checkpoints as often as the link allows.")
    return text


# --- the fair queue (design §16.6) --------------------------------------------------------------------------------

QUEUE_REASONS = ("over_quota", "dependency", "array_throttle", "reserved", "behind_others")


def queue_reason_words(reason: str, *, core_reason: str = "", group: str = "", max_gpus: float | None = None,
                       max_gpu_hours_30d: float | None = None, used_gpu_hours_30d: float = 0.0,
                       node: str | None = None, parents: Sequence[int] = ()) -> str:
    """Why the fair queue holds a job back, in one sentence (``reason``: one of :data:`QUEUE_REASONS`;
    ``core_reason``: ``scheduler.queue``'s finer reason)."""
    if reason == "over_quota":
        limits = []
        if max_gpus is not None and math.isfinite(max_gpus):
            limits.append(f"{_plural(int(max_gpus), 'GPU')} at once")
        if max_gpu_hours_30d is not None and math.isfinite(max_gpu_hours_30d):
            limits.append(f"{max_gpu_hours_30d:g} GPU-hours in 30 days, {used_gpu_hours_30d:.1f} used")
        limit = f" ({_join(limits)})" if limits else ""
        return (f"Its group {group} is at its quota{limit}: it starts when the group's usage falls, or on GPUs "
                f"no job within its quota can use.")
    if reason == "dependency":
        which = f" ({_join([f'job {p}' for p in parents])})" if parents else ""
        return f"It waits for the jobs it depends on{which} to end."
    if reason == "array_throttle":
        return "Its array already runs as many tasks as its throttle allows; it starts when one of them ends."
    if reason == "reserved":
        where = f" on {node}" if node else ""
        if core_reason == "reserved":
            return (f"It is next: GPUs{where} are kept free for it as they come free, and smaller jobs start "
                    f"before it only where they end in time.")
        return (f"GPUs{where} are reserved for a job of higher priority; jobs that end before it would start may "
                f"still use the gap.")
    if reason == "behind_others":
        if core_reason == "preempting":
            return "Jobs running beyond their group's quota are being checkpointed to make room for it."
        return "Every node that fits it is busy; jobs of higher priority are ahead of it."
    return ""


def with_queue_words(campus_text: str, queue_text: str, fits_now: int) -> str:
    """The waiting reason with the queue's sentence first; the campus's words are kept only when they say why
    it does not fit (when it fits somewhere now, the queue is the whole reason)."""
    if not queue_text:
        return campus_text
    return queue_text if fits_now > 0 else f"{queue_text} {campus_text}"
