"""P1 — reclaim-aware checkpoint scheduling (design §2).

Lemma 1 (optimal interval), Theorem 1 (cube-root bandwidth split), Lemma 2 (caps by water-filling),
Eq. 9 (clipped interval, loss budget), the minimum interval Δ_min, the final-checkpoint test on a scheduled
reclaim, and the interval rule of asynchronous snapshots (design §2 "Asynchronous snapshots": the stall is the
cost, the interval is never shorter than the transfer).
Everything is vectorised over jobs; several independent budgets (one per bottleneck) are solved in one
call with `group`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LOSS_BUDGET_MODES = ("expected", "bound")  # design §2 "Loss budget modes"; "expected" is Eq. 9
# design §2 Eq. 9 "Hazard-aware overhead floor": "hazard" (the default) lowers the floor C/(βb) to Lemma 1's interval
# where the hazard itself asks for more than β of the time writing; "eq9" is the paper's floor as printed
OVERHEAD_FLOORS = ("hazard", "eq9")
MIN_INTERVAL_S = 60.0  # Δ_min of design §2 (the portal: RECLAIMNET_MIN_CHECKPOINT_INTERVAL_S)
_LEVEL_BISECTIONS = 200  # halvings of log t; each group stops once its bracket is one float wide

__all__ = [
    "LOSS_BUDGET_MODES",
    "MIN_INTERVAL_S",
    "OVERHEAD_FLOORS",
    "P1Demand",
    "P1Jobs",
    "P1Plan",
    "allocate_checkpoint_bandwidth",
    "bound_mode_upper_s",
    "export_demand",
    "optimal_interval_s",
    "overhead_floor_s",
    "plan_checkpoints",
]


@dataclass(frozen=True, eq=False)
class P1Jobs:
    """Jobs sharing checkpoint bandwidth (design §2); arrays are indexed like `ids`."""

    ids: tuple[str, ...]
    hazard_per_s: np.ndarray  # > 0 (the upper confidence bound λ⁺)
    ckpt_bytes: np.ndarray  # > 0
    cap_bytes_per_s: np.ndarray  # per-job cap W_i (np.inf = none)
    loss_budget_s: np.ndarray  # L_max,i (np.inf = none)
    notice_s: np.ndarray  # τ_i of a pending scheduled reclaim (np.nan = none)
    restart_s: np.ndarray  # T_r,i (>= 0)
    # design §2 "Asynchronous snapshots" (None or np.nan per job: a synchronous checkpoint, planned as before)
    stall_s: np.ndarray | None = None  # s_i: the job's pause per asynchronous checkpoint (>= 0)
    transfer_s: np.ndarray | None = None  # measured time of its copy off the node (np.nan = not measured yet)
    # design §2 "Loss budget modes": per job "expected" (Eq. 9, the default) or "bound"; None = all "expected"
    loss_budget_mode: np.ndarray | None = None

    @classmethod
    def build(
        cls,
        ids: tuple[str, ...],
        hazard_per_s: np.ndarray,
        ckpt_bytes: np.ndarray,
        cap_bytes_per_s: np.ndarray | None = None,
        loss_budget_s: np.ndarray | None = None,
        notice_s: np.ndarray | None = None,
        restart_s: np.ndarray | None = None,
        stall_s: np.ndarray | None = None,
        transfer_s: np.ndarray | None = None,
        loss_budget_mode: np.ndarray | None = None,
    ) -> P1Jobs:
        """Convenience constructor filling the optional arrays with their 'none' values."""
        n = len(ids)

        def _arr(x: np.ndarray | None, fill: float) -> np.ndarray:
            return np.full(n, fill) if x is None else np.asarray(x, dtype=float)

        return cls(
            ids=tuple(ids),
            hazard_per_s=_arr(hazard_per_s, np.nan),
            ckpt_bytes=_arr(ckpt_bytes, np.nan),
            cap_bytes_per_s=_arr(cap_bytes_per_s, np.inf),
            loss_budget_s=_arr(loss_budget_s, np.inf),
            notice_s=_arr(notice_s, np.nan),
            restart_s=_arr(restart_s, 0.0),
            stall_s=None if stall_s is None else _arr(stall_s, np.nan),
            transfer_s=None if transfer_s is None else _arr(transfer_s, np.nan),
            loss_budget_mode=None if loss_budget_mode is None else np.asarray(loss_budget_mode, dtype=object),
        )


@dataclass(frozen=True, eq=False)
class P1Plan:
    """P1's answer per job (design §2, §5 p1 response)."""

    ids: tuple[str, ...]
    bandwidth_bytes_per_s: np.ndarray
    interval_s: np.ndarray
    final_checkpoint: np.ndarray  # bool
    loss_budget_at_risk: np.ndarray  # bool
    expected_cost: float  # Σ λΔ/2 + C/(bΔ)


