"""The fair queue, pure (design §16): fair share, priority, quotas, EASY backfill, arrays and dependencies.

Dataclasses of numpy arrays in, decisions out; no Django, no I/O. Indices are positions in the arrays the
caller passes; times are seconds from "now" (≥ 0), usage is GPU-seconds.

- §16.1 fair share (Slurm's classic factor F = 2^(−usage/share), usage decayed with a half-life and both
  normalised by the campus totals) and a job's priority w_class·class + w_fs·F + w_age·age with its terms;
- §16.2 quotas (GPUs held, GPU-seconds per rolling 30 days, per group and optionally per user): an over-quota
  job starts only on nodes no waiting in-quota job could use, is preemptible, and is preempted (fewest per node,
  newest first) when an in-quota job waits for its GPUs;
- §16.3 EASY backfill: jobs start in priority order; the first that cannot start gets a reservation (node, time)
  at its earliest start; lower jobs start now only where they do not delay it; every waiting job gets an
  *estimated* start from a list-scheduling profile;
- §16.4 arrays (``0-49%8``: at most 8 members running) and dependencies (``after_ok``, ``after_any``) as
  eligibility only.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.windows import Window, closes_in_s, is_open, next_window_opens_s

__all__ = [
    "CLASS_TERMS", "DEFAULT_WEIGHTS", "REASONS", "ArraySpec", "ArraySpecError", "Priority", "PriorityWeights", "QueueDecision",
    "QueueNodes", "QueueRunning", "QueueWaiting", "Quotas", "decayed_gpu_seconds", "dependency_status",
    "fair_share_factors", "gpu_seconds_within", "group_totals", "jain_index", "node_availability",
    "parse_array_spec", "priorities", "priority_terms_rounded", "priority_text", "schedule",
]

CLASS_TERMS = {"interactive": 1.0, "standard": 0.5, "best_effort": 0.0}
QUOTA_WINDOW_S = 30 * 86400.0
# Why a waiting job did not start this pass (QueueDecision.reason; "" = it starts now).
REASONS = ("dependency", "array throttle", "over quota", "reserved", "behind reservation", "no free GPUs",
           "never fits", "preempting")


# ---- §16.1 fair share and priority ----------------------------------------------------------------------------

@dataclass(frozen=True)
class PriorityWeights:
    """Admin-set weights of design §16.1; the defaults make a priority a number in [0, 1]."""

    class_weight: float = 0.5
    fair_share_weight: float = 0.4
    age_weight: float = 0.1
    max_age_s: float = 7 * 86400.0  # an age at or above this gives the whole age weight
    half_life_s: float = 7 * 86400.0  # usage decay of the fair share


DEFAULT_WEIGHTS = PriorityWeights()


def decayed_gpu_seconds(gpus: np.ndarray, started_ago_s: np.ndarray, ended_ago_s: np.ndarray,
                        half_life_s: float) -> np.ndarray:
    """Per usage interval, ∫ gpus · 2^(−age/half_life) d(age) over [ended_ago_s, started_ago_s] (ended_ago_s = 0
    while it runs); half_life_s = inf gives the plain GPU-seconds."""
    g = np.asarray(gpus, dtype=float)
    a = np.maximum(np.asarray(started_ago_s, dtype=float), 0.0)
    b = np.clip(np.asarray(ended_ago_s, dtype=float), 0.0, a)
    if not np.isfinite(half_life_s):
        return g * (a - b)
    k = math.log(2.0) / half_life_s
    return g * (np.exp(-k * b) - np.exp(-k * a)) / k


def gpu_seconds_within(gpus: np.ndarray, started_ago_s: np.ndarray, ended_ago_s: np.ndarray,
                       window_s: float = QUOTA_WINDOW_S) -> np.ndarray:
    """Per usage interval, its GPU-seconds inside the last ``window_s`` (the rolling quota window)."""
    a = np.minimum(np.maximum(np.asarray(started_ago_s, dtype=float), 0.0), window_s)
    b = np.minimum(np.maximum(np.asarray(ended_ago_s, dtype=float), 0.0), window_s)
    return np.asarray(gpus, dtype=float) * np.maximum(a - b, 0.0)


def group_totals(group_index: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    """Sum of ``values`` per group (a bincount)."""
    idx = np.asarray(group_index, dtype=np.int64)
    return np.bincount(idx, weights=np.asarray(values, dtype=float), minlength=n_groups)[:n_groups]


def fair_share_factors(usage_gpu_s: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """F = 2^(−(u/Σu)/(s/Σs)) per group (design §16.1): 1 for a group that used nothing (and for every group
    while nobody used anything), 0.5 for one that used exactly its share, 0 for a group with no share."""
    u = np.maximum(np.asarray(usage_gpu_s, dtype=float), 0.0)
    s = np.maximum(np.asarray(shares, dtype=float), 0.0)
    total_u, total_s = float(u.sum()), float(s.sum())
    if total_u <= 0:
        return np.where(s > 0, 1.0, 0.0) if total_s > 0 else np.zeros_like(u)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (u / total_u) / (s / total_s) if total_s > 0 else np.full_like(u, np.inf)
    return np.where(s > 0, np.exp2(-ratio), 0.0)


@dataclass(frozen=True, eq=False)
class Priority:
    """Per job: the priority and its three terms (value = class_part + fair_share_part + age_part)."""

    value: np.ndarray
    class_part: np.ndarray
    fair_share_part: np.ndarray
    age_part: np.ndarray


def priorities(class_term: np.ndarray, fair_share: np.ndarray, age_s: np.ndarray,
               weights: PriorityWeights | None = None) -> Priority:
    """design §16.1: w_class·class_term + w_fs·F + w_age·min(age/max_age, 1), per job, with its terms
    (``weights`` None = the defaults)."""
    weights = weights or DEFAULT_WEIGHTS
    c = weights.class_weight * np.asarray(class_term, dtype=float)
    f = weights.fair_share_weight * np.asarray(fair_share, dtype=float)
    age = np.clip(np.asarray(age_s, dtype=float) / weights.max_age_s, 0.0, 1.0) if weights.max_age_s > 0 else \
        np.ones_like(np.asarray(age_s, dtype=float))
    a = weights.age_weight * age
    return Priority(value=c + f + a, class_part=c, fair_share_part=f, age_part=a)


def priority_terms_rounded(value: float, class_part: float, fair_share_part: float, age_part: float,
                           digits: int = 2) -> tuple[float, float, float, float]:
    """The value rounded to ``digits`` and the three terms rounded so they add up to it exactly as printed
    (largest remainder: each term is rounded down, the units left go to the largest fractions)."""
    scale = 10 ** digits
    total = round(float(value) * scale)
    parts = [float(class_part) * scale, float(fair_share_part) * scale, float(age_part) * scale]
    units = [math.floor(p) for p in parts]
    left = total - sum(units)
    by_fraction = sorted(range(3), key=lambda i: (-(parts[i] - units[i]), i))
    for k in range(abs(left)):
        i = by_fraction[k % 3] if left > 0 else by_fraction[::-1][k % 3]
        units[i] += 1 if left > 0 else -1
    return total / scale, units[0] / scale, units[1] / scale, units[2] / scale


def priority_text(value: float, class_part: float, fair_share_part: float, age_part: float,
                  digits: int = 2) -> str:
    """``0.72 = class 0.50 + fair share 0.18 + age 0.04`` (the terms add up to the value as printed)."""
    v, c, f, a = priority_terms_rounded(value, class_part, fair_share_part, age_part, digits)
    return f"{v:.{digits}f} = class {c:.{digits}f} + fair share {f:.{digits}f} + age {a:.{digits}f}"


def jain_index(values: np.ndarray) -> float:
    """Jain's fairness index (Σx)² / (n·Σx²): 1 when all are equal, 1/n when one takes everything."""
    x = np.asarray(values, dtype=float)
    sq = float(np.sum(x * x))
    return float(np.sum(x)) ** 2 / (x.size * sq) if x.size and sq > 0 else 1.0


