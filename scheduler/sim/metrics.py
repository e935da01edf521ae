"""Turn a SimResult into the design §7 numbers (and a few more for the evaluation report).

Definitions (stated in the report too):
- work_lost_gpu_h: GPU-hours of progress lost at reclaims (work redone from the last durable checkpoint)
  plus GPU-hours stalled writing checkpoints — the quantity P1's L(Δ) = λΔ/2 + C/(BΔ) minimises
  (``lost_gpu_h`` and ``overhead_gpu_h`` are reported separately as well);
- downtime: seconds from a job stopping on a reclaimed node to computing again (transfer + restart +
  any wait); interruptions not resumed by the end of the trace count with their time so far;
- migration_success: share of interruptions after which the job resumed on another node having lost no
  more than its loss budget (the failures are split into not moved / emergency over budget / scheduled
  reclaim over budget, i.e. notice too short for a final checkpoint);
- traffic_degradation: research demand not served / research demand, over link-time carrying bulk
  traffic that competes with research (see `scheduler.sim.network`);
- gpu_utilization: useful GPU-time (progress kept) / GPU-time from each job's first start to its end;
- budget_bound_share: share of running GPU-time whose (finite) interval Δ is at or above 2·L_max: Eq. 9's
  upper bound sets Δ, or (loss_budget_at_risk) its floor C/(βb) lies above it; either way not the hazard.
  Policies that ignore budgets count where they plan past it; the oracle (no periodic checkpoints) never.
- budget_violations: share of interruptions in which the job lost more progress than its loss budget L_max
  (design §21.2): a policy that ignores budgets is not cheaper, it breaks a promise. Unlike migration_success it
  counts every interruption whether or not the job moved.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scheduler.sim.engine import SimResult


def budget_violations(r: SimResult) -> float:
    """Share of `r`'s interruptions whose lost progress exceeds the job's loss budget L_max (0 if none)."""
    if not r.interruptions:
        return 0.0
    return round(float(np.mean([x.lost_s > x.budget_s + 1e-9 for x in r.interruptions])), 4)


def summarise(r: SimResult, horizon_s: float) -> dict[str, Any]:
    """design §7 keys first, then extras; plain floats/ints only (JSON-ready)."""
    ints = r.interruptions
    down = np.array([(x.t_resume_s if np.isfinite(x.t_resume_s) else horizon_s) - x.t_stop_s for x in ints])
    moved = np.array([np.isfinite(x.t_resume_s) and x.dest >= 0 and x.dest != x.source for x in ints], dtype=bool)
    over = np.array([x.lost_s > x.budget_s + 1e-9 for x in ints], dtype=bool)
    emergency = np.array([x.emergency for x in ints], dtype=bool)
    ok = moved & ~over
    lost_h = r.lost_gpu_s / 3600.0
    ovh_h = r.overhead_gpu_s / 3600.0
    err = np.nan
    if r.hazard_true_per_s:
        est = np.array(r.hazard_est_per_s[: len(r.hazard_true_per_s)])
        tru = np.array(r.hazard_true_per_s)
        err = float(np.median(np.abs(est - tru) / np.maximum(tru, 1e-12)))
    return {
        "work_lost_gpu_h": round(lost_h + ovh_h, 4),
        "downtime_median_s": round(float(np.median(down)), 2) if down.size else 0.0,
        "downtime_p99_s": round(float(np.percentile(down, 99)), 2) if down.size else 0.0,
        "migration_success": round(float(np.mean(ok)), 4) if ok.size else 1.0,
        "budget_violations": budget_violations(r),
        "traffic_degradation": round(r.research_deficit_bytes / r.research_demand_bytes, 4)
        if r.research_demand_bytes > 0 else 0.0,
        "gpu_utilization": round(r.useful_gpu_s / r.resident_gpu_s, 4) if r.resident_gpu_s > 0 else 0.0,
        "jobs_done": int(r.jobs_done),
        "lost_gpu_h": round(lost_h, 4),
        "overhead_gpu_h": round(ovh_h, 4),
        "running_gpu_h": round(r.running_gpu_s / 3600.0, 4),  # GPU-time computing or stalled (exposure to reclaims)
        "interruptions": len(ints),
        # why migrations failed (each failed interruption counted once, in this order)
        "fail_not_moved": int(np.sum(~moved)),
        "fail_emergency_over_budget": int(np.sum(moved & over & emergency)),
        "fail_scheduled_over_budget": int(np.sum(moved & over & ~emergency)),
        "hazard_rel_error_median": None if np.isnan(err) else round(err, 4),
        "migrated_tb": round(r.migration_bytes / 1e12, 4),
        "reserve_fraction": round(r.reserve_fraction, 4),
        # how often the loss budget, not the hazard, sets the interval: running GPU-time with Δ ≥ 2·L_max
        "budget_bound_share": round(r.budget_bound_gpu_s / r.running_gpu_s, 4) if r.running_gpu_s > 0 else 0.0,
        "exp_em_lost_gpu_h": round(r.expected_lost_gpu_s / 3600.0, 4)
        if r.hazard_true_per_s and r.expected_lost_gpu_s > 0 else None,
    }