@dataclass(frozen=True, eq=False)
class P1Demand:
    """The demand tuple P1 exports to P3 each control period: (job, C_i, b_i, Δ_i, L_max,i) (design §2)."""

    ids: tuple[str, ...]
    ckpt_bytes: np.ndarray
    bandwidth_bytes_per_s: np.ndarray
    interval_s: np.ndarray
    loss_budget_s: np.ndarray


def optimal_interval_s(
    hazard_per_s: np.ndarray, ckpt_bytes: np.ndarray, bandwidth_bytes_per_s: np.ndarray
) -> np.ndarray:
    """Lemma 1: Δ* = sqrt(2C / (λ·B_eff)) (inf where the bandwidth is 0)."""
    lam = np.asarray(hazard_per_s, dtype=float)
    c = np.asarray(ckpt_bytes, dtype=float)
    b = np.asarray(bandwidth_bytes_per_s, dtype=float)
    with np.errstate(divide="ignore"):
        return np.sqrt(2.0 * c / (lam * b))


def overhead_floor_s(
    write_s: np.ndarray, free_interval_s: np.ndarray, beta: float, rule: str = "hazard"
) -> np.ndarray:
    """Eq. 9's overhead floor on Δ (design §2 "Hazard-aware overhead floor"), before Δ_min.

    ``eq9``: the paper's C/(βb) = write_s/β, so no job spends more than β of its time writing. ``hazard``:
    min(write_s/β, Lemma 1's interval). The floor binds against Lemma 1 exactly where Lemma 1's own overhead
    sqrt(λs/2) exceeds β, i.e. where the hazard is so high that writing more often costs less than it saves
    (λs > 2β²); there Eq. 9's floor only adds rollback (at the floor the cost is β + λs/(2β), above Lemma 1's
    sqrt(2λs)). The hazard-aware floor keeps β's guard where it protects — against a loss budget that cannot be
    met (the floor above 2·L_max while Lemma 1 is above the floor too: the job is not made to write more than β of
    its time chasing a budget it cannot meet) and against over-writing at a low hazard — and steps aside where the
    job's own hazard asks for Lemma 1's interval. Where Lemma 1 is above write_s/β both rules are the same."""
    with np.errstate(divide="ignore", invalid="ignore"):
        eq9 = np.asarray(write_s, dtype=float) / beta
    if rule == "eq9":
        return eq9
    if rule != "hazard":
        raise ValueError(f"overhead_floor must be one of {OVERHEAD_FLOORS}, not {rule!r}")
    return np.fmin(eq9, np.asarray(free_interval_s, dtype=float))  # fmin: a NaN Lemma 1 (λ = 0) bounds nothing


def allocate_checkpoint_bandwidth(
    hazard_per_s: np.ndarray,
    ckpt_bytes: np.ndarray,
    budget_bytes_per_s: float | np.ndarray,
    cap_bytes_per_s: np.ndarray | None = None,
    group: np.ndarray | None = None,
    min_interval_s: float = 0.0,
) -> np.ndarray:
    """Theorem 1 with Lemma 2's caps: b_i = min(W_i, t·(λ_i C_i)^(1/3)), Σ b_i = budget.

    Lemma 2's "fix the over-cap jobs and re-solve" rounds converge to this water level t; we find t
    directly by sorting jobs by W_i / (λ_i C_i)^(1/3), which is the same unique optimum in O(K log K).
    If the caps sum to less than the budget every job gets its cap. With `group` (int codes 0..G-1),
    `budget_bytes_per_s` is an array of G budgets and each group is solved independently.

    With `min_interval_s` = Δ_min > 0 the shares are optimal for the problem with the floor Δ_i ≥ Δ_min
    (design §2 "Minimum interval"): a job whose Lemma 1 interval would fall below the floor gets
    b_i = w_i·t_i*^(1/4)·t^(3/4) < t·w_i (t_i* = 2C_i/(λ_i Δ_min² w_i), the level at which its interval reaches
    Δ_min) and the others share the rest by the cube-root rule at the common level t. 0 (the default here) is
    the paper's Theorem 1; `plan_checkpoints` passes its floor.
    """
    lam = np.asarray(hazard_per_s, dtype=float)
    c = np.asarray(ckpt_bytes, dtype=float)
    n = lam.shape[0]
    cap = np.full(n, np.inf) if cap_bytes_per_s is None else np.asarray(cap_bytes_per_s, dtype=float)
    if group is None:
        g = np.zeros(n, dtype=np.int64)
        budgets = np.atleast_1d(np.asarray(budget_bytes_per_s, dtype=float))
    else:
        g = np.asarray(group, dtype=np.int64)
        budgets = np.asarray(budget_bytes_per_s, dtype=float)
    if n == 0:
        return np.zeros(0)
    budgets = np.maximum(budgets, 0.0)
    w = np.cbrt(lam * c)  # Theorem 1 weights (λ_i C_i)^(1/3)
    level_of_group = _cube_root_level(w, cap, g, budgets)
    b = np.minimum(cap, np.maximum(level_of_group[g], 0.0) * w)
    if min_interval_s > 0:
        b = _floored_shares(b, w, lam, c, cap, g, budgets, level_of_group, float(min_interval_s))
    return b