# ---- §16.3 inputs and the answer ---------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class QueueNodes:
    """Per node: GPUs it lends, GPUs free now (0 where it takes nothing now), and when it may take new work:
    from ``available_from_s`` (0 = now; inf = not in sight: reclaiming, offline) until ``available_until_s``
    (inf = never stops; see :func:`node_availability` for lending windows); ``cost`` breaks ties (lower first)."""

    gpus: np.ndarray
    free_gpus: np.ndarray
    available_from_s: np.ndarray | None = None
    available_until_s: np.ndarray | None = None
    cost: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class QueueRunning:
    """Per running job: its node, GPUs, expected seconds to its end (inf = unknown), how long ago it started,
    its group, whether it started over quota (preemptible), its user and array (−1 = none; None = all −1)."""

    node: np.ndarray
    gpus: np.ndarray
    ends_in_s: np.ndarray
    started_ago_s: np.ndarray
    group: np.ndarray
    preemptible: np.ndarray
    user: np.ndarray | None = None
    array: np.ndarray | None = None

    @classmethod
    def empty(cls) -> QueueRunning:
        z = np.zeros(0, dtype=np.int64)
        return cls(node=z, gpus=z, ends_in_s=np.zeros(0), started_ago_s=np.zeros(0), group=z,
                   preemptible=np.zeros(0, dtype=bool))


