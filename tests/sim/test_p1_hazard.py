"""What the simulator's P1 plans against (design §2 "Estimators"): the estimator's posterior mean λ̂ (not λ⁺), plus
the rate of scheduled reclaims whose notice is too short for the job's final checkpoint — fed exactly as the
portal's tick feeds it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from scheduler.sim.engine import Simulator
from scheduler.sim.policies import get_policy
from scheduler.sim.trace import Trace, from_rows
from tests.sim.helpers import poisson_trace, star_campus


def _short_notice_campus(notice_s: float, horizon_s: float = 12 * 3600.0) -> Trace:
    """Two nodes with a long job each; node n0 is reclaimed every 30 min with ``notice_s`` of notice and lent again
    a minute after its deadline."""
    rows = star_campus(2, 1e8)
    rows["jobs"] = [{"id": f"j{k}", "submit_s": 0, "gpus": 1, "vram_gb": 0, "min_capability": 0, "work_s": 1e12,
                     "ckpt_bytes": 5e9, "restart_s": 10, "loss_budget_s": 1e9} for k in range(2)]
    rows["reclaims"] = [{"node": "n0", "t_s": t, "notice_s": notice_s, "return_s": t + notice_s + 60.0}
                        for t in np.arange(900.0, horizon_s - 600.0, 1800.0)]
    return from_rows(rows, horizon_s)


def _run(trace: Trace, **changes: object) -> Simulator:
    sim = Simulator(trace, replace(get_policy("reclaimnet"), **changes), seed=0)
    sim.run()
    return sim


def test_p1_plans_at_the_posterior_mean_and_lambda_plus_on_request() -> None:
    tr = poisson_trace(4, 4, 2 / 3600, 6 * 3600.0, 1e9, 1e8, seed=2)
    mean = _run(tr)
    assert mean.pol.plan_hazard_quantile is None
    t = mean.tr.horizon_s  # the estimates of a control period at the end (departures since the last one count)
    mean._refresh_hazard(t)
    assert np.array_equal(mean.lam_up, mean.hz.hazard_per_s(t))
    upper = _run(tr, plan_hazard_quantile=0.95)
    upper._refresh_hazard(t)
    assert np.allclose(upper.lam_up, upper.hz.hazard_upper_per_s(t))
    assert np.all(upper.lam_up > mean.lam_up)


def test_short_notice_scheduled_reclaims_shorten_the_interval_long_ones_do_not() -> None:
    short = _run(_short_notice_campus(5.0))  # 5 GB at 0.7·B⁻ needs ~70 s: a 5 s notice is an emergency
    assert short.sched_rates is not None and short.sched_rates[0].max() > 0
    idx = np.flatnonzero(short.node >= 0)
    assert np.all(short._short_notice_hazard(idx) > 0)
    off = _run(_short_notice_campus(5.0), short_notice_hazard=False)
    assert off.sched_rates is None
    assert np.mean(short.delta[idx]) < np.mean(off.delta[np.flatnonzero(off.node >= 0)])
    long = _run(_short_notice_campus(4000.0))  # notice enough for any final checkpoint: no hazard added
    idx = np.flatnonzero(long.node >= 0)
    assert np.all(long._short_notice_hazard(idx) == pytest.approx(0.0, abs=1e-12))