def _cube_root_level(w: np.ndarray, cap: np.ndarray, g: np.ndarray, budgets: np.ndarray) -> np.ndarray:
    """Theorem 1/Lemma 2's water level t per group (inf: every job of the group is capped)."""
    n = w.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = cap / w  # the water level at which job i hits its cap
    order = np.lexsort((ratio, g))
    gs, ws, rs = g[order], w[order], ratio[order]
    caps_sorted = cap[order]
    # Group boundaries in the sorted order.
    starts = np.flatnonzero(np.concatenate(([True], gs[1:] != gs[:-1])))
    run = np.diff(starts, append=n)
    start_of = np.repeat(starts, run)
    # Caps of earlier (lower-ratio) jobs; inf caps only ever sit after the answer, so count them as 0.
    finite_cap = np.where(np.isfinite(caps_sorted), caps_sorted, 0.0)
    cum_cap = np.cumsum(finite_cap)
    cap_before = cum_cap - finite_cap - (cum_cap[start_of] - finite_cap[start_of])
    cum_w = np.cumsum(ws)
    group_w = np.add.reduceat(ws, starts)
    w_from = np.repeat(group_w, run) - (cum_w - ws - (cum_w[start_of] - ws[start_of]))
    with np.errstate(divide="ignore", invalid="ignore"):
        level = (budgets[gs] - cap_before) / w_from
    # First job (per group) left uncapped at the level computed assuming all before it are capped.
    ok = level <= rs
    level_of_group = np.full(budgets.shape[0], np.inf)  # inf: every job capped
    first_ok = np.flatnonzero(ok)
    if first_ok.size:
        grp_ok = gs[first_ok]  # sorted: each group's first entry is where the group changes
        idx = np.flatnonzero(np.concatenate(([True], grp_ok[1:] != grp_ok[:-1])))
        level_of_group[grp_ok[idx]] = level[first_ok[idx]]
    return level_of_group


def _floored_shares(
    b: np.ndarray, w: np.ndarray, lam: np.ndarray, c: np.ndarray, cap: np.ndarray, g: np.ndarray,
    budgets: np.ndarray, level_of_group: np.ndarray, min_interval_s: float,
) -> np.ndarray:
    """Re-solve the groups where the floor binds (some b_i above b_i* = 2C_i/(λ_i Δ_min²), the share at which
    Lemma 1's interval is Δ_min) for the common level t of the floored problem (design §2 "Minimum interval").

    Job i's share at level t is min(W_i, w_i·min(t, t_i*^(1/4)·t^(3/4))), continuous and increasing in t; the
    level that hands out the whole budget is found by bisection on log t, per group, vectorised. A group whose
    jobs are all capped keeps its caps (more bandwidth never hurts, the floor or not)."""
    b_star = 2.0 * c / (lam * min_interval_s**2)
    binds = b > b_star
    groups = np.unique(g[binds & np.isfinite(level_of_group[g])])
    if groups.size == 0:
        return b
    code = np.full(budgets.shape[0], -1, dtype=np.int64)
    code[groups] = np.arange(groups.size)
    mine = np.flatnonzero(code[g] >= 0)
    gm, wm, capm = code[g[mine]], w[mine], cap[mine]
    t_star = b_star[mine] / wm
    k = groups.size
    budget = budgets[groups]

    def shares(t: np.ndarray) -> np.ndarray:
        tj = t[gm]
        return np.minimum(capm, wm * np.minimum(tj, t_star**0.25 * tj**0.75))

    # Bracket: at the floorless level every share is at most the floorless one, so the level is no lower; at
    # the level where the job reaching min(W_i, budget) last gets there, the shares add up to at least the
    # budget (or to Σ W_i > budget).
    lo = level_of_group[groups]
    target = np.minimum(capm, budget[gm])
    plain = target / wm
    reach = np.where(plain <= t_star, plain, (target / (wm * t_star**0.25)) ** (4.0 / 3.0))
    hi = np.full(k, -np.inf)
    np.maximum.at(hi, gm, reach)
    hi = np.maximum(hi, lo)
    log_lo, log_hi = np.log(lo), np.log(hi)
    for _ in range(_LEVEL_BISECTIONS):
        mid = 0.5 * (log_lo + log_hi)
        open_ = (mid > log_lo) & (mid < log_hi)
        if not open_.any():
            break
        total = np.bincount(gm, weights=shares(np.exp(mid)), minlength=k)
        over = total > budget
        log_hi = np.where(open_ & over, mid, log_hi)
        log_lo = np.where(open_ & ~over, mid, log_lo)
    out = b.copy()
    out[mine] = shares(np.exp(log_lo))
    return out