@dataclass(frozen=True, eq=False)
class QueueWaiting:
    """Per waiting job: priority, GPUs (all on one node), expected runtime, HARDWARE feasibility (bool matrix
    n_waiting × n_nodes: P2's VRAM, capability and compatibility checks — not load, not windows), group, user and
    array (−1 = none), eligible (False: dependencies unmet). Ties in priority keep the caller's order."""

    priority: np.ndarray
    gpus: np.ndarray
    runtime_s: np.ndarray
    feasible: np.ndarray
    group: np.ndarray
    user: np.ndarray | None = None
    array: np.ndarray | None = None
    eligible: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class Quotas:
    """Per group (and optionally per user): GPUs held at once and GPU-seconds per rolling 30 days (np.inf = no
    limit), with the GPU-seconds already used in the window."""

    group_max_gpus: np.ndarray
    group_max_gpu_s_30d: np.ndarray
    group_used_gpu_s_30d: np.ndarray
    user_max_gpus: np.ndarray | None = None
    user_max_gpu_s_30d: np.ndarray | None = None
    user_used_gpu_s_30d: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class QueueDecision:
    """One scheduling pass (design §16.3). Per waiting job (indexed like the input): ``start_node`` (−1 =
    waits), ``preempt_node`` (the node it takes once the preempted jobs have left; −1 none), ``over_quota``,
    ``estimated_start_s`` (0 for starts, inf = no estimate: an estimate, not a promise) and ``reason``
    (one of REASONS, "" when it starts). ``preempt`` lists running indices to evict, ``preempt_for`` the waiting
    job each makes room for."""

    order: np.ndarray
    start_node: np.ndarray
    preempt_node: np.ndarray
    over_quota: np.ndarray
    estimated_start_s: np.ndarray
    reason: tuple[str, ...]
    reserved_job: int
    reserved_node: int
    reserved_start_s: float
    preempt: np.ndarray
    preempt_for: np.ndarray


# ---- §16.3 lending windows -------------------------------------------------------------------------------------

