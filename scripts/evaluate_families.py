"""Every online policy on every trace family, paired by seed, plus a regret report per family (design §21.5).

    .venv/bin/python scripts/evaluate_families.py [--out reports/families] [--jobs 2] [--seeds 8] [--quick]
        [--families drift,correlated] [--extra-policies NAME,...] [--no-regret] [--knob FAMILY.KNOB=VALUE ...]
        [--hindsight]

Prints one line per family (each rival's margin), then as its last line
    families: F families x S seeds, reclaimnet at or below every rival on K, worst margin M% (family X), vs random-dst D%, vs best fixed interval P%
A margin is 100·(mean work lost of reclaimnet / the rival's − 1) over the paired seeds (−12% = ReclaimNet loses 12%
less); a margin ≤ +0.5% counts as at or below. Rivals are compared at equal constraints: one whose mean research
degradation is more than 3 points above ReclaimNet's (the TCP policies) has its margin printed, not counted. K counts the families where reclaimnet is at or below every rival; M is
the largest margin over all families and rivals (X its family); D and P are the largest margins over the families
against random-dst and against the best constant interval of the sweep (`fixed:N` with ReclaimNet's machinery, best per
family). 'oracle' and 'informed' know the future and are no rivals. The regret report (reports/families/FAMILY.md,
regret.csv) swaps one decision of ReclaimNet at a time for a rival's rule and gives the work-lost difference per swap.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.sim import families as fam
from scheduler.sim.engine import Simulator
from scheduler.sim.metrics import summarise
from scheduler.sim.policies import RECLAIMNET, Policy, get_policy
from scheduler.sim.report import DEGRADATION_TARGET_PCT
from scheduler.sim.trace import Trace

RIVALS = ("random-dst", "tv-fixed", "static-budget", "static-10min", "slurm-pr", "no-admission", "static")
PAPER_RIVALS = ("slurm-pr-paper", "static-10min-paper")  # the paper's baselines as the paper ran them, if defined
SWEEP_INTERVALS_S = (300, 600, 1200, 2400)  # ReclaimNet's machinery with a constant interval; 600 s = static-10min
TIE_PCT = 0.5
# single-decision swaps of ReclaimNet (design §21.5): (label, decision kind, the rule swapped in, policy name)
SWAPS = (
    ("interval=static", "interval (P1)", "Young/Daly at trace-wide means, equal split", "abl-011"),
    ("interval=static-budget", "interval (P1)", "Young/Daly at trace-wide means clipped to the loss budgets",
     "swap:interval=static-budget"),
    ("interval=tv", "interval (P1)", "Young/Daly at hour-of-day means", "tv-fixed"),
    ("interval=best-fixed", "interval (P1)", "the sweep's best constant interval", "best-fixed"),
    ("destination=random", "destination (P2)", "a random node that fits", "random-dst"),
    ("destination=first-fit", "destination (P2)", "the first node that fits", "abl-101"),
    ("rate=tcp", "admitted rate (P3)", "no admission, TCP proportional share", "no-admission"),
    ("rate=equal-split", "admitted rate (P3)", "checkpoint bandwidth split equally (no Theorem 1 split)",
     "swap:bandwidth_split=equal"),
    ("placement=fair", "placement", "the fair queue of design §16.5 instead of fifo", "reclaimnet+fair"),
)
QUICK_KNOBS: dict[str, Any] = {"nodes": 6, "days": 1.0}
KEYS = ("work_lost_gpu_h", "lost_gpu_h", "overhead_gpu_h", "migration_success", "interruptions", "fail_not_moved",
        "traffic_degradation", "jobs_done")


def _fixed(interval_s: int) -> str:
    return "static-10min" if interval_s == 600 else f"fixed:{interval_s}"


def resolve(name: str) -> Policy:
    """A policy by name: the design §7 names, plus ``swap:FIELD=VALUE`` (ReclaimNet with one switch changed)."""
    if name.startswith("swap:"):
        key, value = name.removeprefix("swap:").split("=", 1)
        return replace(RECLAIMNET, name=name, **{key: value})
    return get_policy(name)


def available(names: tuple[str, ...]) -> tuple[str, ...]:
    """The names among `names` that policies.py defines (the paper-way rows may not exist yet)."""
    out = []
    for n in names:
        try:
            get_policy(n)
        except ValueError:
            continue
        out.append(n)
    return tuple(out)


_TRACES: dict[tuple[str, int, tuple], Trace] = {}


def _trace(family: str, seed: int, knobs: tuple) -> Trace:
    key = (family, seed, knobs)
    if key not in _TRACES:
        _TRACES[key] = fam.build(family, seed, **dict(knobs))
    return _TRACES[key]


# The calibration trace of seed s is the same family and knobs at seed s + CALIBRATION_SEED_OFFSET: the campus's
# previous period. Every policy reads its trace-wide hazard means from it (static, static-budget's and tv-fixed's
# intervals, ReclaimNet's prior), never from the evaluated trace, whose hour-of-day counts over a few days would
# tell a "static" rival when this trace's reclaims come (design §21.5 "No rival reads the future").
CALIBRATION_SEED_OFFSET = 1000


def _run(task: tuple[str, int, tuple, str, bool]) -> tuple[str, int, str, dict[str, Any]]:
    family, seed, knobs, policy, hindsight = task
    tr = _trace(family, seed, knobs)
    calibration = None if hindsight else _trace(family, seed + CALIBRATION_SEED_OFFSET, knobs)
    s = summarise(Simulator(tr, resolve(policy), seed=0, calibration=calibration).run(), tr.horizon_s)
    return family, seed, policy, {k: s[k] for k in KEYS}


def margin_pct(rn_mean: float, rival_mean: float) -> float:
    """100·(rn/rival − 1); 0 when both are 0, +inf when only the rival's is 0."""
    if rival_mean <= 0:
        return 0.0 if rn_mean <= 0 else math.inf
    return 100.0 * (rn_mean / rival_mean - 1.0)


