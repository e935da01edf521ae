"""Trace families (design §21.5, scheduler/sim/families.py): deterministic per seed, eight seeds apart, and each
family's knobs change what defines it. The evaluation over the families is `make evaluate-families`; here only
what its verdict line is computed from (scripts/evaluate_families.py) and one tiny run of it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from scheduler.sim import families as fam
from scheduler.sim.engine import simulate
from scheduler.sim.metrics import summarise
from scheduler.sim.policies import get_policy
from scheduler.sim.trace import from_rows
from scheduler.sim.tracegen import DAY_S
from tests.sim.helpers import star_campus

SMALL = {"nodes": 6, "days": 1.0}
ROOT = Path(__file__).resolve().parents[2]


def _evaluate_families():
    spec = importlib.util.spec_from_file_location("evaluate_families", ROOT / "scripts" / "evaluate_families.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["evaluate_families"] = mod
    spec.loader.exec_module(mod)
    return mod


def _reclaims(tr) -> list[tuple]:
    r = tr.tables["reclaims"]
    return list(zip(r["node"].tolist(), r["t_s"].tolist(), r["notice_s"].tolist(), strict=True))


@pytest.mark.parametrize("name", list(fam.FAMILIES))
def test_a_family_is_the_same_trace_for_a_seed_and_another_for_each_of_eight_seeds(name: str) -> None:
    assert _reclaims(fam.build(name, 3, **SMALL)) == _reclaims(fam.build(name, 3, **SMALL))
    distinct = {tuple(_reclaims(fam.build(name, seed, **SMALL))) for seed in range(1, 9)}
    assert len(distinct) == 8, f"{name}: only {len(distinct)} different reclaim tables over 8 seeds"


def test_families_are_at_least_six_and_each_names_its_source() -> None:
    assert len(fam.FAMILIES) >= 6
    assert set(fam.SOURCE) == set(fam.FAMILIES)
    tr = fam.build("drift", 1, **SMALL)
    assert tr.meta["family"] == "drift" and tr.meta["knobs"]["factor"] == 3.0


def test_an_unknown_family_or_knob_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown family 'spot'"):
        fam.knobs("spot")
    with pytest.raises(ValueError, match=r"unknown knob.*hazard_per_h"):
        fam.knobs("drift", hazard_per_h=1.0)
    with pytest.raises(ValueError, match="at most 16 nodes"):
        fam.knobs("small-pool", nodes=17)
    with pytest.raises(ValueError, match="mode"):
        fam.build("drift", 1, mode="sine", **SMALL)


def test_the_drift_step_multiplies_the_measured_hazard_by_its_factor() -> None:
    days = 6.0
    half = days * DAY_S / 2
    ratios = {}
    for factor in (1.0, 4.0):
        before = after = 0.0
        for seed in range(1, 5):
            tr = fam.build("drift", seed, nodes=12, days=days, factor=factor, base_per_h=0.1)
            before += fam.departures_per_lent_h(tr, 0.0, half)
            after += fam.departures_per_lent_h(tr, half, 2 * half)
        ratios[factor] = after / before
    assert 0.6 < ratios[1.0] < 1.6, ratios
    assert 2.5 < ratios[4.0] < 6.5, ratios


def test_diurnal_lab_owners_come_back_at_peak_hours() -> None:
    k = fam.knobs("diurnal-lab")
    at_peak = off_peak = 0
    for seed in range(1, 5):
        r = fam.build("diurnal-lab", seed, nodes=12, days=5.0).tables["reclaims"]
        leave = r["t_s"][r["t_s"] > 0] + r["notice_s"][r["t_s"] > 0]
        weekday = ((leave // DAY_S) % 7) < 5
        peak = np.asarray(fam.diurnal_profile(leave, k)) > 1.0
        at_peak += int(np.sum(peak & weekday))
        off_peak += int(np.sum(~peak & weekday))
    peak_h = sum(hi - lo for lo, hi in k.peaks)
    per_h_peak, per_h_off = at_peak / peak_h, off_peak / (24.0 - peak_h)
    assert per_h_peak > 4 * per_h_off, (per_h_peak, per_h_off)


def test_a_correlated_event_takes_every_lent_node_of_its_provider_at_the_same_second() -> None:
    tr = fam.build("correlated", 2, nodes=12, days=3.0, background_per_h=0.0)
    nd, r = tr.tables["nodes"], tr.tables["reclaims"]
    building = dict(zip(nd["id"].tolist(), nd["building"].tolist(), strict=True))
    by_time: dict[float, set[str]] = {}
    for node, t in zip(r["node"].tolist(), r["t_s"].tolist(), strict=True):
        if t > 0:
            by_time.setdefault(t, set()).add(node)
    assert by_time, "no provider event in three days"
    assert all(len({building[n] for n in nodes}) == 1 for nodes in by_time.values())
    assert max(len(nodes) for nodes in by_time.values()) >= 2
    events = tr.meta["events"]
    assert len(by_time) <= len(events)


def test_spot_nodes_have_one_gpu_and_pod_list_jobs_have_the_trace_sizes() -> None:
    spot = fam.build("spot-1gpu", 1, **SMALL)
    assert set(spot.tables["nodes"]["gpus"].tolist()) == {1.0}
    assert set(spot.tables["jobs"]["gpus"].tolist()) == {1.0}
    sizes = set()
    for seed in range(1, 5):
        sizes |= set(fam.build("pod-list", seed, nodes=12, days=2.0).tables["jobs"]["gpus"].tolist())
    assert sizes <= {1.0, 2.0, 4.0} and 1.0 in sizes and len(sizes) >= 2


def test_small_pool_drops_many_nodes_at_once() -> None:
    tr = fam.build("small-pool", 4, nodes=12, days=3.0)
    r = tr.tables["reclaims"]
    times = r["t_s"][r["t_s"] > 0] + r["notice_s"][r["t_s"] > 0]
    _, counts = np.unique(np.round(times, 6), return_counts=True)
    assert counts.max() >= 6, counts


def test_a_drain_on_a_node_alone_in_its_building_runs_on_to_the_deadline() -> None:
    """A node alone in its building is its own pre-sync replica (engine buddy): with every other node full, a
    scheduled reclaim must not drain the job's final checkpoint onto the node that is leaving."""
    rows = star_campus(3, 1.25e8, buildings=2)  # b0: n0, n2; b1: n1 alone
    rows["jobs"] = [{"id": f"j{k}", "submit_s": 0, "gpus": 1, "vram_gb": 0, "min_capability": 0,
                     "work_s": 40_000, "ckpt_bytes": 2e9, "restart_s": 10, "loss_budget_s": 1e9}
                    for k in range(3)]
    rows["reclaims"] = [{"node": "n1", "t_s": 5_000, "notice_s": 120, "return_s": 9_000}]
    tr = from_rows(rows, 80_000)
    for name in ("reclaimnet", "static", "static-budget", "random-dst", "tv-fixed", "static-10min"):
        s = summarise(simulate(tr, get_policy(name)), tr.horizon_s)
        assert s["jobs_done"] == 3, (name, s)
        assert s["interruptions"] == 1, (name, s)