def _shift(weekday: int, minute: float, seconds: float) -> tuple[int, float]:
    total = (weekday * 1440 + minute + seconds / 60.0) % (7 * 1440)
    return int(total // 1440), total % 1440


def node_availability(windows_per_node: Sequence[Sequence[Window]], weekday: int, minute: float,
                      notice_s: float) -> tuple[np.ndarray, np.ndarray]:
    """``(available_from_s, available_until_s)`` per node from its lending windows (scheduler.windows), seen at
    ``weekday``/``minute`` local time: a node takes new work while a window is open and ends more than
    ``notice_s`` later (design §9.13); only the next such stretch is modelled."""
    n = len(windows_per_node)
    frm, until = np.zeros(n), np.full(n, np.inf)
    for i, windows in enumerate(windows_per_node):
        if not windows:
            continue
        start = 0.0
        for _ in range(16):  # at most one stretch per window and weekday: this ends long before
            day, mnt = _shift(weekday, minute, start)
            if not is_open(windows, day, mnt):
                start += next_window_opens_s(windows, day, mnt) or 0.0
                day, mnt = _shift(weekday, minute, start)
            closes = closes_in_s(windows, day, mnt)
            if closes is None:
                frm[i], until[i] = start, np.inf
                break
            if closes > notice_s:
                frm[i], until[i] = start, start + closes - notice_s
                break
            start += closes + 1.0  # this stretch ends too soon: the next one
        else:
            frm[i], until[i] = np.inf, np.inf
    return frm, until


# ---- §16.3 the pass ---------------------------------------------------------------------------------------------

def _ints(a: np.ndarray | None, n: int, fill: int = -1) -> np.ndarray:
    return np.full(n, fill, dtype=np.int64) if a is None else np.asarray(a, dtype=np.int64)


def _best(keys: list[np.ndarray], idx: np.ndarray) -> int:
    """The index in ``idx`` with the smallest keys (lexicographic, then smallest index)."""
    for key in keys:
        if idx.size == 1:
            break
        values = key[idx]
        idx = idx[values == values.min()]
    return int(idx[0])


def _earliest(start_at: np.ndarray, blocked: np.ndarray) -> int:
    """The node with the smallest start time (``blocked``: 0 where the job may run, inf where not; nodes are in
    cost order, so the first minimum is the cheapest); −1 if none."""
    t = start_at + blocked
    k = int(t.argmin())
    return k if t[k] < np.inf else -1


def schedule(nodes: QueueNodes, running: QueueRunning, waiting: QueueWaiting, quotas: Quotas | None = None,
             array_throttle: np.ndarray | None = None, *, estimate: bool = True) -> QueueDecision:
    """One pass of the fair queue (design §16.2–§16.3).

    In priority order (ties: input order), skipping jobs whose dependencies are unmet, whose array is at its
    throttle, or that no node could ever take: an in-quota job starts now on a node where it fits (GPUs free now,
    or held by preemptible over-quota jobs — then those are preempted and it waits for them: "preempting"), unless
    a reservation exists and starting there would delay it. The first in-quota job that cannot start gets the
    reservation: the node and time of its earliest start on the release profile (each GPU free at the end of the
    job holding it; preemptible GPUs count as free). A later job may use the reserved node only if it ends by the
    reserved time or leaves enough GPUs for it then. Node choice: no preemption first, then fewest jobs
    preempted, then the least GPUs left over (best fit), then ``cost``, then the lowest index. Within a node,
    preemptible jobs go newest first until enough GPUs are free. Then over-quota jobs, in priority order, start
    only on nodes no waiting in-quota job could ever use (and not delaying the reservation); they are preemptible.
    Estimated starts: the waiting jobs in priority order (in-quota first) each take the earliest time their GPUs
    are free on the profile (no filling of holes; throttled arrays wait for a member slot); ``estimate=False``
    skips them (all inf but the starts: the simulator's passes).
    """
    gpus_node = np.asarray(nodes.gpus, dtype=np.int64)
    n = gpus_node.size
    m = int(np.asarray(waiting.gpus).size)
    frm = np.zeros(n) if nodes.available_from_s is None else np.asarray(nodes.available_from_s, dtype=float)
    until = np.full(n, np.inf) if nodes.available_until_s is None else np.asarray(nodes.available_until_s,
                                                                                  dtype=float)
    # nodes in cost order (then index): the first of equal candidates is the cheapest; mapped back at the end
    perm = np.arange(n) if nodes.cost is None else np.lexsort((np.arange(n), np.asarray(nodes.cost, dtype=float)))
    inverse = np.empty(n, dtype=np.int64)
    inverse[perm] = np.arange(n)
    gpus_node, frm, until = gpus_node[perm], frm[perm], until[perm]
    avail_now = (frm <= 0) & (until > 0)
    ever = frm < until
    # running jobs
    # (a running job on node −1, on no node passed, counts for quotas and arrays only)
    r_node = np.asarray(running.node, dtype=np.int64)
    on_node = (r_node >= 0) & (r_node < n)
    r_node = np.where(on_node, inverse[np.where(on_node, r_node, 0)] if n else -1, -1)
    r_gpus = np.asarray(running.gpus, dtype=np.int64)
    r_ends = np.asarray(running.ends_in_s, dtype=float)
    r_pre = np.asarray(running.preemptible, dtype=bool) & on_node
    r_n = r_node.size
    held_node = np.bincount(r_node[on_node], weights=r_gpus[on_node], minlength=n).astype(np.int64)[:n]
    free = np.where(avail_now, np.clip(np.asarray(nodes.free_gpus, dtype=np.int64)[perm], 0,
                                       np.maximum(gpus_node - held_node, 0)), 0)
    pre_avail = np.bincount(r_node[r_pre], weights=r_gpus[r_pre], minlength=n).astype(np.int64)[:n]
    pre_avail = np.where(avail_now, pre_avail, 0)
    # release profile: each node's GPUs, sorted by when they are free (preemptible ones at 0)
    width = max(int(gpus_node.max()) if n else 1, 1)
    release = np.full((n, width), np.inf)
    slots: list[list[float]] = [[] for _ in range(n)]
    for i in np.flatnonzero(on_node).tolist():
        slots[r_node[i]].extend([0.0 if r_pre[i] else max(float(r_ends[i]), 0.0)] * int(r_gpus[i]))
    for k in range(n):
        idle = int(gpus_node[k]) - len(slots[k])
        if idle > 0:  # idle GPUs: free now, or from the window's opening; GPUs held by no job we know: never
            zeros = int(free[k]) if avail_now[k] else idle
            slots[k].extend([0.0] * zeros + [np.inf] * (idle - zeros))
        row = sorted(slots[k])[:width]
        release[k, :len(row)] = row
    # preemptible jobs per node, newest first
    pre_queue: list[list[int]] = [[] for _ in range(n)]
    started_ago = np.asarray(running.started_ago_s, dtype=float)
    for i in sorted(np.flatnonzero(r_pre).tolist(), key=lambda i: (started_ago[i], -i)):
        pre_queue[r_node[i]].append(i)
    pending_free = np.zeros(n, dtype=np.int64)  # GPUs of preempted jobs no waiting job was given yet
    usable = free + pre_avail  # what an in-quota job may take now (free, pending, preemptible)
    # waiting jobs
    w_gpus = np.asarray(waiting.gpus, dtype=np.int64)
    w_run = np.asarray(waiting.runtime_s, dtype=float)
    w_group = np.asarray(waiting.group, dtype=np.int64)
    w_user = _ints(waiting.user, m)
    w_array = _ints(waiting.array, m)
    eligible = np.ones(m, dtype=bool) if waiting.eligible is None else np.asarray(waiting.eligible, dtype=bool)
    feasible = np.asarray(waiting.feasible, dtype=bool).reshape(m, n)[:, perm]
    fits_ever = feasible & (gpus_node[None, :] >= w_gpus[:, None]) & ever[None, :]
    fits_any = fits_ever.any(axis=1)
    blocked = np.where(fits_ever, 0.0, np.inf)
    # per job size g: when each node could start g GPUs (inf past its window); kept up to date row by row
    sizes = sorted(set(w_gpus[fits_any].tolist()))
    start_at = {g: np.where(ever, np.maximum(release[:, g - 1], frm), np.inf) for g in sizes}
    for g in sizes:
        start_at[g][start_at[g] >= until] = np.inf

    def hold(k: int, g: int, until_s: float) -> None:
        """GPUs of node k taken until ``until_s`` on the release profile: its g earliest ones."""
        release[k, :g] = until_s
        release[k].sort()
        for size in sizes:
            t = max(float(release[k, size - 1]), float(frm[k]))
            start_at[size][k] = t if t < until[k] else np.inf
    order = np.lexsort((np.arange(m), -np.asarray(waiting.priority, dtype=float)))
    # quota and throttle counters
    r_group = np.asarray(running.group, dtype=np.int64)
    r_user = _ints(running.user, r_n)
    r_array = _ints(running.array, r_n)
    n_groups = int(max(w_group.max(initial=-1), r_group.max(initial=-1))) + 1
    n_users = int(max(w_user.max(initial=-1), r_user.max(initial=-1))) + 1
    held_group = np.bincount(r_group, weights=r_gpus, minlength=n_groups).tolist()
    held_user = np.bincount(r_user[r_user >= 0], weights=r_gpus[r_user >= 0], minlength=n_users).tolist()
    throttle = [] if array_throttle is None else np.asarray(array_throttle, dtype=np.int64).tolist()
    n_arrays = max(len(throttle), int(max(w_array.max(initial=-1), r_array.max(initial=-1))) + 1)
    throttle += [0] * (n_arrays - len(throttle))
    in_array = np.bincount(r_array[r_array >= 0], minlength=n_arrays).tolist()

    def quota_list(a: np.ndarray | None, size: int, fill: float) -> list[float]:
        vals = [fill] * size if a is None else np.asarray(a, dtype=float).tolist()
        return vals + [fill] * (size - len(vals))

    q = quotas
    g_max = quota_list(None if q is None else q.group_max_gpus, n_groups, math.inf)
    g_max_s = quota_list(None if q is None else q.group_max_gpu_s_30d, n_groups, math.inf)
    g_used = quota_list(None if q is None else q.group_used_gpu_s_30d, n_groups, 0.0)
    u_max = quota_list(None if q is None else q.user_max_gpus, n_users, math.inf)
    u_max_s = quota_list(None if q is None else q.user_max_gpu_s_30d, n_users, math.inf)
    u_used = quota_list(None if q is None else q.user_used_gpu_s_30d, n_users, 0.0)

    def over_quota(j: int, g: int, use_s: float) -> bool:
        grp, usr = int(w_group[j]), int(w_user[j])
        if held_group[grp] + g > g_max[grp] or g_used[grp] + use_s > g_max_s[grp]:
            return True
        return usr >= 0 and (held_user[usr] + g > u_max[usr] or u_used[usr] + use_s > u_max_s[usr])

    def account(j: int, g: int, use_s: float) -> None:
        grp, usr, arr = int(w_group[j]), int(w_user[j]), int(w_array[j])
        held_group[grp] += g
        g_used[grp] += use_s
        if usr >= 0:
            held_user[usr] += g
            u_used[usr] += use_s
        if arr >= 0:
            in_array[arr] += 1

    start_node = np.full(m, -1, dtype=np.int64)
    preempt_node = np.full(m, -1, dtype=np.int64)
    over = np.zeros(m, dtype=bool)
    reason = [""] * m
    preempt: list[int] = []
    preempt_for: list[int] = []
    res_job, res_node, res_t, extra = -1, -1, math.inf, 0
    waiting_in_quota: list[int] = []
    throttled: list[int] = []
    over_jobs: list[int] = []
    usable_max = int(usable.max(initial=0))
    eligible_l, fits_any_l = eligible.tolist(), fits_any.tolist()
    w_gpus_l, w_run_l, w_array_l = w_gpus.tolist(), w_run.tolist(), w_array.tolist()

    def leaving_reservation(k: np.ndarray, g: int, runtime: float) -> np.ndarray:
        """The candidate nodes where starting now leaves the reservation alone."""
        if res_node < 0 or runtime <= res_t or g <= extra:
            return k
        return k[k != res_node]

    for j in order.tolist():
        if not eligible_l[j]:
            reason[j] = "dependency"
            continue
        if not fits_any_l[j]:
            reason[j] = "never fits"
            continue
        arr = w_array_l[j]
        if arr >= 0 and throttle[arr] > 0 and in_array[arr] >= throttle[arr]:
            reason[j] = "array throttle"
            throttled.append(j)
            continue
        g, runtime = w_gpus_l[j], w_run_l[j]
        use_s = g * runtime
        if over_quota(j, g, use_s):
            over[j] = True
            over_jobs.append(j)
            continue
        if g <= usable_max:
            cand = np.flatnonzero(feasible[j] & avail_now & (usable >= g))
            ok = leaving_reservation(cand, g, runtime)
            if ok.size:
                no_wait = ok[free[ok] >= g]
                if no_wait.size:
                    k = _best([free - g], no_wait)
                    free[k] -= g
                    start_node[j] = k
                else:  # preemption: fewest jobs preempted, then best fit
                    def preemptions(k: int, g: int = g) -> int:
                        need, count = g - int(free[k]) - int(pending_free[k]), 0
                        for i in pre_queue[k]:
                            if need <= 0:
                                break
                            need -= int(r_gpus[i])
                            count += 1
                        return count
                    counts = np.zeros(n)
                    counts[ok] = [preemptions(int(k)) for k in ok]
                    k = _best([counts, usable - g], ok)
                    need = g - int(free[k])
                    free[k] = 0
                    take = min(int(pending_free[k]), need)
                    pending_free[k] -= take
                    need -= take
                    while need > 0:
                        i = pre_queue[k].pop(0)
                        preempt.append(i)
                        preempt_for.append(j)
                        pre_avail[k] -= r_gpus[i]
                        need -= int(r_gpus[i])
                    pending_free[k] += -need
                    preempt_node[j] = k
                    reason[j] = "preempting"
                usable[k] -= g
                usable_max = int(usable.max(initial=0))
                hold(k, g, runtime)
                if k == res_node and runtime > res_t:
                    extra -= g
                account(j, g, use_s)
                continue
            if cand.size:
                reason[j] = "behind reservation"
        if res_job < 0:
            k = _earliest(start_at[g], blocked[j])
            if k >= 0:
                res_job, res_node, res_t = j, k, float(start_at[g][k])
                extra = int(np.sum(release[res_node] <= res_t)) - g
                reason[j] = "reserved"
        if not reason[j]:
            reason[j] = "no free GPUs"
        waiting_in_quota.append(j)

    # over-quota jobs: only where no waiting in-quota job could ever run, and not delaying the reservation
    if over_jobs:
        wanted = fits_ever[waiting_in_quota].any(axis=0) if waiting_in_quota else np.zeros(n, dtype=bool)
        open_to_over = avail_now & ~wanted
        for j in over_jobs:
            arr = w_array_l[j]
            g, runtime = w_gpus_l[j], w_run_l[j]
            if arr >= 0 and throttle[arr] > 0 and in_array[arr] >= throttle[arr]:
                reason[j] = "array throttle"
                continue
            if g > int(free.max(initial=0, where=open_to_over)):
                reason[j] = "over quota"
                continue
            cand = np.flatnonzero(feasible[j] & open_to_over & (free >= g))
            cand = leaving_reservation(cand, g, runtime)
            if cand.size:
                k = _best([free - g], cand)
                free[k] -= g
                start_node[j] = k
                if k == res_node and runtime > res_t:
                    extra -= g
                account(j, g, g * runtime)
            else:
                reason[j] = "over quota"

    # estimated starts on the profile
    est = np.full(m, np.inf)
    est[(start_node >= 0) | (preempt_node >= 0)] = 0.0
    member_slots: dict[int, list[float]] = {}
    for a, limit in enumerate(throttle):
        if limit > 0:
            ends = sorted(r_ends[(r_array == a)].tolist())
            started = [w_run_l[j] for j in range(m) if w_array_l[j] == a and est[j] == 0.0]
            heap = sorted(ends + started)
            busy = heap[-limit:] if len(heap) >= limit else heap
            member_slots[a] = sorted([0.0] * (limit - len(busy)) + busy)
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m)
    rank_l = rank.tolist()
    later = sorted(waiting_in_quota + throttled, key=rank_l.__getitem__) + [
        j for j in over_jobs if start_node[j] < 0] if estimate else []
    for j in later:
        g, runtime, arr = w_gpus_l[j], w_run_l[j], w_array_l[j]
        if j == res_job:
            k, t_k = res_node, res_t
        else:
            k = _earliest(start_at[g], blocked[j])
            if k < 0:
                continue
            t_k = float(start_at[g][k])
        slots_a = member_slots.get(arr) if arr >= 0 else None
        if slots_a is not None:
            t_k = max(t_k, slots_a[0])
        if not math.isfinite(t_k):
            continue
        est[j] = t_k
        hold(k, g, t_k + runtime)
        if slots_a is not None:
            heapq.heapreplace(slots_a, t_k + runtime)
    to_input = np.append(perm, -1)  # node positions back to the caller's indices (−1 stays −1)
    start_node, preempt_node = to_input[start_node], to_input[preempt_node]
    res_node = int(perm[res_node]) if res_node >= 0 else -1
    return QueueDecision(
        order=order, start_node=start_node, preempt_node=preempt_node, over_quota=over, estimated_start_s=est,
        reason=tuple(reason), reserved_job=res_job, reserved_node=res_node, reserved_start_s=res_t,
        preempt=np.asarray(preempt, dtype=np.int64), preempt_for=np.asarray(preempt_for, dtype=np.int64))