def best_fixed(means: dict[str, float]) -> str:
    """The constant-interval policy of the sweep with the least mean work lost."""
    return min((_fixed(n) for n in SWEEP_INTERVALS_S if _fixed(n) in means), key=lambda p: means[p])


def family_margins(means: dict[str, float], rivals: tuple[str, ...]) -> dict[str, float]:
    """Margins of reclaimnet against each rival and against 'best-fixed' (mean work lost per policy in)."""
    out = {r: margin_pct(means["reclaimnet"], means[r]) for r in rivals if r in means}
    if any(_fixed(n) in means for n in SWEEP_INTERVALS_S):
        out["best-fixed"] = margin_pct(means["reclaimnet"], means[best_fixed(means)])
    return out


def equal_constraints(degradation_pct: dict[str, float], rivals: tuple[str, ...]) -> tuple[str, ...]:
    """The rivals held to ReclaimNet's research constraint: their mean research-traffic degradation at most
    DEGRADATION_TARGET_PCT points above reclaimnet's (design §21.5 "At equal constraints"). A policy that takes
    the links from research (`static`, `no-admission`, `slurm-pr` on TCP: 35-45% degraded on every family) loses
    less work by breaking the promise P3 keeps; its margin is printed, not counted."""
    limit = degradation_pct["reclaimnet"] + DEGRADATION_TARGET_PCT
    return tuple(r for r in rivals if degradation_pct.get(r, math.inf) <= limit)


def verdict_line(margins: dict[str, dict[str, float]], seeds: int) -> str:
    """The last line from per-family margins {family: {rival: margin %}} (module docstring)."""
    k = sum(all(m <= TIE_PCT for m in ms.values()) for ms in margins.values())
    worst_f, worst = max(((f, max(ms.values())) for f, ms in margins.items()), key=lambda x: x[1])
    d = max(ms.get("random-dst", -math.inf) for ms in margins.values())
    p = max(ms.get("best-fixed", -math.inf) for ms in margins.values())
    return (f"families: {len(margins)} families x {seeds} seeds, reclaimnet at or below every rival on {k}, "
            f"worst margin {worst:+.1f}% (family {worst_f}), vs random-dst {d:+.1f}%, vs best fixed interval {p:+.1f}%")


