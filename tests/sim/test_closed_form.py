"""Validation of the simulator against closed forms (design §2 Lemma 1, Theorem 2)."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.estimators import adaptivity_gap
from scheduler.sim.engine import SimResult, Simulator
from scheduler.sim.policies import Policy
from scheduler.sim.trace import from_rows

from .helpers import poisson_trace, star_campus

HAZARD_PER_S = 1 / 3600.0
CKPT_BYTES = 4.5e8
BW_BYTES_PER_S = 1e8  # C/B = 4.5 s, so Δ* = sqrt(2C/(λB)) = 180 s and λΔ* = 0.05 (first-order regime)
DELTA_STAR_S = float(np.sqrt(2 * CKPT_BYTES / (HAZARD_PER_S * BW_BYTES_PER_S)))


def _fixed(delta_s: float) -> Policy:
    return Policy(f"fixed:{delta_s:g}", interval="fixed", fixed_interval_s=delta_s, bandwidth_split="equal",
                  destination="first_fit", traffic="tcp", final_checkpoint=False)


def _closed_form(delta_s: float) -> float:
    return HAZARD_PER_S * delta_s / 2 + CKPT_BYTES / (BW_BYTES_PER_S * delta_s)


def _rates(r: SimResult) -> tuple[float, float]:
    """(realised, expected) loss-plus-overhead per unit of running time."""
    realised = (r.lost_gpu_s + r.overhead_gpu_s) / r.running_gpu_s
    expected = (r.expected_lost_gpu_s + r.overhead_gpu_s) / r.running_gpu_s
    return realised, expected


@pytest.fixture(scope="module")
def poisson() -> dict[float, SimResult]:
    tr = poisson_trace(n_nodes=6, n_jobs=3, hazard_per_s=HAZARD_PER_S, horizon_s=20 * 86400.0,
                       ckpt_bytes=CKPT_BYTES, bw_bytes_per_s=BW_BYTES_PER_S, seed=3)
    return {d: Simulator(tr, _fixed(d), period_s=3600.0).run() for d in (DELTA_STAR_S / 2, DELTA_STAR_S,
                                                                        2 * DELTA_STAR_S)}


def test_loss_rate_matches_lemma1_closed_form(poisson: dict[float, SimResult]) -> None:
    """Stationary Poisson λ, constant B, fixed Δ: simulated rate ≈ λΔ/2 + C/(BΔ) within 3%.

    The closed form is first order in λΔ and C/(BΔ); at Δ*/2 the neglected C/(BΔ)² term alone is ~3%, so
    the check runs at Δ* and 2Δ*."""
    for d in (DELTA_STAR_S, 2 * DELTA_STAR_S):
        realised, expected = _rates(poisson[d])
        assert expected == pytest.approx(_closed_form(d), rel=0.03)
        # the realised loss is the same quantity with Poisson noise (≈1,400 reclaims here)
        assert realised == pytest.approx(_closed_form(d), rel=0.10)
        assert len(poisson[d].interruptions) > 1000


def test_young_daly_interval_minimises_simulated_cost(poisson: dict[float, SimResult]) -> None:
    """Lemma 1's Δ* beats Δ*/2 and 2Δ* in the simulator too (closed form: both cost 1.25 L*)."""
    cost = {d: _rates(r)[1] for d, r in poisson.items()}
    assert cost[DELTA_STAR_S] < cost[DELTA_STAR_S / 2]
    assert cost[DELTA_STAR_S] < cost[2 * DELTA_STAR_S]
    real = {d: _rates(r)[0] for d, r in poisson.items()}
    assert real[DELTA_STAR_S] < min(real[DELTA_STAR_S / 2], real[2 * DELTA_STAR_S])


def _two_regime_trace(epoch_s: float = 12 * 3600.0, days: float = 20.0) -> tuple:
    """λ and B alternate every 12 h, positively correlated (λB not constant, so Theorem 2's gap > 0)."""
    rows = star_campus(4, 2e7)
    n_ep = int(days * 86400 / epoch_s)
    lam = np.where(np.arange(n_ep) % 2 == 0, 1 / 36000.0, 1 / 144000.0)
    bw = np.where(np.arange(n_ep) % 2 == 0, 8e7, 2e7)
    rows["bandwidth"] = [{"link": lk["id"], "t_s": k * epoch_s, "bytes_per_s": float(bw[k])}
                         for lk in rows["links"] for k in range(n_ep)]
    rows["hazard"] = [{"t_s": k * epoch_s, "per_s": float(lam[k])} for k in range(n_ep)]
    rows["jobs"] = [{"id": f"j{k}", "submit_s": 0, "gpus": 1, "vram_gb": 0, "min_capability": 0,
                     "work_s": 1e12, "ckpt_bytes": 4e8, "restart_s": 0, "loss_budget_s": 1e9} for k in range(2)]
    rows["reclaims"] = []
    return from_rows(rows, days * 86400.0), lam, bw


def test_measured_adaptivity_gap_matches_theorem2() -> None:
    """Truth-adaptive Δ_t (Lemma 1 per epoch) vs the best fixed Δ: measured gap within 1 point of Thm 2."""
    tr, lam, bw = _two_regime_trace()
    c = 4e8
    delta_fixed = float(np.sqrt(2 * c * np.mean(1 / bw) / np.mean(lam)))
    adapt = Simulator(tr, Policy("truth", interval="truth", bandwidth_split="equal", destination="first_fit",
                                 traffic="tcp", final_checkpoint=False), period_s=3600.0).run()
    fixed = Simulator(tr, _fixed(delta_fixed), period_s=3600.0).run()
    measured = _rates(fixed)[1] / _rates(adapt)[1] - 1
    predicted = adaptivity_gap(lam, bw)
    assert predicted > 0.05
    assert abs(measured - predicted) < 0.01
