"""Oracle bound, determinism and policy naming."""

from __future__ import annotations

import pytest

from scheduler.sim.engine import simulate
from scheduler.sim.metrics import summarise
from scheduler.sim.policies import ABLATIONS, get_policy
from scheduler.sim.tracegen import GenConfig, generate

ONLINE = ("reclaimnet", "reclaimnet-strict", "reclaimnet-reserve", "informed", "slurm-pr", "static-budget", "no-migration", "static", "random-dst", "no-admission", "tv-fixed",
          "fixed:300", "fixed:3600", *(p.name for p in ABLATIONS))


def _small(seed: int):
    return generate(GenConfig(days=3.0, seed=seed, n_jobs=14, total_gpu_h=120.0, departures=60,
                              node_scale=0.2, drift_start_day=1.5, drift_days=0.5))


@pytest.mark.parametrize("seed", [1, 2])
def test_oracle_never_beaten_on_small_random_traces(seed: int) -> None:
    tr = _small(seed)
    oracle = summarise(simulate(tr, get_policy("oracle")), tr.horizon_s)["work_lost_gpu_h"]
    for name in ONLINE:
        got = summarise(simulate(tr, get_policy(name)), tr.horizon_s)["work_lost_gpu_h"]
        assert oracle <= got + 1e-9, (name, got, oracle)


def test_deterministic_for_a_seed() -> None:
    tr = _small(4)
    a = summarise(simulate(tr, get_policy("random-dst"), seed=7), tr.horizon_s)
    b = summarise(simulate(tr, get_policy("random-dst"), seed=7), tr.horizon_s)
    assert a == b
    assert generate(GenConfig(days=1.0, seed=9, node_scale=0.2, n_jobs=5, total_gpu_h=20.0, departures=10)
                    ).tables["reclaims"]["t_s"].tolist() == generate(
        GenConfig(days=1.0, seed=9, node_scale=0.2, n_jobs=5, total_gpu_h=20.0, departures=10)
    ).tables["reclaims"]["t_s"].tolist()


def test_policy_names() -> None:
    assert get_policy("fixed:120").fixed_interval_s == 120.0
    assert len({p.name for p in ABLATIONS}) == 8
    for bad in ("fixed:abc", "fixed:-1", "nope"):
        with pytest.raises(ValueError):
            get_policy(bad)