def _spread(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of a 95% t-interval (0 for one value)."""
    a = np.asarray(values, dtype=float)
    if a.size < 2:
        return float(a.mean()) if a.size else 0.0, 0.0
    return float(a.mean()), float(2.0 * a.std(ddof=1) / math.sqrt(a.size))


def regret(results: dict[tuple[str, int, str], dict[str, Any]], family: str, seeds: list[int], best: str
           ) -> list[dict[str, Any]]:
    """Per swap: the paired difference of work lost (swap − reclaimnet, GPU-h) over seeds and what moved."""
    rows = []
    for label, kind, rule, pol in SWAPS:
        pol = best if pol == "best-fixed" else pol
        if any((family, s, pol) not in results for s in seeds):
            continue
        diff = [results[(family, s, pol)]["work_lost_gpu_h"] - results[(family, s, "reclaimnet")]["work_lost_gpu_h"]
                for s in seeds]
        m, h = _spread(diff)
        rn = float(np.mean([results[(family, s, "reclaimnet")]["work_lost_gpu_h"] for s in seeds]))
        sw = {k: float(np.mean([results[(family, s, pol)][k] for s in seeds])) for k in KEYS}
        base = {k: float(np.mean([results[(family, s, "reclaimnet")][k] for s in seeds])) for k in KEYS}
        wins = sum(d < 0 for d in diff)
        rows.append({"family": family, "swap": label, "decision": kind, "rule": rule, "policy": pol,
                     "diff_gpu_h": round(m, 3), "ci95_gpu_h": round(h, 3),
                     "diff_pct": round(100 * m / rn, 1) if rn > 0 else 0.0, "swap_wins_seeds": wins,
                     "seeds": len(seeds), "rn_lost_gpu_h": round(base["lost_gpu_h"], 3),
                     "swap_lost_gpu_h": round(sw["lost_gpu_h"], 3),
                     "rn_overhead_gpu_h": round(base["overhead_gpu_h"], 3),
                     "swap_overhead_gpu_h": round(sw["overhead_gpu_h"], 3),
                     "rn_migration_success": round(base["migration_success"], 3),
                     "swap_migration_success": round(sw["migration_success"], 3)})
    return rows


def _words(r: dict[str, Any]) -> str:
    """One regret row in plain words."""
    pct, h = r["diff_pct"], r["ci95_gpu_h"]
    where = (f"checkpoint overhead {r['rn_overhead_gpu_h']:.2f} → {r['swap_overhead_gpu_h']:.2f} GPU-h, "
             f"lost at reclaims {r['rn_lost_gpu_h']:.2f} → {r['swap_lost_gpu_h']:.2f} GPU-h, migration success "
             f"{100 * r['rn_migration_success']:.0f}% → {100 * r['swap_migration_success']:.0f}%")
    sig = abs(r["diff_gpu_h"]) > h
    if r["diff_gpu_h"] < 0:
        verdict = f"would have lost {-pct:.1f}% less here ({-r['diff_gpu_h']:.2f} ± {h:.2f} GPU-h"
    else:
        verdict = f"would have lost {pct:.1f}% more ({r['diff_gpu_h']:.2f} ± {h:.2f} GPU-h"
    verdict += f", better on {r['swap_wins_seeds']} of {r['seeds']} seeds{'' if sig else '; within noise'})"
    return f"- {r['decision']}: {r['rule']} (`{r['policy']}`) {verdict}; {where}."


def _write(out: Path, fam_names: list[str], seeds: list[int], policies: list[str],
           results: dict[tuple[str, int, str], dict[str, Any]], margins: dict[str, dict[str, float]],
           regrets: dict[str, list[dict[str, Any]]], knobs: dict[str, tuple], lines: list[str], wall_s: float,
           hindsight: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "runs.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["family", "seed", "policy", *KEYS])
        for (f, s, p), r in sorted(results.items()):
            w.writerow([f, s, p, *(r[k] for k in KEYS)])
    allrows = [r for f in fam_names for r in regrets.get(f, [])]
    if allrows:
        with (out / "regret.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(allrows[0]))
            w.writeheader()
            w.writerows(allrows)
    means_from = ("the evaluated trace itself (--hindsight)" if hindsight else
                  f"each seed's calibration trace (seed + {CALIBRATION_SEED_OFFSET}, the campus's previous period)")
    index = ["# Trace families (design §21.5)", "", f"{len(fam_names)} families x {len(seeds)} seeds "
             f"(seeds {seeds[0]}–{seeds[-1]}), {len(policies)} policies, {wall_s:.0f} s wall. Trace-wide hazard "
             f"means (static, static-budget, tv-fixed, ReclaimNet's prior) from {means_from}.", "", "```", *lines,
             "```", ""]
    for f in fam_names:
        means = {p: float(np.mean([results[(f, s, p)]["work_lost_gpu_h"] for s in seeds])) for p in policies
                 if all((f, s, p) in results for s in seeds)}
        k = fam.knobs(f, **dict(knobs[f]))
        body = [f"# Family {f}: regret report (design §21.5)", "", f"Source: {fam.SOURCE[f]}.", "",
                "Knobs: " + ", ".join(f"{a}={b}" for a, b in vars(k).items()), "",
                f"Seeds {seeds[0]}–{seeds[-1]}, paired. Mean work lost (GPU-h) per policy; margin = reclaimnet "
                "against it:", "", "| policy | work lost GPU-h | margin |", "|---|---|---|"]
        for p, v in sorted(means.items(), key=lambda x: x[1]):
            mg = margin_pct(means["reclaimnet"], v)
            body.append(f"| {p} | {v:.3f} | {mg:+.1f}% |")
        body += ["", "## Single-decision swaps (ReclaimNet with one decision replaced by a rival's rule)", "",
                 "Difference = the swap's work lost minus ReclaimNet's, mean ± 95% half-width over the paired seeds; "
                 "negative = the rival's rule would have lost less here.", ""]
        body += [_words(r) for r in regrets.get(f, [])] or ["(no swaps run)"]
        worse = [r for r in regrets.get(f, []) if r["diff_gpu_h"] < 0]
        if worse:
            top = min(worse, key=lambda r: r["diff_gpu_h"])
            body += ["", f"Where ReclaimNet loses most here: {top['decision']} ({top['swap']}, "
                     f"{-top['diff_pct']:.1f}% less with the rival's rule)."]
        else:
            body += ["", "No single swap loses less than ReclaimNet here."]
        (out / f"{f}.md").write_text("\n".join(body) + "\n")
        index.append(f"- [{f}]({f}.md): " + ", ".join(f"{r} {m:+.1f}%" for r, m in margins[f].items()))
    (out / "report.md").write_text("\n".join(index) + "\n")


def parse_knobs(specs: list[str]) -> dict[str, dict[str, Any]]:
    """``FAMILY.KNOB=VALUE`` overrides (value parsed as int, float, or kept as text)."""
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        lhs, value = spec.split("=", 1)
        family, knob = lhs.split(".", 1)
        v: Any = value
        for conv in (int, float):
            try:
                v = conv(value)
                break
            except ValueError:
                continue
        out.setdefault(family, {})[knob] = v
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="reports/families")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=None, help="default 8 (quick: 2)")
    ap.add_argument("--quick", action="store_true", help="tiny families (6 nodes, 1 day), 2 seeds")
    ap.add_argument("--families", default=",".join(fam.FAMILIES))
    ap.add_argument("--extra-policies", default="", help="more policies to run and compare (comma separated)")
    ap.add_argument("--no-regret", action="store_true", help="skip the single-decision swaps")
    ap.add_argument("--knob", action="append", default=[], help="FAMILY.KNOB=VALUE (repeatable)")
    ap.add_argument("--hindsight", action="store_true",
                    help="trace-wide hazard means from the evaluated trace itself, not its calibration trace")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    fam_names = [f for f in args.families.split(",") if f]
    for f in fam_names:
        fam.knobs(f)  # ValueError on an unknown family
    seeds = list(range(1, (args.seeds or (2 if args.quick else 8)) + 1))
    overrides = parse_knobs(args.knob)
    knobs = {f: tuple(sorted({**(QUICK_KNOBS if args.quick else {}), **overrides.get(f, {})}.items()))
             for f in fam_names}
    rivals = RIVALS + available(PAPER_RIVALS) + tuple(p for p in args.extra_policies.split(",") if p)
    policies = ["reclaimnet", *rivals, *(_fixed(n) for n in SWEEP_INTERVALS_S if _fixed(n) not in rivals)]
    if not args.no_regret:
        policies += [pol for _, _, _, pol in SWAPS if pol != "best-fixed" and pol not in policies]
    for p in policies:
        resolve(p)  # fail before any run
    tasks = [(f, s, knobs[f], p, args.hindsight) for f in fam_names for s in seeds for p in policies]
    results: dict[tuple[str, int, str], dict[str, Any]] = {}
    if args.jobs <= 1:
        outs = map(_run, tasks)
    else:
        pool = ProcessPoolExecutor(max_workers=args.jobs)
        outs = pool.map(_run, tasks, chunksize=max(1, len(policies) // 2))
    for f, s, p, r in outs:
        results[(f, s, p)] = r
    if args.jobs > 1:
        pool.shutdown()
    margins: dict[str, dict[str, float]] = {}
    regrets: dict[str, list[dict[str, Any]]] = {}
    lines = []
    for f in fam_names:
        means = {p: float(np.mean([results[(f, s, p)]["work_lost_gpu_h"] for s in seeds])) for p in policies}
        degradation = {p: 100.0 * float(np.mean([results[(f, s, p)]["traffic_degradation"] for s in seeds]))
                       for p in policies}
        rv = tuple(p for p in rivals if p in means)
        held = equal_constraints(degradation, rv)
        margins[f] = family_margins(means, held)
        breaking = {r: margin_pct(means["reclaimnet"], means[r]) for r in rv if r not in held}
        best = best_fixed(means)
        regrets[f] = [] if args.no_regret else regret(results, f, seeds, best)
        at_or_below = all(m <= TIE_PCT for m in margins[f].values())
        lines.append(f"family {f}: reclaimnet {means['reclaimnet']:.2f} GPU-h, "
                     + ", ".join(f"{r.replace('best-fixed', f'best-fixed({best})')} {m:+.1f}%"
                                 for r, m in margins[f].items())
                     + (" [at or below all]" if at_or_below else "")
                     + ("; not at equal constraints: " + ", ".join(
                         f"{r} {m:+.1f}% (research degraded {degradation[r]:.0f}% vs {degradation['reclaimnet']:.1f}%)"
                         for r, m in breaking.items()) if breaking else ""))
    lines.append(verdict_line(margins, len(seeds)))
    _write(Path(args.out), fam_names, seeds, policies, results, margins, regrets, knobs, lines,
           time.perf_counter() - t0, hindsight=args.hindsight)
    for f in fam_names:
        for r in regrets[f]:
            if r["diff_gpu_h"] < 0:
                print(f"regret {f}: {r['swap']} {r['diff_pct']:+.1f}% ({r['diff_gpu_h']:+.2f} ± {r['ci95_gpu_h']:.2f} GPU-h)")
    print(f"wrote {args.out}/report.md, one FAMILY.md per family, runs.csv, regret.csv "
          f"({len(tasks)} runs, {time.perf_counter() - t0:.0f} s)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
