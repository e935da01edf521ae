"""The evaluation of design §21: the paper's baselines by name, budget violations, the two headline campuses, the
verdict logic, and `make evaluate-quick` (scripts/evaluate.py --quick) end to end: a small report with both
campuses whose last two lines have the exact `evaluate-paper-hazard:` / `evaluate:` formats."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from scheduler.sim.engine import simulate
from scheduler.sim.metrics import budget_violations, summarise
from scheduler.sim.policies import RECLAIMNET, get_policy
from scheduler.sim.report import (
    BASELINES,
    evaluate_line,
    headline_checks,
    pareto_front,
    periodic_floor,
    verdict,
)
from scheduler.sim.trace import from_rows
from scheduler.sim.tracegen import generate, paper_hazard_config
from tests.sim.helpers import star_campus

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
NUM = r"[+-]\d+"
LINE_RE = (rf"informed ratio \d+\.\d\d, vs slurm-pr {NUM}%, vs static-10min {NUM}%, vs static-budget {NUM}%, "
           r"success \d+\.\d%, degradation \d+\.\d%")


# ---- the named baselines ----------------------------------------------------------------------------------------

def test_every_named_baseline_resolves_and_static_10min_is_fixed_600_with_reclaimnets_machinery() -> None:
    for _, name, text in BASELINES:
        assert get_policy(name).name == name and text
    b3 = get_policy("static-10min")
    assert replace(b3, name="x") == replace(get_policy("fixed:600"), name="x")
    # only the interval differs from ReclaimNet: P2 destination, P3 traffic, final checkpoint all kept
    assert replace(b3, name="x", interval="p1") == replace(RECLAIMNET, name="x")
    assert get_policy("slurm-pr").fixed_interval_s == 600.0 and not get_policy("slurm-pr").final_checkpoint


def test_the_papers_way_rows_differ_from_the_ablations_only_where_the_paper_ran_them_differently() -> None:
    """design §21.1 "The paper's way": slurm-pr-paper is slurm-pr without the pre-sync replica (a shared store
    across the core); static-10min-paper is static-10min without admission."""
    slurm, slurm_paper = get_policy("slurm-pr"), get_policy("slurm-pr-paper")
    assert replace(slurm_paper, name="x", checkpoint_store="replica") == replace(slurm, name="x")
    assert slurm_paper.checkpoint_store == "shared" and slurm_paper.traffic == "tcp"
    static, static_paper = get_policy("static-10min"), get_policy("static-10min-paper")
    assert replace(static_paper, name="x", traffic="p3") == replace(static, name="x")


def test_a_shared_store_puts_every_restart_across_the_core() -> None:
    from scheduler.sim.engine import Simulator
    from tests.sim.helpers import star_campus

    rows = star_campus(4, 1.25e8, buildings=2)  # b0: n0, n2; b1: n1, n3
    rows["jobs"] = [{"id": "j0", "submit_s": 0, "gpus": 1, "vram_gb": 0, "min_capability": 0, "work_s": 1e4,
                     "ckpt_bytes": 1e9, "restart_s": 0, "loss_budget_s": 1e9}]
    rows["reclaims"] = [{"node": "n0", "t_s": 1e9, "notice_s": 0}]
    from scheduler.sim.trace import from_rows

    tr = from_rows(rows, 2e4)
    replica = Simulator(tr, get_policy("slurm-pr")).store.tolist()
    shared = Simulator(tr, get_policy("slurm-pr-paper")).store.tolist()
    building = [int(n[1:]) % 2 for n in tr.tables["nodes"]["id"]]
    assert all(building[replica[i]] == building[i] for i in range(4))
    assert all(building[shared[i]] != building[i] for i in range(4))
    with pytest.raises(ValueError, match="checkpoint_store"):
        Simulator(tr, replace(get_policy("slurm-pr"), checkpoint_store="nfs"))


# ---- budget violations --------------------------------------------------------------------------------------------

def _one_emergency(budget_s: float):
    rows = star_campus(2, 1e8)
    rows["jobs"] = [{"id": "j", "submit_s": 0, "gpus": 1, "vram_gb": 0, "min_capability": 0, "work_s": 20000,
                     "ckpt_bytes": 1e9, "restart_s": 10, "loss_budget_s": budget_s}]
    # an emergency at 3000 s on n0: hundreds of seconds of progress lost, between the two budgets
    rows["reclaims"] = [{"node": "n0", "t_s": 3000.0, "notice_s": 0, "return_s": 9000.0}]
    rows["hazard"] = [{"t_s": 0, "per_s": 1e-7}]
    return from_rows(rows, 40000.0)


@pytest.mark.parametrize(("budget_s", "expected"), [(60.0, 1.0), (1e6, 0.0)])
def test_budget_violations_is_the_share_of_interruptions_losing_more_than_the_budget(budget_s: float,
                                                                                      expected: float) -> None:
    tr = _one_emergency(budget_s)
    r = simulate(tr, get_policy("static"))
    assert len(r.interruptions) == 1 and 60.0 < r.interruptions[0].lost_s < 1e6
    assert budget_violations(r) == expected
    assert summarise(r, tr.horizon_s)["budget_violations"] == expected


# ---- the paper-hazard campus ----------------------------------------------------------------------------------------

def test_paper_hazard_campus_has_about_one_emergency_per_lent_node_hour() -> None:
    tr = generate(replace(paper_hazard_config(days=1.0, seed=3), node_scale=0.5))
    per_h = float(np.mean(tr.tables["hazard"]["per_s"])) * 3600
    assert 0.6 < per_h < 1.6
    with pytest.raises(ValueError):
        paper_hazard_config(days=0.0)


# ---- verdict logic on crafted numbers ---------------------------------------------------------------------------------

def test_verdict_says_met_or_missed_and_by_how_much() -> None:
    assert verdict(-69.0, -66.0, at_most=True) == (True, "met by 3.0 points")
    assert verdict(-50.0, -66.0, at_most=True) == (False, "missed by 16.0 points")
    assert verdict(95.0, 91.0, at_most=False) == (True, "met by 4.0 points")
    assert verdict(float("nan"), 0.0, at_most=True)[0] is False


def _nores(work_lost: tuple[float, float], stall: tuple[float, float]) -> dict:
    """The research-zeroed summary: (reclaimnet, static) means of work lost and stall over 8 seeds."""
    return {"work_lost_gpu_h": work_lost, "overhead_gpu_h": stall, "seeds": 8,
            "change_pct": (100 * (work_lost[0] / work_lost[1] - 1), 2.0)}


def _summary(**kw):
    s = {"informed_ratio": 1.02, "vs_slurm-pr": -70.0, "vs_static-10min": -65.0, "vs_static-budget": -5.0,
         "success_pct": 93.0, "degradation_pct": 2.5, "violations": {"reclaimnet": 0.05, "static": 0.3,
                                                                     "oracle": 0.0},
         "front": ["reclaimnet", "static"], "honouring_best": ("static-budget", 12.0), "rn_lost": 10.0,
         "nores": _nores((9.0, 9.5), (3.0, 3.1)), "reconv_min": 16.0}
    s.update(kw)
    return s


def test_headline_checks_all_met_on_numbers_that_meet_every_target() -> None:
    checks = headline_checks(_summary())
    assert len(checks) == 10
    assert all(met for _, _, met in checks), checks


def test_headline_checks_name_each_missed_target_with_its_margin() -> None:
    s = _summary(**{"vs_slurm-pr": -40.0, "informed_ratio": 1.10, "degradation_pct": 4.0, "rn_lost": 15.0,
                    "nores": _nores((12.0, 9.5), (3.0, 3.1)), "front": ["static"], "reconv_min": 30.0,
                    "violations": {"reclaimnet": 0.4, "static": 0.3, "oracle": 0.0}})
    got = {what: (how, met) for what, how, met in headline_checks(s)}
    assert got["work lost at least 66% below `slurm-pr`"] == ("-40%; missed by 26.0 points", False)
    assert got["work lost at least 63% below `static-10min`"][1] is True
    assert got["within 3% of `informed`"] == ("+10.0%; missed by 7.0 points", False)
    assert got["research degradation < 3%"] == ("4.00%; missed by 1.0 points", False)
    assert got["fewer budget violations than every policy but `oracle`"][1] is False
    assert "missed by 10.0" in got["fewer budget violations than every policy but `oracle`"][0]
    assert got["least work lost among the migrating online policies honouring the budgets"][1] is False
    assert "missed by 3.0 GPU-h" in got["least work lost among the migrating online policies honouring the budgets"][0]
    zeroed = "research zeroed, no budget binding: work lost and stall ≤ `static`"
    assert got[zeroed][1] is False
    assert "work lost reclaimnet 12 vs static 9.5 GPU-h (paired +26% ± 2), missed by 2.5 GPU-h" in got[zeroed][0]
    # less work lost but more stall than `static` still misses: the issue asks for both
    stall = {what: met for what, _, met in headline_checks(_summary(nores=_nores((9.0, 9.5), (3.2, 3.1))))}
    assert stall[zeroed] is False
    assert got["on the Pareto front (work lost, degradation, violations) of the online migrating policies"][1] is False
    assert got["re-convergence after the 1.7x hazard step ≤ 18 min"] == ("30 min; missed by 12.0 min", False)


def test_periodic_floor_is_the_best_constant_interval_less_theorem_2s_gap() -> None:
    sweep = {300: 190.0, 420: 179.0, 600: 174.0, 900: 194.0}
    best_s, best, floor = periodic_floor(sweep, 0.08)
    assert (best_s, best) == (600, 174.0)
    assert floor == pytest.approx(174.0 / 1.08)
    assert periodic_floor(sweep, -0.01)[2] == 174.0  # a gap is never negative (Cauchy-Schwarz)


def test_contrast_checks_quote_the_periodic_floor_without_changing_the_verdict() -> None:
    floor = {"best_interval_s": 600, "gap_pct": 8.1, "vs": {"slurm-pr": -35.0, "static-10min": -7.5}}
    got = {what: (how, met) for what, how, met in headline_checks(_summary(periodic_floor=floor))}
    plain = {what: (how, met) for what, how, met in headline_checks(_summary())}
    for policy, pct in (("slurm-pr", "-35"), ("static-10min", "-8")):
        what = next(w for w in got if w.endswith(f"`{policy}`"))
        assert got[what][1] == plain[what][1]
        assert got[what][0].startswith(plain[what][0])
        assert (f"Theorem 2's floor for any periodic policy with this machinery: {pct}% (best constant interval "
                "600 s, adaptivity gap 8.1%)") in got[what][0]
    assert got["work lost never above `static-budget`"] == plain["work lost never above `static-budget`"]


def test_research_zeroed_check_gives_stall_per_running_gpu_hour() -> None:
    nores = {**_nores((9.0, 9.5), (3.2, 3.0)), "running_gpu_h": (32.0, 30.0)}
    (_, how, met), = [c for c in headline_checks(_summary(nores=nores)) if c[0].startswith("research zeroed")]
    assert met is False  # more stall is a miss whatever the exposure
    assert "(per running GPU-h 0.100 vs 0.100; reclaimnet ran +7% GPU-h)" in how


def test_evaluate_line_format_and_pareto_front() -> None:
    line = evaluate_line("evaluate", _summary(**{"vs_slurm-pr": -69.4, "vs_static-budget": 12.2}))
    assert line == ("evaluate: informed ratio 1.02, vs slurm-pr -69%, vs static-10min -65%, vs static-budget +12%, "
                    "success 93.0%, degradation 2.5%")
    pts = {"a": (1.0, 5.0, 0.1), "b": (2.0, 1.0, 0.1), "c": (2.0, 5.0, 0.2), "d": (1.0, 5.0, 0.1)}
    assert pareto_front(pts) == ["a", "b", "d"]  # c is dominated by a; equal points do not dominate each other


# ---- make evaluate-quick: the small report end to end ---------------------------------------------------------------

def test_evaluate_quick_builds_a_report_with_both_campuses(tmp_path: Path) -> None:
    """What `make evaluate-quick` runs (same command), in its own process as make does."""
    proc = subprocess.run([sys.executable, str(SCRIPTS / "evaluate.py"), "--out", str(tmp_path), "--quick",
                           "--jobs", "2"], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout.strip().splitlines()
    assert re.fullmatch("evaluate-paper-hazard: " + LINE_RE, printed[-2]), printed[-2]
    assert re.fullmatch("evaluate: " + LINE_RE, printed[-1]), printed[-1]
    report = (tmp_path / "report.md").read_text()
    assert report.strip().splitlines()[-2:] == printed[-2:]
    for label, name, text in BASELINES:
        assert f"- **{label} `{name}`**: {text}" in report
    assert "Bamboo" in report and "not modelled" in report
    for prefix in ("evaluate-paper-hazard", "evaluate"):
        rows = (tmp_path / f"headline_{prefix}.csv").read_text().splitlines()
        assert rows[0].startswith("policy,seeds,work_lost_gpu_h") and "budget_violations_pct" in rows[0]
        assert {r.split(",")[0] for r in rows[1:]} >= {name for _, name, _ in BASELINES}
    assert (tmp_path / "pareto.png").stat().st_size > 1000
    # the paper-hazard campus's fixed-interval sweep and the floor it gives the two contrasts it bounds
    paper = report[report.index("### Paper-hazard campus"):report.index("### Count-faithful campus")]
    assert "How far below `static-10min` can a policy that checkpoints periodically go?" in paper
    assert "| interval_s | work_lost_gpu_h |" in paper
    assert paper.count("Theorem 2's floor for any periodic policy with this machinery") == 2
    assert "Theorem 2's floor" not in report[report.index("### Count-faithful campus"):]
    # the verdicts in the report follow from the printed numbers (a margin under 0.5 could round either way)
    for line, title in ((printed[-2], "Paper-hazard campus"), (printed[-1], "Count-faithful campus")):
        section = report[report.index(f"### {title}"):]
        section = section[: section.index("`evaluate")]
        for policy, target in (("slurm-pr", -66), ("static-10min", -63), ("static-budget", 0)):
            got = int(re.search(rf"vs {policy} ([+-]\d+)%", line).group(1))
            row = next(r for r in section.splitlines() if f"`{policy}` |" in r and r.startswith("| work lost"))
            if abs(got - target) >= 1:
                assert row.endswith("| yes |" if got <= target else "| NO |"), row
                assert ("met by" if got <= target else "missed by") in row