def plan_checkpoints(
    jobs: P1Jobs,
    budget_bytes_per_s: float | np.ndarray,
    beta: float = 0.2,
    group: np.ndarray | None = None,
    min_interval_s: float = MIN_INTERVAL_S,
    guaranteed_budget_bytes_per_s: float | np.ndarray | None = None,
    overhead_floor: str = "hazard",
) -> P1Plan:
    """design §2: allocate (Theorem 1/Lemma 2, with the floor), clip the interval (Eq. 9 and the floor), decide
    the final checkpoint.

    ``guaranteed_budget_bytes_per_s`` (shaped like ``budget_bytes_per_s``; None = the budget itself): the part of
    the budget no one can take back — the budget less the research reserve checkpoints borrow (design §4.2). The
    shares and intervals use the whole budget; a `bound` job's transfer time T is taken at its share of the
    guaranteed budget, since research reclaims the borrowed part within a heartbeat and the promise "no
    interruption loses more than L_max" must hold then too (design §2 "Loss budget modes").

    Eq. 9 with the floor Δ_min = `min_interval_s`: Δ_i = clip(sqrt(2C_i/(λ_i b_i)), max(F_i, Δ_min),
    2·L_max,i) with the overhead floor F_i of `overhead_floor_s` (``overhead_floor``: "hazard", the default,
    min(C_i/(β b_i), Lemma 1's interval); "eq9", the paper's C_i/(β b_i)); when the lower bound exceeds the upper the lower bound is used and the job is flagged
    `loss_budget_at_risk`. The shares b_i are the optimum of the problem with the floor (see
    `allocate_checkpoint_bandwidth`). A final checkpoint is emitted iff C_i/b_i + T_r,i <= τ_i (b_i should
    already be a lower-confidence bandwidth).
    """
    lam, c = jobs.hazard_per_s, jobs.ckpt_bytes
    b = allocate_checkpoint_bandwidth(lam, c, budget_bytes_per_s, jobs.cap_bytes_per_s, group,
                                      min_interval_s=min_interval_s)
    with np.errstate(divide="ignore", invalid="ignore"):
        free = optimal_interval_s(lam, c, b)
        lower = np.maximum(overhead_floor_s(c / b, free, beta, overhead_floor), min_interval_s)
        upper = 2.0 * jobs.loss_budget_s
        if jobs.loss_budget_mode is not None and np.any(np.asarray(jobs.loss_budget_mode, dtype=object) == "bound"):
            b_sure = b if guaranteed_budget_bytes_per_s is None else allocate_checkpoint_bandwidth(
                lam, c, guaranteed_budget_bytes_per_s, jobs.cap_bytes_per_s, group, min_interval_s=min_interval_s)
            upper = bound_mode_upper_s(jobs, np.minimum(b_sure, b), upper)  # design §2 "Loss budget modes"
        at_risk = lower > upper
        interval = np.where(at_risk, lower, np.minimum(np.maximum(free, lower), upper))
        final = ~np.isnan(jobs.notice_s) & (c / b + jobs.restart_s <= jobs.notice_s)
        per_job_cost = lam * interval / 2.0 + c / (b * interval)
        if jobs.stall_s is not None and np.any(np.isfinite(jobs.stall_s)):
            interval, at_risk, per_job_cost = _async_intervals(jobs, b, beta, min_interval_s, upper, interval,
                                                               at_risk, per_job_cost, overhead_floor)
        cost = float(np.sum(per_job_cost)) if len(jobs.ids) else 0.0
    return P1Plan(
        ids=jobs.ids,
        bandwidth_bytes_per_s=b,
        interval_s=interval,
        final_checkpoint=final,
        loss_budget_at_risk=at_risk,
        expected_cost=cost,
    )


