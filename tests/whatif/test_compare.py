"""``scheduler.sim.whatif`` (no Django): the progress callback only observes, the report's tables, the Pareto
front and its SVG, and the choice checks naming the field."""

from __future__ import annotations

import pytest

from scheduler.sim.engine import simulate
from scheduler.sim.metrics import summarise
from scheduler.sim.policies import get_policy
from scheduler.sim.trace import TraceError
from scheduler.sim.tracegen import GenConfig, generate
from scheduler.sim.whatif import _front, check_choice, compare, pareto_svg, to_csv

TINY = GenConfig(days=1.0, n_jobs=4, total_gpu_h=20.0, departures=4, node_scale=0.1, drift_start_day=0.5,
                 drift_days=0.25)


def test_progress_observes_without_changing_results() -> None:
    trace = generate(TINY)
    fractions: list[float] = []
    with_cb = simulate(trace, get_policy("slurm-pr"), seed=2, progress=fractions.append)
    without = simulate(trace, get_policy("slurm-pr"), seed=2)
    assert summarise(with_cb, trace.horizon_s) == summarise(without, trace.horizon_s)
    assert fractions == sorted(fractions) and fractions[0] >= 0.0 and fractions[-1] <= 1.0 and len(fractions) > 10
    calls: list[tuple[float, str]] = []
    report = compare(trace, ["static", "slurm-pr"], [0, 1], progress=lambda f, label: calls.append((f, label)))
    assert [c[0] for c in calls] == sorted(c[0] for c in calls) and calls[-1][0] == 1.0
    assert {label for _, label in calls} == {"static seed 0", "static seed 1", "slurm-pr seed 0", "slurm-pr seed 1"}
    assert report == compare(trace, ["static", "slurm-pr"], [0, 1])  # the same report without the callback
    slurm = next(r for r in report["runs"] if r["policy"] == "slurm-pr" and r["seed"] == 1)
    alone = summarise(simulate(trace, get_policy("slurm-pr"), seed=1), trace.horizon_s)
    assert {k: slurm[k] for k in alone} == alone  # the numbers `python -m scheduler.sim` prints
    row = next(r for r in report["table"] if r["policy"] == "slurm-pr")
    runs = [r["work_lost_gpu_h"] for r in report["runs"] if r["policy"] == "slurm-pr"]
    assert row["work_lost_gpu_h"] == pytest.approx(sum(runs) / 2, abs=1e-4)
    assert row["work_lost_gpu_h_min"] == min(runs) and row["work_lost_gpu_h_max"] == max(runs)
    lost = sum(c["lost_gpu_h"] for c in report["classes"] if c["policy"] == "slurm-pr" and c["kind"] == "group")
    assert lost == pytest.approx(row["lost_gpu_h"], abs=1e-3)  # per-class loss adds up to the policy's
    assert to_csv(report, "runs").splitlines()[0].startswith("policy,seed,")
    assert len(to_csv(report, "classes").splitlines()) == 1 + len(report["classes"])


def test_front_and_svg() -> None:
    assert _front([(0.1, 5.0), (0.3, 1.0), (0.4, 6.0), (0.1, 5.0)]) == [True, True, False, True]
    report = {"pareto": [{"policy": "a<b>", "traffic_degradation": 0.1, "work_lost_gpu_h": 2.0, "on_front": True},
                         {"policy": "c", "traffic_degradation": 0.3, "work_lost_gpu_h": 3.0, "on_front": False}]}
    svg = pareto_svg(report)
    assert svg.startswith("<svg") and svg.count("<circle") == 2 and "a&lt;b&gt;" in svg and "<b>" not in svg
    assert "<script" not in svg and "style=" not in svg


@pytest.mark.parametrize(("policies", "seeds", "field"), [
    ([], [0], "policies"), (["nope"], [0], "policies"), (["static"], [], "seeds"), (["static"], [-1], "seeds"),
    (["static"], [True], "seeds"), (["static", "oracle"], list(range(40)), "seeds")])
def test_check_choice_names_the_field(policies: list[str], seeds: list, field: str) -> None:
    with pytest.raises(TraceError) as refused:
        check_choice(policies, seeds)
    assert refused.value.field == field


def test_check_choice_accepts_the_simulators_names() -> None:
    assert check_choice(["reclaimnet", "fixed:300", "abl-101", "static+fair", "static"], [3, 3, 0]) == (
        ["reclaimnet", "fixed:300", "abl-101", "static+fair", "static"], [3, 0])


def _table(**work_lost_gpu_h: float) -> dict:
    return {"table": [{"policy": name.replace("_", "-").replace("fixed-", "fixed:"), "work_lost_gpu_h": v}
                      for name, v in work_lost_gpu_h.items()]}


def test_simpler_wins_names_each_rival_that_lost_less_and_the_setting_that_would_close_the_gap() -> None:
    from scheduler.sim.whatif import simpler_wins

    report = _table(reclaimnet=10.0, fixed_900=9.0, random_dst=9.5, static=10.04, oracle=5.0, no_admission=12.0)
    wins = simpler_wins(report)
    assert [w["policy"] for w in wins] == ["fixed:900", "random-dst"]  # best first; a 0.4% gap is a tie
    first = wins[0]
    assert first["margin_pct"] == pytest.approx(11.1)
    assert "fixed:900 loses less work than ReclaimNet" in first["words"]
    assert "RECLAIMNET_MIN_CHECKPOINT_INTERVAL_S = 900" in first["setting"]
    assert "destination (P2)" in wins[1]["decision"]


def test_simpler_wins_is_empty_without_reclaimnet_or_when_it_loses_least() -> None:
    from scheduler.sim.whatif import simpler_wins

    assert simpler_wins(_table(static=1.0, fixed_600=2.0)) == []
    assert simpler_wins(_table(reclaimnet=1.0, static=1.2, informed=0.5)) == []


def test_compare_carries_the_simpler_wins_of_its_own_table() -> None:
    from scheduler.sim.whatif import simpler_wins

    report = compare(generate(TINY), ["reclaimnet", "fixed:60", "static"])
    assert report["simpler_wins"] == simpler_wins(report)


def test_the_decision_named_is_read_from_the_policys_switches() -> None:
    """Two policies with the same switches get the same words whatever their names; an ablation is covered."""
    from scheduler.sim.whatif import _rival_decision

    assert _rival_decision("slurm-pr-paper")[0] == _rival_decision("static-10min-paper")[0] == \
        _rival_decision("no-admission")[0]  # fixed interval on TCP: research's share is the larger difference
    assert _rival_decision("abl-101")[0] == _rival_decision("random-dst")[0] == "the destination (P2)"
    assert "= 1200" in _rival_decision("fixed:1200")[1]