# ---- §16.4 arrays and dependencies -----------------------------------------------------------------------------

class ArraySpecError(ValueError):
    """An array spec that does not parse; the message is fit for the form field."""


@dataclass(frozen=True)
class ArraySpec:
    """``0-49%8``: member indices in the order written, at most ``throttle`` running at once (0 = no limit)."""

    indices: tuple[int, ...]
    throttle: int = 0


_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_array_spec(text: str, max_members: int = 1000) -> ArraySpec:
    """Parse ``N``, ``A-B`` and comma lists (``0-3,7``), optionally ``%T`` (at most T members running).
    Raises ArraySpecError naming what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ArraySpecError("an array is written like 0-49 or 0-49%8")
    body, sep, limit = text.strip().partition("%")
    throttle = 0
    if sep:
        if not limit.isdigit():
            raise ArraySpecError(f"the throttle after % must be a whole number, not {limit!r}")
        throttle = int(limit)
        if throttle < 1:
            raise ArraySpecError("the throttle after % must be at least 1")
    indices: list[int] = []
    for item in body.split(","):
        found = _ITEM.match(item.strip())
        if not found:
            raise ArraySpecError(f"{item.strip()!r} is not an index or a range like 0-49")
        a = int(found.group(1))
        b = int(found.group(2)) if found.group(2) is not None else a
        if b < a:
            raise ArraySpecError(f"range {a}-{b} ends before it starts")
        if len(indices) + b - a + 1 > max_members:
            raise ArraySpecError(f"an array has at most {max_members} members")
        indices.extend(range(a, b + 1))
    if len(set(indices)) != len(indices):
        raise ArraySpecError("an index appears twice")
    return ArraySpec(indices=tuple(indices), throttle=throttle)


ENDED_OK = frozenset({"completed"})
ENDED_NOT_OK = frozenset({"failed", "cancelled"})


def dependency_status(after_ok_states: Sequence[str], after_any_states: Sequence[str]) -> tuple[str, str]:
    """``(status, reason)`` of a job's dependencies from its parents' states (portal JobState values):
    "cancel" when an ``after_ok`` parent ended without success (reason names how), "waiting" while an
    ``after_ok`` parent has not completed or an ``after_any`` parent has not ended, else "ready"."""
    for state in after_ok_states:
        if state in ENDED_NOT_OK:
            return "cancel", f"dependency failed: parent {state}"
    if any(state not in ENDED_OK for state in after_ok_states):
        return "waiting", "waiting for a parent to complete"
    if any(state not in ENDED_OK | ENDED_NOT_OK for state in after_any_states):
        return "waiting", "waiting for a parent to end"
    return "ready", ""
