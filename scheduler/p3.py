"""P3 — deadline-aware migration traffic (design §4).

Reservation for research traffic, minimum rates, full admission or earliest-deadline admission with
skip, max-min sharing of the remainder under caps; the single-bottleneck form and the multi-bottleneck
form (a flow is admitted only if it fits on every link of its path). Vectorised over flows and links:
the only loops are over *rounds* (each round admits a whole EDF prefix, or freezes a whole set of flows
in the fair share), never over flows one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "DSCP",
    "P3Decision",
    "P3Flows",
    "admit_flows",
    "admit_flows_on_incidence",
    "admit_flows_on_paths",
    "migration_budget_bytes_per_s",
]

DSCP = {"emergency": 46, "migration": 34, "presync": 8, "research": 0}
# A flow "fits" a budget up to this relative rounding slack (one rule for the single and multi forms, so a
# single bottleneck gets the same admissions either way; Theorem 4 holds to the same 1e-12).
FIT_RELATIVE = 1e-12


@dataclass(frozen=True, eq=False)
class P3Flows:
    """Planned migration flows (design §4); arrays indexed like `ids`."""

    ids: tuple[str, ...]
    bytes: np.ndarray
    notice_s: np.ndarray
    restart_s: np.ndarray
    cap_bytes_per_s: np.ndarray  # inf = none


@dataclass(frozen=True, eq=False)
class P3Decision:
    """P3's answer (design §4, §5 p3 response)."""

    migration_budget_bytes_per_s: float | np.ndarray  # scalar, or per link in the multi form
    admitted: np.ndarray  # bool per flow
    min_rate_bytes_per_s: np.ndarray  # per flow (0 where not admitted)
    rate_bytes_per_s: np.ndarray  # per flow (0 where not admitted)
    degraded_reason: tuple[str | None, ...]  # notice|cap|capacity|None
    # DSCP per flow: AF41 for an admitted planned migration; a degraded flow's bytes, if they move at
    # all, ride the leftover class with pre-sync (CS1).
    dscp: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def migration_budget_bytes_per_s(
    capacity_bytes_per_s: float | np.ndarray, reserve_fraction: float = 0.3, reserve_min_bytes_per_s: float = 0.0
) -> float | np.ndarray:
    """B_mig = max(0, B - max(β·B, B_min)) (design §4; Theorem 4 bounds migration by B - B_min)."""
    cap = np.asarray(capacity_bytes_per_s, dtype=float)
    out = np.maximum(0.0, cap - np.maximum(reserve_fraction * cap, reserve_min_bytes_per_s))
    return float(out) if out.ndim == 0 else out