def test_margins_and_the_verdict_line_count_a_tie_within_half_a_percent() -> None:
    ev = _evaluate_families()
    assert ev.margin_pct(99.0, 100.0) == pytest.approx(-1.0)
    means = {"reclaimnet": 100.0, "random-dst": 99.7, "static": 120.0, "fixed:300": 101.0, "fixed:600": 102.0}
    margins = ev.family_margins(means, ("random-dst", "static"))
    assert margins["random-dst"] == pytest.approx(100 * (100 / 99.7 - 1))
    line = ev.verdict_line({"a": margins, "b": {"random-dst": -3.0, "static": -10.0}}, 8)
    assert line.startswith("families: 2 families x 8 seeds, reclaimnet at or below every rival on 2,")
    assert "vs random-dst +0.3%" in line
    line = ev.verdict_line({"a": {"random-dst": 0.6}, "b": {"random-dst": -3.0}}, 8)
    assert "on 1," in line and "(family a)" in line


def test_the_trace_wide_means_come_from_the_calibration_trace_when_one_is_given() -> None:
    """design §21.5 "No rival reads the future": static's, static-budget's and tv-fixed's hazard means (and
    ReclaimNet's prior) are read from the campus's previous period, not from the trace being evaluated."""
    from scheduler.sim.engine import Simulator

    evaluated = fam.build("correlated", 1, **SMALL)
    calibration = fam.build("correlated", 1001, **SMALL)
    own = Simulator(evaluated, get_policy("tv-fixed"))
    honest = Simulator(evaluated, get_policy("tv-fixed"), calibration=calibration)
    reference = Simulator(calibration, get_policy("tv-fixed"))
    assert own.hazard_means_from == "evaluated trace" and honest.hazard_means_from == "calibration"
    assert honest.mean_hazard_per_s == reference.mean_hazard_per_s != own.mean_hazard_per_s
    assert honest.prior_hazard_per_s == reference.prior_hazard_per_s
    assert honest.tv_hazard.tolist() == reference.tv_hazard.tolist() != own.tv_hazard.tolist()
    assert honest.tv_bw.tolist() == own.tv_bw.tolist()  # bandwidth is measured online: the evaluated trace's


def test_evaluate_families_quick_prints_the_verdict_line_and_a_regret_report(tmp_path: Path) -> None:
    ev = _evaluate_families()
    assert ev.main(["--out", str(tmp_path), "--quick", "--jobs", "1", "--seeds", "1",
                    "--families", "drift,correlated"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "calibration trace (seed + 1000" in report
    assert (tmp_path / "drift.md").read_text().startswith("# Family drift: regret report")
    lines = [ln for ln in report.splitlines() if ln.startswith("families: ")]
    assert len(lines) == 1 and lines[0].startswith("families: 2 families x 1 seeds, reclaimnet at or below every")


def test_a_rival_that_takes_the_links_from_research_is_not_counted_at_equal_constraints() -> None:
    ev = _evaluate_families()
    degradation = {"reclaimnet": 0.1, "static": 40.0, "random-dst": 0.2, "tv-fixed": 3.1, "no-admission": 3.2}
    held = ev.equal_constraints(degradation, ("static", "random-dst", "tv-fixed", "no-admission"))
    assert held == ("random-dst", "tv-fixed")