def _async_intervals(
    jobs: P1Jobs, b: np.ndarray, beta: float, min_interval_s: float, upper: np.ndarray, interval: np.ndarray,
    at_risk: np.ndarray, per_job_cost: np.ndarray, overhead_floor: str = "hazard",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """design §2 "Asynchronous snapshots": for the jobs with a finite stall s_i the checkpoint's cost to the job
    is s_i, not C_i/b_i (the write and the copy run while it trains), so L(Δ) = λΔ/2 + s/Δ and
    Δ_i = clip(sqrt(2 s_i/λ_i), max(F_i, Δ_min, T_i), 2 L_max,i) with T_i = max(measured transfer, C_i/b_i) and
    F_i the overhead floor of `overhead_floor_s` on the stall (s_i/β, or min(s_i/β, sqrt(2 s_i/λ_i)) by default):
    a snapshot is taken only once the previous one is off the node, so the interval is never shorter than the
    transfer. Budget at risk as in Eq. 9. The other jobs keep what the synchronous rule gave them."""
    stall = np.asarray(jobs.stall_s, dtype=float)
    is_async = np.isfinite(stall)
    lam, c = jobs.hazard_per_s, jobs.ckpt_bytes
    s = np.where(is_async, np.maximum(stall, 0.0), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        transfer = c / b
        if jobs.transfer_s is not None:
            transfer = np.fmax(transfer, np.asarray(jobs.transfer_s, dtype=float))  # nan: not measured yet
        free = np.where(s > 0, np.sqrt(2.0 * s / lam), 0.0)  # a free snapshot: as often as the copy allows
        floor = overhead_floor_s(s, np.where(s > 0, free, np.nan), beta, overhead_floor)
        lower = np.fmax(np.maximum(floor, min_interval_s), transfer)  # fmax: an unknown transfer bounds nothing
        risk = lower > upper
        chosen = np.where(risk, lower, np.fmin(np.fmax(free, lower), upper))
        cost = np.nan_to_num(lam * chosen / 2.0 + s / chosen, nan=0.0)  # λ = 0 and Δ = ∞: nothing lost
    return (np.where(is_async, chosen, interval), np.where(is_async, risk, at_risk),
            np.where(is_async, cost, per_job_cost))


def bound_mode_upper_s(jobs: P1Jobs, bandwidth_bytes_per_s: np.ndarray, upper_s: np.ndarray) -> np.ndarray:
    """design §2 "Loss budget modes": a `bound` job loses at most L_max to any interruption the notice does not
    cover. An emergency loses the work since the newest checkpoint already off the node: at most Δ plus the copy
    time T = max(C/b, measured transfer), b the job's *guaranteed* share (``plan_checkpoints`` passes its share of
    the guaranteed budget, never of borrowed reserve). So Δ ≤ L_max − T replaces Eq. 9's 2·L_max for those jobs;
    when that is below the interval floor the floor is used and the job is flagged `loss_budget_at_risk` (as in
    Eq. 9)."""
    mode = np.asarray(jobs.loss_budget_mode, dtype=object)
    bound = mode == "bound"
    if not bound.any():
        return upper_s
    with np.errstate(divide="ignore", invalid="ignore"):
        transfer = jobs.ckpt_bytes / bandwidth_bytes_per_s
        if jobs.transfer_s is not None:
            transfer = np.fmax(transfer, np.asarray(jobs.transfer_s, dtype=float))
        cap_s = jobs.loss_budget_s - transfer  # nan only as ∞ − ∞ (no budget, no bandwidth): Eq. 9's bound
        return np.where(bound & ~np.isnan(cap_s), cap_s, upper_s)


def aggregate_cost(hazard_per_s: np.ndarray, ckpt_bytes: np.ndarray, bandwidth_bytes_per_s: np.ndarray) -> float:
    """Theorem 1's objective at the Lemma 1 intervals: Σ sqrt(2 λ_i C_i / b_i)."""
    with np.errstate(divide="ignore"):
        return float(np.sum(np.sqrt(2.0 * hazard_per_s * ckpt_bytes / bandwidth_bytes_per_s)))


def export_demand(jobs: P1Jobs, plan: P1Plan) -> P1Demand:
    """The per-period demand P1 hands to P3 (design §2, last bullet)."""
    return P1Demand(
        ids=jobs.ids,
        ckpt_bytes=jobs.ckpt_bytes,
        bandwidth_bytes_per_s=plan.bandwidth_bytes_per_s,
        interval_s=plan.interval_s,
        loss_budget_s=jobs.loss_budget_s,
    )