def _min_rates(flows: P3Flows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """r_min = C/(τ - T_r) and the notice/cap degradations (design §4)."""
    slack = flows.notice_s - flows.restart_s
    notice_bad = ~(slack > 0)  # also catches NaN notice (an emergency has no planned migration)
    with np.errstate(divide="ignore", invalid="ignore"):
        r_min = np.where(notice_bad, np.inf, flows.bytes / np.where(notice_bad, 1.0, slack))
    cap_bad = ~notice_bad & (r_min > flows.cap_bytes_per_s)
    return r_min, notice_bad, cap_bad


def _edf_order(flows: P3Flows, eligible: np.ndarray) -> np.ndarray:
    """Eligible flow indices by earliest deadline, ties by smallest id (design §4)."""
    idx = np.flatnonzero(eligible)
    ids = np.array(flows.ids, dtype=object)[idx].astype(str) if idx.size else np.zeros(0, dtype=str)
    order = np.lexsort((ids, flows.notice_s[idx]))
    return idx[order]


def _reasons(notice_bad: np.ndarray, cap_bad: np.ndarray, capacity_bad: np.ndarray) -> tuple[str | None, ...]:
    codes = np.select([notice_bad, cap_bad, capacity_bad], [1, 2, 3], 0)
    names: tuple[str | None, ...] = (None, "notice", "cap", "capacity")
    return tuple(names[c] for c in codes.tolist())


def _decision(
    budget: float | np.ndarray,
    admitted: np.ndarray,
    mins: np.ndarray,
    rate: np.ndarray,
    notice_bad: np.ndarray,
    cap_bad: np.ndarray,
    capacity_bad: np.ndarray,
) -> P3Decision:
    """Assemble P3's answer (shared by the single- and multi-bottleneck forms)."""
    return P3Decision(
        migration_budget_bytes_per_s=budget,
        admitted=admitted,
        min_rate_bytes_per_s=mins,
        rate_bytes_per_s=rate,
        degraded_reason=_reasons(notice_bad, cap_bad, capacity_bad),
        dscp=np.where(admitted, DSCP["migration"], DSCP["presync"]).astype(np.int64),
    )


def _share_single(extra_cap: np.ndarray, left: float) -> np.ndarray:
    """Max-min fair split of `left` with per-flow headroom (equal increments, water-filling)."""
    n = extra_cap.shape[0]
    if n == 0 or left <= 0:
        return np.zeros(n)
    h = np.sort(extra_cap)
    # If the first j flows are capped, the rest share (left - Σ h[:j]) equally.
    before = np.r_[0.0, np.cumsum(np.where(np.isfinite(h), h, 0.0))[:-1]]
    level = (left - before) / (n - np.arange(n))
    ok = level <= h
    e = level[np.argmax(ok)] if ok.any() else np.inf
    return np.minimum(extra_cap, e)


def admit_flows(
    flows: P3Flows,
    capacity_bytes_per_s: float,
    reserve_fraction: float = 0.3,
    reserve_min_bytes_per_s: float = 0.0,
) -> P3Decision:
    """design §4 on one bottleneck: reserve, admit (all, or EDF with skip), share the rest max-min fairly."""
    budget = float(migration_budget_bytes_per_s(capacity_bytes_per_s, reserve_fraction, reserve_min_bytes_per_s))
    r_min, notice_bad, cap_bad = _min_rates(flows)
    eligible = ~notice_bad & ~cap_bad
    admitted = eligible.copy()
    if r_min[eligible].sum() > budget * (1 + FIT_RELATIVE):
        admitted[:] = False
        order = _edf_order(flows, eligible)
        left = budget
        r = r_min[order]
        while order.size:
            # Flows that can never fit again are skipped outright; then admit the longest prefix.
            fits = r <= left * (1 + FIT_RELATIVE)
            order, r = order[fits], r[fits]
            if not order.size:
                break
            cum = np.cumsum(r)
            j = int(np.searchsorted(cum, left * (1 + FIT_RELATIVE), side="right"))  # first flow that does not fit
            admitted[order[:j]] = True
            left -= float(cum[j - 1]) if j else 0.0
            order, r = order[j + 1 :], r[j + 1 :]
    capacity_bad = eligible & ~admitted
    rate = np.zeros(len(flows.ids))
    mins = np.where(admitted, r_min, 0.0)
    left = budget - mins.sum()
    rate[admitted] = r_min[admitted] + _share_single(
        flows.cap_bytes_per_s[admitted] - r_min[admitted], left
    )
    return _decision(budget, admitted, mins, rate, notice_bad, cap_bad, capacity_bad)


def admit_flows_on_paths(
    flows: P3Flows,
    link_capacity_bytes_per_s: np.ndarray,
    flow_links: Sequence[np.ndarray],
    reserve_fraction: float = 0.3,
    reserve_min_bytes_per_s: float = 0.0,
) -> P3Decision:
    """Multi-bottleneck P3: `flow_links[k]` lists the link indices on flow k's path."""
    lengths = np.fromiter((len(x) for x in flow_links), dtype=np.int64, count=len(flow_links))
    flow_index = np.repeat(np.arange(len(flow_links)), lengths)
    link_index = (
        np.concatenate([np.asarray(x, dtype=np.int64) for x in flow_links]) if len(flow_links) else np.zeros(0, np.int64)
    )
    return admit_flows_on_incidence(
        flows, link_capacity_bytes_per_s, flow_index, link_index, reserve_fraction, reserve_min_bytes_per_s
    )


def admit_flows_on_incidence(
    flows: P3Flows,
    link_capacity_bytes_per_s: np.ndarray,
    flow_index: np.ndarray,
    link_index: np.ndarray,
    reserve_fraction: float = 0.3,
    reserve_min_bytes_per_s: float = 0.0,
) -> P3Decision:
    """Multi-bottleneck P3 from a (flow, link) incidence list, e.g. `CampusTree.path_incidence`.

    Every link keeps its own reservation (design §4 per bottleneck). Full admission if every link's Σ r_min
    fits its budget; else EDF with skip where "fits" means fits on every link of the path. The remainder
    is shared by progressive filling: all admitted flows grow equally until a link saturates or a flow
    hits its cap, whose flows then freeze (max-min fairness on a network). Only links that carry a flow
    take part, so the work is O(path entries) per round, whatever the size of the campus.
    """
    cap_links = np.asarray(link_capacity_bytes_per_s, dtype=float)
    n = len(flows.ids)
    budget = np.atleast_1d(
        np.asarray(migration_budget_bytes_per_s(cap_links, reserve_fraction, reserve_min_bytes_per_s), dtype=float)
    )
    r_min, notice_bad, cap_bad = _min_rates(flows)
    eligible = ~notice_bad & ~cap_bad
    # Compact incidence: each (flow, link) once, links renumbered 0..L-1 over the links in use.
    fi = np.asarray(flow_index, dtype=np.int64)
    li = np.asarray(link_index, dtype=np.int64)
    used, lc = np.unique(li, return_inverse=True)
    n_used = used.shape[0]
    key = np.unique(fi * max(n_used, 1) + lc)
    fi, lc = key // max(n_used, 1), key % max(n_used, 1)
    b_used = budget[used]
    load = np.bincount(lc, weights=np.where(eligible, r_min, 0.0)[fi], minlength=n_used)
    admitted = eligible.copy()
    if np.any(load > b_used * (1 + FIT_RELATIVE)):
        admitted[:] = False
        order = _edf_order(flows, eligible)
        left = b_used.copy()
        rank = np.full(n, -1, dtype=np.int64)
        while order.size:
            # Drop flows that cannot fit on some link even alone; then admit the longest prefix that fits.
            rank[:] = -1
            rank[order] = np.arange(order.size)
            room = np.full(n, np.inf)
            live = rank[fi] >= 0
            np.minimum.at(room, fi[live], left[lc[live]])
            order = order[r_min[order] <= room[order] * (1 + FIT_RELATIVE)]
            if not order.size:
                break
            rank[:] = -1
            rank[order] = np.arange(order.size)
            live = rank[fi] >= 0
            j = _first_misfit(rank[fi[live]], lc[live], r_min[fi[live]], left)
            take = order[:j]
            admitted[take] = True
            hit = admitted[fi] & (rank[fi] >= 0) & (rank[fi] < j)
            left -= np.bincount(lc[hit], weights=r_min[fi[hit]], minlength=n_used)
            order = order[j + 1 :]
    capacity_bad = eligible & ~admitted
    mins = np.where(admitted, r_min, 0.0)
    headroom = np.where(admitted, flows.cap_bytes_per_s - mins, 0.0)
    slack = b_used - np.bincount(lc, weights=mins[fi], minlength=n_used)
    rate = mins + _share_network(fi, lc, n_used, admitted, headroom, slack)
    return _decision(budget, admitted, mins, rate, notice_bad, cap_bad, capacity_bad)


def _first_misfit(rank: np.ndarray, link: np.ndarray, r: np.ndarray, left: np.ndarray) -> int:
    """Smallest EDF rank whose running per-link load (ranks in order) exceeds that link's `left`."""
    order = np.lexsort((rank, link))
    rank, link, r = rank[order], link[order], r[order]
    cum = np.cumsum(r)
    starts = np.flatnonzero(np.r_[True, link[1:] != link[:-1]]) if link.size else np.zeros(0, np.int64)
    run = np.diff(np.r_[starts, link.shape[0]])
    base = np.repeat(np.r_[0.0, cum][starts], run)
    over = (cum - base) > left[link] * (1 + FIT_RELATIVE)
    return int(rank[over].min()) if over.any() else int(rank.max(initial=-1)) + 1


def _share_network(
    fi: np.ndarray, lc: np.ndarray, n_links: int, admitted: np.ndarray, headroom: np.ndarray, slack_links: np.ndarray
) -> np.ndarray:
    """Progressive filling (max-min fair) of the per-link slack among admitted flows, capped per flow."""
    n = admitted.shape[0]
    extra = np.zeros(n)
    active = admitted & (headroom > 0)
    slack = np.maximum(slack_links.astype(float), 0.0)
    head = np.where(active, headroom, 0.0)
    tol = 1e-12 * np.maximum(1.0, np.where(np.isfinite(headroom), headroom, 0.0))
    # Each round freezes at least one link or one flow, so it ends after <= links + flows rounds.
    while active.any():
        n_act = np.bincount(lc, weights=active[fi].astype(float), minlength=n_links)
        used = n_act > 0
        link_step = np.divide(slack, n_act, out=np.full(n_links, np.inf), where=used)
        step = min(float(link_step.min(initial=np.inf)), float(head[active].min()))
        if not np.isfinite(step):
            break  # an uncapped flow on no controlled link: nothing limits it; leave the minimum
        extra[active] += step
        head[active] -= step
        slack -= step * n_act
        saturated = used & (slack <= 1e-9 * max(1.0, step))
        frozen = head <= tol
        frozen[fi[saturated[lc]]] = True
        active &= ~frozen
    return extra
