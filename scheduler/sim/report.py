"""Markdown evaluation report: the paper's numbers (design §6) beside the measured ones, the
targets with an honest pass/fail, the definitions used, and how external traces were mapped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from scheduler.p1 import optimal_interval_s
from scheduler.sim import adapters


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:  # NaN
            return "n/a"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def _lemma1_min(hazard_per_s: float | None) -> float:
    """Lemma 1's interval in minutes for the paper's median 3.2 GB checkpoint at 570 Mbit/s (70% of 820)."""
    if not hazard_per_s:
        return float("nan")
    return float(optimal_interval_s(np.array([hazard_per_s]), np.array([3.2e9]), np.array([570e6 / 8]))[0]) / 60


def _below(pct: float) -> str:
    return f"{pct:.0f}% below" if pct >= 0 else f"{-pct:.0f}% above (worse)"


def _theorem2_bound(predicted_gap: float) -> list[str]:
    """What re-planning Δ can gain over the best constant interval (Theorem 2), against the 38% target."""
    lines = ["Theorem 2 bounds what re-planning Δ can gain over the best *constant* interval by the adaptivity",
             f"gap ({100 * predicted_gap:.1f}% predicted on this trace; the paper's own trace: 5.2%). Static "
             "Young/Daly at trace-wide means is close to that best constant interval."]
    if predicted_gap < 0.38:
        lines += ["So a loss 38% below static cannot come from P1's intervals alone. What else separates them:",
                  "Theorem 1's bandwidth split (it matters only where jobs share a node's budget), P2's",
                  "placement, the final-checkpoint test on a scheduled reclaim (P1: C/b + T_r ≤ τ at P3's (1 − β)·",
                  "B⁻; static: at the trace-mean bandwidth), and two parts that trade work loss for something",
                  "else by design (P3: research's reserve; Eq. 9: the loss budgets), which `static-budget` and",
                  "the ablation measure (see Findings)."]
    return lines


def _findings(table: list[dict], abl_rows: list[dict], relaxed_rows: list[dict]) -> list[str]:
    """A few measured contrasts that explain the main table (computed, not hand-written numbers)."""
    t = {r["policy"]: r for r in table}
    a = {r["policy"].split(" ")[0]: r for r in abl_rows}
    x = {r["policy"]: r for r in relaxed_rows}
    out = []
    if {"abl-111", "abl-110"} <= set(a):
        out.append(f"- P3 on vs off (P1, P2 on): checkpoint stall {_fmt(a['abl-111']['overhead_gpu_h'])} vs "
                   f"{_fmt(a['abl-110']['overhead_gpu_h'])} GPU-h, research degradation "
                   f"{_fmt(100 * a['abl-111']['traffic_degradation'])}% vs "
                   f"{_fmt(100 * a['abl-110']['traffic_degradation'])}%. Under P3 a pre-sync write gets at least "
                   "P1's b_i and borrows the idle rest of its node's checkpoint budget (the link's B⁻ less "
                   "admitted migrations and the part of research's reserve research uses) but never the reserve "
                   "research uses; without P3 it takes a TCP share of the whole link, research included, so each "
                   "write is faster and research pays for it.")
    if {"reclaimnet", "static"} <= set(t):
        out.append(f"- Loss budgets: ReclaimNet honours Eq. 9's Δ ≤ 2·L_max; with this campus's low emergency "
                   f"hazard that forces checkpoints far more often than Young/Daly (stall "
                   f"{_fmt(t['reclaimnet']['overhead_gpu_h'])} vs {_fmt(t['static']['overhead_gpu_h'])} GPU-h). "
                   f"Without budgets (sensitivity table) ReclaimNet loses {_fmt(x.get('reclaimnet', {}).get('work_lost_gpu_h'))}"
                   f" vs static {_fmt(x.get('static', {}).get('work_lost_gpu_h'))} GPU-h.")
    if {"reclaimnet", "static-budget", "static"} <= set(t) and "abl-110" in a:
        sb, st, rn, nop3 = (t["static-budget"]["work_lost_gpu_h"], t["static"]["work_lost_gpu_h"],
                            t["reclaimnet"]["work_lost_gpu_h"], a["abl-110"]["work_lost_gpu_h"])
        out.append(f"- Same loss budgets, on this campus: static Young/Daly clipped by Eq. 9 (`static-budget`) loses "
                   f"{_fmt(sb)} GPU-h against static's {_fmt(st)} ({_fmt(sb - st)} GPU-h for honouring the "
                   f"budgets; stall {_fmt(t['static-budget']['overhead_gpu_h'])} vs "
                   f"{_fmt(t['static']['overhead_gpu_h'])}). ReclaimNet without P3 (abl-110) loses {_fmt(nop3)} "
                   f"({_fmt(nop3 - sb)} vs `static-budget`), with P3 {_fmt(rn)} ({_fmt(rn - nop3)} more for "
                   f"research's reserve: degradation {_fmt(100 * t['reclaimnet']['traffic_degradation'])}% vs "
                   f"{_fmt(100 * t['static-budget']['traffic_degradation'])}% for `static-budget`). The "
                   "volatile-campus table shows how these parts move with the hazard and across seeds.")
    if {"reclaimnet", "informed"} <= set(t):
        inf, rn = t["informed"]["work_lost_gpu_h"], t["reclaimnet"]["work_lost_gpu_h"]
        verdict = ("so λ⁺/B⁻ estimation is not what separates ReclaimNet from static here" if inf >= 0.9 * rn
                   else f"so perfect estimates would save {100 * (1 - inf / rn):.0f}%")
        out.append(f"- Estimation: P1 with the true λ(t), B(t) (`informed`) loses {_fmt(inf)} vs {_fmt(rn)} GPU-h "
                   f"with the estimators, {verdict}.")

    def _exp(r: dict) -> float | None:
        e = r.get("exp_em_lost_gpu_h")
        return None if e is None else e + r["overhead_gpu_h"]
    for label, rows in (("with loss budgets", t), ("without loss budgets", x)):
        if {"static", "reclaimnet", "informed"} <= set(rows) and _exp(rows["static"]) is not None:
            out.append(f"- Expected emergency loss + stall {label} (no Poisson noise): static "
                       f"{_fmt(_exp(rows['static']))}, reclaimnet {_fmt(_exp(rows['reclaimnet']))}, informed "
                       f"{_fmt(_exp(rows['informed']))} GPU-h.")
    out.append("- Scheduled reclaims whose notice is shorter than C/b + T_r also lose work (the job runs to the "
               "deadline), but P1's λ counts emergencies only (design §2), so the realised loss hazard on jobs is "
               "higher than the λ P1 plans with.")
    out.append("- Eq. 9's upper bound Δ ≤ 2·L_max makes the *expected* loss per reclaim ≈ L_max, not a bound: a "
               "reclaim late in a cycle loses up to Δ + C/b > L_max, so many emergencies on budget-bound jobs "
               "exceed their budget even when P1 meets Eq. 9. `lost_gpu_h` is one draw of ~50 emergencies per policy (each loses a uniform "
               "share of its cycle), so small differences in it are noise; `exp_em_lost_gpu_h` "
               "(∫ λ_true · work at risk dt) is its variance-free expectation for emergencies.")
    return out


def _md(rows: list[dict[str, Any]], cols: list[str]) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)


ORACLE_DEF = """The **offline oracle** knows every future reclaim (time, node, notice) and the true bandwidth. It takes
no periodic checkpoints. Just before each reclaim that hits one of its jobs it either saves the job at
the cost of one *local-disk* write (C / 1 GB/s, the fastest write any policy has; the copy off the node
is assumed to have been done in the background with foresight) or, if cheaper, lets the work since the
last restart be lost — whichever is smaller. It places and migrates jobs on the feasible node whose next
reclaim is furthest in the future (ties: widest path), restarts them after T_r, and its transfers are
counted as using spare capacity only (research degradation 0 by construction). It is therefore a lower
bound on work lost (loss + checkpoint stall) for every online policy on its own trajectory; the test
suite checks that no online policy beats it on small random traces."""

DEFINITIONS = """- **work lost (GPU-h)** = GPU-hours of progress lost at reclaims (redone from the last durable checkpoint)
  **plus** GPU-hours stalled writing checkpoints — the quantity P1's L(Δ) = λΔ/2 + C/(BΔ) minimises.
  The two parts are also shown separately (`lost_gpu_h`, `overhead_gpu_h`). The paper's column appears to
  count lost progress only; compare `lost_gpu_h` with it.
- **downtime**: from the job stopping on the reclaimed node to computing again (transfer + restart + any
  wait for a free GPU); unresumed interruptions count until the end of the trace.
- **migration success**: the job resumed on another node having lost ≤ its loss budget L_max.
- **research-traffic degradation**: research demand not served / research demand, on links while they
  carry bulk traffic that competes with research (migrations, and pre-sync writes for their duty cycle).
  Under P3 (HTB at the egress) admitted migrations are AF41 at their P3 rate; research keeps its reserve
  min(R, B_min), B_min the link's calibrated reserve (design §4.1: at least 30% of B); a pre-sync write
  (CS1) is guaranteed P1's b_i and borrows up to the agent's ceil, the line less admitted migrations and
  the part of research's reserve research uses (work-conserving, design §4.2), so research demand *above*
  its reserve is degraded while a write runs; admitted migrations borrow the idle reserve too; recovery and
  unadmitted transfers scavenge what research and writers leave. Without P3 (slurm-pr, static,
  no-admission) all bulk flows share each link with research in proportion to demand (a bulk flow
  demands the 1 Gbit/s line rate), which is how long TCP flows crowd out interactive traffic.
- **exp_em_lost_gpu_h**: ∫ λ_true(t) · (GPU-work at risk) dt, the expected emergency loss given each
  policy's checkpoint trajectory (generated traces only: they carry the true hazard; not for the oracle,
  which saves just before each reclaim it foresees). Realised `lost_gpu_h` also contains scheduled
  reclaims whose notice was too short for a final checkpoint.
- **GPU utilisation**: useful GPU-time (progress kept) / GPU-time from each job's first start to its end
  (or the end of the trace). The paper's denominator (all lent GPU-time) is not recoverable from design §6.
- The simulator is event-driven with a 600 s control period (bandwidth samples, estimator updates, P1
  re-plan, P3 re-admission); between events progress, durability and stalls are closed-form."""

MODEL_NOTES = """- A running job alternates Δ of work with a synchronous checkpoint of C bytes written off the node at its
  actual rate (to a buddy node in the same building: the pre-sync); the checkpoint is durable when the
  write ends. Every policy is charged the same stall C / (actual rate) (B_eff = min(W, B), W = 1 GB/s
  local disk); a writer competes with the other writers on its link by their expected number writing at
  once (the sum of their duty cycles s/(Δ+s)) in both the TCP and the P3 regime. A unit test checks that
  for one job on a constant-bandwidth Poisson trace the simulated loss-plus-stall rate at P1's Δ and b
  equals P1's expected_cost within 3%. Emergency reclaim loses the progress since the last durable checkpoint; the replica holder
  is where the recovery transfer starts (design §3).
- Scheduled reclaim: P1's final-checkpoint test (C/b + T_r ≤ τ with b = P3's migration budget (1 − β)·B⁻ of
  the access link, β its calibrated reserve share) decides whether the job drains now and sends its final
  checkpoint straight to the P2 destination as a P3-admitted flow. If it fits only without T_r, or P2 finds no
  destination, the final checkpoint goes to the pre-sync replica and the job waits in the queue (design §1
  warn → drain → force). If it does not fit at all, the job keeps computing and is evicted at the deadline
  like an emergency.
- Estimators are the production `HazardEstimator` (groups = buildings) and `BandwidthEstimator` fed with
  three noisy (sd 10%) samples per control period, one instance for each link's bandwidth (P3's capacity
  B, hence P1's budget B_ckpt = (1 − β)·B⁻ − admitted migrations, design §4) and one for what research
  leaves of it (P2's transfer-time estimates).
- `static` = Lemma 1 at trace-wide means of λ and available bandwidth, first-fit, no P3; `tv-fixed` =
  Lemma 1 at trace-wide hour-of-day means (Theorem 2's state-independent policy) with P2/P3;
  `slurm-pr` = 10-minute checkpoints, notice ignored, requeue after 60 s, first fit, TCP;
  `no-migration` = checkpoints to local disk only, the job waits for its node to come back;
  ablation: P1 off = static interval + equal split, P2 off = first fit, P3 off = TCP sharing;
  `informed` (not a design §7 name) = ReclaimNet with P1 fed the true λ(t) and link bandwidth instead
  of the estimators' λ⁺ and B⁻ (P2/P3 unchanged): what perfect estimates would buy;
  `reclaimnet-strict` (not a design §7 name) = ReclaimNet with Eq. 9 fed L_max/2, so Δ ≤ L_max: the loss
  budget read as a bound on every emergency rather than on the expected loss;
  `static-budget` (not a design §7 name) = `static` with its interval clipped by Eq. 9 to the same loss
  budgets (the same `scheduler.p1.plan_checkpoints` call at trace-wide means) and its traffic under the same
  research reserve (P3): what the budgets cost a fixed-interval policy, apart from what P1's adaptivity buys;
  every policy with P3 traffic keeps research's reserve per link as the portal calibrates it (design §4.1: each
  day, max(p95 of research's share of the link over the last 7 days, β = 0.3); the trace's first day stands in
  for the logs before it); `reclaimnet-beta` = ReclaimNet with β on every link instead.
- Links are shared by both directions (no full-duplex split); a gang job runs on one node; jobs queue
  FIFO with backfill and are first placed first-fit (the oracle: future-aware); pre-sync goes to a buddy
  node in the same building over the source's access link.
- Bandwidth and research demand are piecewise constant per 10-minute sample; sub-sample bursts of
  research traffic are not modelled. The generator's research demand is 15-40% of the link, often above
  β = 30%, which the calibrated reserve covers (`reclaimnet-beta` shows the degradation β alone leaves).
- Earlier versions of this simulator held every ReclaimNet pre-sync to exactly its P1 share b_i of 70% of
  what research left (a reserve on top of research's own use, and no borrowing of idle budget), while
  baselines wrote at a TCP share of the whole link. On the default campus that asymmetry cost ReclaimNet
  about 45 GPU-h of checkpoint stall (172 → 127 GPU-h; static 48 → 46); what remains of its stall is
  mostly Eq. 9's Δ ≤ 2·L_max (see the sensitivity table) and the conservative λ⁺."""


def write_report(out: Path, *, stats: list, table: list[dict], cols: list[str], abl_rows: list[dict],
                 relaxed_rows: list[dict], ext_rows: list[dict], ext_names: list[str], paper: dict, predicted_gap: float,
                 measured_gap: float, reconv_min: float, dip: float, haz_err: float | None, plots: list[str], ratio: float,
                 vs_slurm: float, vs_static: float, success: float, degradation: float, no_adm_deg: float,
                 runtime_s: float, quick: bool, extra: dict[str, Any] | None = None) -> Path:
    """Write report.md into `out` and return its path. `extra` (all optional): gap_rows, drift_rows,
    rep_rows, research_rows, fail_rows + fail_cols, oracle_theory, informed_pct, strict_success, strict_loss."""
    x = extra or {}
    lines = ["# ReclaimNet trace-driven evaluation", ""]
    if quick:
        lines += ["**QUICK RUN** (10-day campus, no external traces): not the evaluation of record.", ""]
    lines += ["Numbers marked **paper** are copied from design §6 (the paper's 54-node, two-month deployment);",
              "everything else is **measured** here by `scheduler.sim`, which drives the production",
              "`scheduler.p1`, `scheduler.p2`, `scheduler.p3` and `scheduler.estimators` code.", "",
              f"Runtime of this evaluation: {runtime_s:.0f} s.", ""]
    lines += headline_section(x.get("headline") or [])
    lines += ["## Generated campus trace vs design §6", "",
              "| statistic | generated (measured) | target (paper) |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in stats]
    lines += ["", "Deviation: design §6's *mean ≈ 0.99/h per spot-priced GPU-h* cannot hold together with 847",
              "departures over 54 nodes x 60 days (that is ≈ 0.011 departures per node-hour overall). The",
              "generator matches the departure count, the emergency share and the diurnal/drift shape, so its",
              "hazard level per lent node is far below 0.99/h; Young/Daly intervals are correspondingly long.",
              "Two of the paper's own numbers point to the other reading (λ ≈ 1/h): its static Young/Daly",
              f"interval is 10 minutes; Lemma 1 gives {_lemma1_min(1 / 3600):.0f} min for a 3.2 GB checkpoint at",
              f"1/h and 570 Mbit/s (at this campus's mean hazard, {_lemma1_min(x.get('campus_hazard_per_s')):.0f}"
              " min), and an 18-minute re-convergence needs tens of",
              "emergencies per hour campus-wide (see the re-convergence table). A campus at ≈ 1/h with 847",
              "departures cannot exist, so this report keeps the count and states what it changes; the",
              "volatile-campus table runs the main contrasts at 8x and 32x this hazard.",
              "", "## Main comparison (measured)", "", _md(table, cols), "",
              "## The paper's Table (paper, design §6) next to the measured values", "",
              "| policy | loss GPU-h paper / measured (lost-only) | median downtime s paper / measured | "
              "success % paper / measured | degradation % paper / measured | util % paper / measured |",
              "|---|---|---|---|---|---|"]
    for row in table:
        p = paper.get(row["policy"])
        if p is None:
            continue
        lines.append(f"| {row['policy']} | {_fmt(p[0])} / {_fmt(row['work_lost_gpu_h'])} "
                     f"({_fmt(row['lost_gpu_h'])}) | {_fmt(p[1])} / {_fmt(row['downtime_median_s'])} | "
                     f"{_fmt(p[2])} / {_fmt(100 * row['migration_success'])} | {_fmt(p[3])} / "
                     f"{_fmt(100 * row['traffic_degradation'])} | {_fmt(p[4])} / "
                     f"{_fmt(100 * row['gpu_utilization'])} |")
    rep = {r["policy"]: r for r in x.get("rep_rows", [])}
    rn_rep = rep.get("reclaimnet", {})
    d0 = (x.get("drift_rows") or [{}])[0]
    drift_first = d0.get("median_first_within_10pct_min")
    res_rows = [r for r in x.get("research_rows", []) if r["policy"] == "reclaimnet" and r["research_scale"] < 1]
    checks = [
        ("ReclaimNet work loss within 5% of the oracle (paper 7.7%; withdrawn, design §21: see `informed`)",
         f"ratio {ratio:.2f} (first-order theory for the median job ≈ {_fmt(x.get('oracle_theory'))}; vs the "
         f"hindsight-rates reference `informed`: {_fmt(x.get('informed_pct'))}%)", ratio <= 1.05),
        ("≥ 66% below slurm-pr", _below(vs_slurm) + (f"; mean over {rn_rep.get('seeds')} campuses "
                                                    f"{rn_rep.get('% below slurm-pr')}% below" if rn_rep else ""),
         vs_slurm >= 66),
        ("≥ 38% below static Young/Daly (withdrawn, design §21.1: the paper's 38% is over Bamboo)", _below(vs_static) + (
            f"; mean over {rn_rep.get('seeds')} campuses {rn_rep.get('% below static')}% below (negative = above)"
            if rn_rep else "") + (
            f"; against static held to the same loss budgets (`static-budget`): {_below(x['vs_static_budget'])}"
            if "vs_static_budget" in x else "") + "".join(
            f"; {r['hazard_x']}x-hazard campuses: {r['% below static']}% below" for r in x.get("hazard_rows", [])
            if r["policy"] == "reclaimnet" and r["hazard_x"] != 1),
         vs_static >= 38),
        ("migration success > 91%", f"{success:.1f}%" + (
            f"; reading L_max as a per-event bound (`reclaimnet-strict`): {_fmt(x['strict_success'])}% at "
            f"{_fmt(x['strict_loss'])} GPU-h lost" if "strict_success" in x else "") + "".join(
            f"; {r['hazard_x']}x-hazard campuses: {r['migration_success']}%" for r in x.get("hazard_rows", [])
            if r["policy"] == "reclaimnet" and r["hazard_x"] != 1), success > 91),
        ("research degradation < 3%", f"{degradation:.2f}%" + "".join(
            f"; at {r['research_scale']}x research load {_fmt(100 * r['traffic_degradation'])}%" for r in res_rows) + (
            f"; reserve fixed at β = 0.3 on every link (`reclaimnet-beta`):"
            f" {_fmt(100 * x['reserve']['traffic_degradation'])}% at {_fmt(x['reserve']['work_lost_gpu_h'])} GPU-h lost"
            if "reserve" in x else ""),
         degradation < 3),
        ("no-admission degradation > 25%", f"{no_adm_deg:.1f}%", no_adm_deg > 25),
        ("Theorem 2 gap measured within 1 point of predicted (Δ inside an epoch)",
         f"predicted {100 * predicted_gap:.2f}%, measured {100 * measured_gap:.2f}%",
         abs(predicted_gap - measured_gap) < 0.01),
        ("hazard re-convergence after the 1.7x step (paper 18 min)",
         (f"at 0.99/h per node: median {drift_first} min (replicate mean within 10% from "
          f"{d0.get('mean_within_10pct_from_min')} min); " if d0 else "") + f"on the campus {_fmt(reconv_min)} min",
         drift_first is not None and drift_first <= 18),
    ]
    lines += ["", "## Earlier targets (the first evaluation; main campus, seed 1) - reported, not asserted", "",
              "The oracle is a strict lower bound (one local-disk write per reclaim that hits it, placement that",
              "dodges most reclaims), so its loss is close to zero. Against Poisson emergencies an online policy",
              "pays at least Lemma 1's sqrt(2λC/B) per unit time while the oracle pays λC/W; the ratio",
              "W·sqrt(2/(λCB)) is in the hundreds to thousands at this campus's hazard, so *no* online policy",
              "can be within 5% of it (the measured ratio is of the size the formula gives). The paper's 7.7%",
              "must come from an oracle that still checkpoints periodically; the nearest reference here is",
              "`informed` (ReclaimNet told the true λ(t) and B(t) in hindsight).", "",
              *_theorem2_bound(predicted_gap), "", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {'yes' if c else 'NO'} |" for a, b, c in checks]
    lines += ["", f"Median relative error of the hazard estimate (campus mean vs generator truth, every 10 min): "
              f"{_fmt(haz_err)}. After the 1.7x hazard step the estimate/truth ratio (3 h rolling median) fell to "
              f"{_fmt(dip)} of its pre-step level and was back within 15% after {_fmt(reconv_min)} min "
              "(n/a = not within the drift period; 0 = no dip below 85%).", ""]
    sections = (  # (key in `extra`, heading, prose, columns: None = the rows' own keys)
        ("rep_rows", "Replicates: the main contrasts over independent campuses (measured)",
         "The same generator with other seeds (seed 1 is the main table). Mean ± half-width of the 95%\n"
         "t-interval; the contrasts with static and slurm-pr are paired per seed. Only ~50 emergencies\n"
         "hit jobs in each two-month campus, so one campus is one noisy draw.", None),
        ("fail_rows", "Why migrations failed (measured, main campus)",
         "Each failed interruption counted once: not moved (no destination before the trace ended, or\n"
         "resumed on its own node), emergency over budget (Eq. 9 allows Δ up to 2·L_max, an *expected*\n"
         "loss of L_max, so an emergency late in a long cycle loses more), scheduled over budget (notice\n"
         "shorter than C/b + T_r: the job runs to the deadline and loses its work since the last\n"
         "checkpoint). `reclaimnet-strict` plans with L_max/2, i.e. Δ ≤ L_max. `budget_bound_share`:\n"
         "share of running GPU-time with Δ ≥ 2·L_max (for ReclaimNet: the loss budget, not the hazard,\n"
         "set the interval; for policies that ignore budgets: how often they plan past it).", x.get("fail_cols")),
        ("research_rows", "Research load vs the calibrated reserve (measured)",
         "Research demand scaled by a factor (1.0 = the generator's 15-20% of the link at night, 35-40%\n"
         "by day, i.e. above β = 30% every day). P3 guarantees research its reserve, calibrated per link\n"
         "every day to the p95 of its share over the last 7 days (design §4.1); what research leaves idle\n"
         "of it pre-sync and admitted migrations borrow. `static` and `no-admission` share by TCP.",
         ["research_scale", *cols]),
        ("gap_rows", "Theorem 2: predicted vs measured adaptivity gap (measured)",
         "*predicted* = sqrt(E[λ]E[1/B]) / E[sqrt(λ/B)] - 1 over the 10-minute epochs of the generated\n"
         "trace (true λ, campus-mean available access bandwidth); it does not depend on C. *measured* =\n"
         "simulated cost (expected loss + stall) of the best fixed interval over that of Lemma 1 applied per\n"
         "epoch with the true λ_t and B_t, for one job running through the whole trace. Theorem 2 is a\n"
         "per-epoch result (Δ much shorter than an epoch): a 1 MB checkpoint has Δ ≈ 1 min and matches;\n"
         "for a 3.2 GB checkpoint Δ spans several epochs, and re-planning each epoch also moves the next\n"
         "checkpoint, which the per-epoch formula does not model.", None),
        ("drift_rows", "Hazard re-convergence after a 1.7x step, by hazard level (measured)",
         "The production `HazardEstimator` on 54 lent nodes in 4 buildings with a stationary hazard for\n"
         "48 h, then a 1.7x step; minutes until the estimate is within 10% of the new truth (median over\n"
         "replicates of the first time; and from when the replicate mean stays within 10%). — = not within\n"
         "the minutes followed. Re-convergence needs a number of post-step emergencies, so it scales with\n"
         "1 / the campus event rate: at the paper's ≈ 1/h per node it is tens of minutes, at this campus's\n"
         "0.016/h it is hours to days, which is what the campus measurement above shows. The estimator's\n"
         "change-point test runs per building and on the pooled campus; `make bench-drift` prints its\n"
         "false-alarm side (share of time on a short window with no step) next to these minutes.", None),
        ("hazard_rows", "Volatile campuses: the contrasts by hazard level (measured)",
         "The same generator over 14 days with lending windows and owner periods k x shorter (the lent\n"
         "share is unchanged) and k x the departures per day, so the emergency hazard per lent node is k x\n"
         "(k = 1 is the 14-day reference; 32x ≈ 0.5/h, toward the paper's ≈ 1/h). Mean ± 95% t-interval over\n"
         "independent campuses (seeds); contrasts paired per seed. `budget_bound_share` (%) is the share\n"
         "of running GPU-time whose interval is at or above 2·L_max: where it is high the loss\n"
         "budget, not the hazard, sets Δ and P1 has little to adapt; at high hazard scheduled reclaims\n"
         "with notice shorter than C/b + T_r (the job cannot save) carry much of the loss under every policy.",
         None),
    )
    sections += (  # design §16.5: the fair queue beside today's order, per group
        ("queue_rows", "The fair queue: what each group received (measured)",
         "The busy campus of `scheduler.sim.queuebench` (three groups with equal shares, one submitting 5x the\n"
         "others, a third of the jobs asking 4 GPUs, 2.8x the campus's GPU-hours submitted over 3 days) with the\n"
         "fair queue (design §16) and with today's order (fifo). *GPU-h while submitting*: GPU-hours each group's\n"
         "jobs ran while every group had work waiting; *jain*: Jain's index over those divided by the shares\n"
         "(1 = every group got its share); waits: first start − submission (never started: up to the horizon).",
         None),
    )
    for key, heading, prose, section_cols in sections:
        rows = x.get(key)
        if rows:
            lines += [f"## {heading}", "", prose, "", _md(rows, section_cols or list(rows[0])), ""]
    lines += [
              "## Findings (measured)", "", *_findings(table, abl_rows, relaxed_rows), "",
              "## Ablation (measured; 1 = on, order P1 P2 P3)", "", _md(abl_rows, cols), "",
              "## Sensitivity: the same campus without loss budgets (measured)", "",
              "Every job's L_max set to 1e9 s, so Eq. 9's upper bound 2·L_max no longer forces frequent",
              "checkpoints (success is then trivially high: compare the loss columns only).", "",
              _md(relaxed_rows, cols), "",
              "## External traces (measured)", ""]
    for e in ext_names:
        rows = [r for r in ext_rows if r["trace"] == e]
        lines += [f"### {e}", "", _md(rows, cols), ""]
        front = (x.get("ext_fronts") or {}).get(e)
        if front is not None:
            lines += [f"Pareto front of (work lost, degradation, budget violations) among the online migrating policies: "
                      f"{', '.join(f'`{n}`' for n in front)}; ReclaimNet on it: "
                      f"{'yes' if 'reclaimnet' in front else 'NO'}.", ""]
    lines += ["### How the external traces were mapped onto the campus model", "", (adapters.__doc__ or "").strip(), "",
              "## Oracle", "", ORACLE_DEF, "", "## Definitions", "", DEFINITIONS, "", "## Model notes", "",
              MODEL_NOTES, "", "## Plots", ""]
    lines += [f"![{p}]({p})" for p in plots]
    sign = {k: (f"-{v:.0f}" if v >= 0 else f"+{-v:.0f}") for k, v in (("s", vs_slurm), ("t", vs_static))}
    lines += ["", f"main campus, seed 1: oracle ratio {ratio:.2f}, vs slurm-pr {sign['s']}%, vs static {sign['t']}%, "
              f"success {success:.1f}%, degradation {degradation:.1f}%", ""]
    lines += [h["line"] for h in sorted(x.get("headline") or [], key=lambda h: h["prefix"] != "evaluate-paper-hazard")]
    lines += [""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


# ---- design §21: the paper's baselines by name, two headline campuses, budget violations, verdicts -----------------

# (paper label, policy name, one-line definition); our own references follow the paper's B1′-B7
BASELINES: tuple[tuple[str, str, str], ...] = (
    ("B1′", "slurm-pr", "preempt + requeue: 10-min checkpoints, the notice ignored, requeued after 60 s on the first "
     "free node, TCP sharing with research"),
    ("B2", "no-migration", "checkpoints to local disk only; the job waits for its own node to come back"),
    ("B3", "static-10min", "fixed 10-min interval, no hazard or bandwidth adaptation, the same migration machinery "
     "as ReclaimNet (P2 destination, P3 traffic, final checkpoint in the notice) = `fixed:600`"),
    ("B4", "random-dst", "ReclaimNet with a random feasible destination instead of P2"),
    ("B5", "no-admission", "ReclaimNet without P3: every transfer shares links with research by TCP"),
    ("B6", "oracle", "hindsight lower bound (knows every reclaim; one just-in-time local write): reported, never a "
     "target"),
    ("B7", "tv-fixed", "Lemma 1 at trace-wide hour-of-day means (Theorem 2's state-independent policy), P2/P3 on, "
     "no loss budgets"),
    ("paper", "slurm-pr-paper", "B1 the paper's way: Slurm preempt + requeue from the last checkpoint on shared "
     "storage across the campus core (no pre-sync replica), 10-min checkpoints, the notice ignored, requeued after "
     "60 s on the first free node, no admission (TCP)"),
    ("paper", "static-10min-paper", "B3 the paper's way: fixed 10-min interval with no admission (TCP sharing with "
     "research); P2 destination and the final checkpoint kept"),
    ("ref", "static", "Young/Daly (Lemma 1) at trace-wide mean λ and bandwidth, first fit, TCP, no budgets"),
    ("ref", "static-budget", "`static` clipped by Eq. 9 to the jobs' loss budgets (same P1 call), first fit, under the "
     "same research reserve as ReclaimNet (P3 traffic, calibrated reserve)"),
    ("ref", "informed", "ReclaimNet with P1 told the true λ(t) and B(t) (hindsight rates; P2/P3 unchanged)"),
    ("ours", "reclaimnet", "P1 (Eq. 9 at λ̂ plus the short-notice rate, B⁻, Theorem 1 split) + P2 destination + P3 "
     "admission and the calibrated, work-conserving reserve (per link, daily: max(p95 of research's share over 7 days, "
     "β))"),
)
BAMBOO_NOTE = ("Bamboo (the paper's 38% comparison: redundant computation across pipeline stages) is not modelled: "
               "the simulator has no pipeline-parallel jobs, so no number here stands in for it.")
# the headline contrasts of the `evaluate:` lines, in their order, and the targets of design §21 (signed change of
# ReclaimNet's work lost against the policy, %: -66 = at least 66% less)
CONTRAST_POLICIES = ("slurm-pr", "static-10min", "static-budget")
CONTRAST_TARGETS_PCT = {"slurm-pr": -66.0, "static-10min": -63.0, "static-budget": 0.0}
INFORMED_GAP_TARGET_PCT = 3.0
DEGRADATION_TARGET_PCT = 3.0


def baseline_lines() -> list[str]:
    """The definitions section: one line per named policy, then the note on Bamboo."""
    return [f"- **{label} `{name}`**: {text}" for label, name, text in BASELINES] + ["", BAMBOO_NOTE]


def verdict(measured: float, target: float, at_most: bool, unit: str = " points") -> tuple[bool, str]:
    """Is `measured` on the right side of `target` (≤ if `at_most`, else ≥)? Returns (met, text) with the
    margin: 'met by X' or 'missed by X' (X = |measured − target| in `unit`). NaN is never met."""
    if measured != measured:  # NaN
        return False, "missed (not measured)"
    met = measured <= target if at_most else measured >= target
    return met, f"{'met' if met else 'missed'} by {abs(measured - target):.1f}{unit}"


def signed_pct(v: float) -> str:
    """A signed change in percent, '-69%' = 69% less, '+12%' = 12% more."""
    return "n/a%" if v != v else f"{v:+.0f}%"


def evaluate_line(prefix: str, s: dict[str, float]) -> str:
    """`PREFIX: informed ratio R, vs slurm-pr A%, vs static-10min B%, vs static-budget C%, success D%,
    degradation E%` from a headline summary (`informed_ratio`, `vs_<policy>` signed %, `success_pct`,
    `degradation_pct`)."""
    vs = ", ".join(f"vs {p} {signed_pct(s[f'vs_{p}'])}" for p in CONTRAST_POLICIES)
    return (f"{prefix}: informed ratio {s['informed_ratio']:.2f}, {vs}, success {s['success_pct']:.1f}%, "
            f"degradation {s['degradation_pct']:.1f}%")


def pareto_front(points: dict[str, tuple[float, ...]]) -> list[str]:
    """Names whose point no other point dominates (≤ in every objective, < in one; all minimised)."""
    front = []
    for n, p in points.items():
        dominated = any(all(a <= b for a, b in zip(q, p, strict=True)) and any(a < b for a, b in zip(q, p, strict=True))
                        for m, q in points.items() if m != n)
        if not dominated:
            front.append(n)
    return front


def periodic_floor(work_lost_by_interval_gpu_h: dict[int, float], adaptivity_gap: float) -> tuple[int, float, float]:
    """Theorem 2 (design §21.4): re-planning Δ gains at most the adaptivity gap G over the best constant interval,
    so a policy that checkpoints periodically with the same machinery loses at least best / (1 + G).

    ``work_lost_by_interval_gpu_h``: a sweep of fixed intervals (seconds → mean work lost). Returns (the best
    interval, its work lost, the floor). A model bound on the expected cost, not on one draw's realised loss."""
    best_s = min(work_lost_by_interval_gpu_h, key=lambda k: work_lost_by_interval_gpu_h[k])
    best = float(work_lost_by_interval_gpu_h[best_s])
    return int(best_s), best, best / (1.0 + max(float(adaptivity_gap), 0.0))


def headline_checks(s: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The targets of design §21.3 on one campus from its headline summary `s` (see `evaluate_line`; also
    `violations` {policy: share}, `front` [names], `honouring_best` (name, work lost) of the migrating online
    policies that honour the budgets, `rn_lost`, `nores` (research zeroed and no budgets, over the headline seeds:
    {"work_lost_gpu_h": (reclaimnet, static), "overhead_gpu_h": (…), optionally "running_gpu_h": (…), "seeds": n,
    "change_pct": (mean, ci)}), `reconv_min` and optionally `periodic_floor` ({"best_interval_s", "gap_pct",
    "vs": {policy: signed change of :func:`periodic_floor`'s floor against it}}): what any periodic policy could
    reach, quoted beside the contrasts it bounds. Every verdict is computed from the numbers: (target, measured +
    margin, met)."""
    out = []
    floor = s.get("periodic_floor") or {}
    for p in CONTRAST_POLICIES:
        t = CONTRAST_TARGETS_PCT[p]
        ci = s.get(f"vs_{p}_ci")
        met, how = verdict(s[f"vs_{p}"], t, at_most=True)
        what = f"work lost {'at least ' + f'{-t:.0f}% below' if t < 0 else 'never above'} `{p}`"
        if p in floor.get("vs", {}):
            how += (f"; Theorem 2's floor for any periodic policy with this machinery: {signed_pct(floor['vs'][p])} "
                    f"(best constant interval {floor['best_interval_s']} s, adaptivity gap {floor['gap_pct']:.1f}%)")
        out.append((what, f"{signed_pct(s[f'vs_{p}'])}" + (f" ± {ci:.0f}" if ci is not None else "") + f"; {how}",
                    met))
    gap = 100.0 * (s["informed_ratio"] - 1.0)
    met, how = verdict(gap, INFORMED_GAP_TARGET_PCT, at_most=True)
    out.append((f"within {INFORMED_GAP_TARGET_PCT:.0f}% of `informed`", f"{gap:+.1f}%; {how}", met))
    viol = s.get("violations") or {}
    if "reclaimnet" in viol:
        rivals = {p: v for p, v in viol.items() if p not in ("reclaimnet", "oracle")}
        worst = min(rivals.items(), key=lambda kv: kv[1]) if rivals else ("—", float("nan"))
        met, how = verdict(100 * viol["reclaimnet"], 100 * worst[1], at_most=True)
        met = met and all(viol["reclaimnet"] < v for v in rivals.values())
        out.append(("fewer budget violations than every policy but `oracle`",
                    f"{100 * viol['reclaimnet']:.1f}% vs the fewest of the rest, `{worst[0]}` "
                    f"{100 * worst[1]:.1f}%; {how.replace('met by 0.0', 'tied')}", met))
    met, how = verdict(s["degradation_pct"], DEGRADATION_TARGET_PCT, at_most=True)
    out.append((f"research degradation < {DEGRADATION_TARGET_PCT:.0f}%", f"{s['degradation_pct']:.2f}%; {how}",
                met and s["degradation_pct"] < DEGRADATION_TARGET_PCT))
    if "front" in s:
        on = "reclaimnet" in s["front"]
        out.append(("on the Pareto front (work lost, degradation, violations) of the online migrating policies",
                    "front: " + ", ".join(f"`{n}`" for n in s["front"]), on))
    if s.get("honouring_best"):
        name, lost = s["honouring_best"]
        met, how = verdict(s["rn_lost"], lost, at_most=True, unit=" GPU-h")
        out.append(("least work lost among the migrating online policies honouring the budgets",
                    f"reclaimnet {s['rn_lost']:.3g} vs the best other, `{name}` {lost:.3g} GPU-h; {how}", met))
    if s.get("nores"):
        nores = s["nores"]
        (rn, st), (rn_stall, st_stall) = nores["work_lost_gpu_h"], nores["overhead_gpu_h"]
        met, how = verdict(rn, st, at_most=True, unit=" GPU-h")
        stall_met, stall_how = verdict(rn_stall, st_stall, at_most=True, unit=" GPU-h")
        change, ci = nores["change_pct"]
        per_run = ""
        if nores.get("running_gpu_h"):  # stall per GPU-hour run: the same exposure on both sides (finding 10)
            rn_run, st_run = nores["running_gpu_h"]
            per_run = (f" (per running GPU-h {rn_stall / rn_run:.3f} vs {st_stall / st_run:.3f}; reclaimnet ran "
                       f"{signed_pct(100 * (rn_run / st_run - 1))} GPU-h)")
        out.append(("research zeroed, no budget binding: work lost and stall ≤ `static`",
                    f"means over {nores['seeds']} seeds: work lost reclaimnet {rn:.3g} vs static {st:.3g} GPU-h "
                    f"(paired {signed_pct(change)} ± {ci:.0f}), {how}; stall {rn_stall:.3g} vs {st_stall:.3g} GPU-h, "
                    f"{stall_how}{per_run}", met and stall_met))
    if s.get("reconv_min") is not None:
        met, how = verdict(s["reconv_min"], 18.0, at_most=True, unit=" min")
        out.append(("re-convergence after the 1.7x hazard step ≤ 18 min", f"{s['reconv_min']:.0f} min; {how}", met))
    return out


HEADLINE_COLS = ("policy", "seeds", "work_lost_gpu_h", "expected_work_lost_gpu_h", "lost_gpu_h", "overhead_gpu_h",
                 "budget_violations_pct", "migration_success_pct", "traffic_degradation_pct",
                 "reclaimnet_vs_policy_pct", "reclaimnet_vs_policy_expected_pct")


def headline_section(campuses: list[dict[str, Any]]) -> list[str]:
    """The headline: the named baselines, then per campus (dicts with `title`, `about`, `rows`, `checks`,
    `line`) the table over seeds and the targets with their verdicts."""
    if not campuses:
        return []
    out = ["## Headline: the paper's baselines on two campuses (measured)", "", *baseline_lines(), "",
           "Every cell is the mean ± the half-width of its 95% t-interval over independent campuses (seeds);",
           "`reclaimnet_vs_policy_pct` is the signed change of ReclaimNet's work lost against that policy, paired",
           "per seed (−69 = 69% less); `expected_work_lost_gpu_h` is the expected emergency loss (∫ λ_true · work",
           "at risk) plus stall, without the Poisson noise of the realised loss, and `..._expected_pct` the same",
           "paired change on it (the targets use the realised loss). `budget_violations_pct`: share of interruptions in which the job lost more",
           "than its loss budget L_max. Targets are design §21's; a missed target says by how much. The Pareto",
           "fronts (pareto.png) are over the online migrating policies: `oracle` and `informed` use hindsight, and",
           "`no-migration` loses little work only because its jobs wait for their own node (days: see its downtime",
           "and utilisation in the main table), which none of the three objectives counts.", ""]
    for c in campuses:
        out += [f"### {c['title']}", "", c["about"], "", _md(c["rows"], list(HEADLINE_COLS)), "",
                "| target | measured | met |", "|---|---|---|"]
        out += [f"| {a} | {b} | {'yes' if m else 'NO'} |" for a, b, m in c["checks"]]
        out += ["", f"`{c['line']}`", ""]
        out += _floor_lines(c["summary"].get("periodic_floor"))
    return out


def _floor_lines(floor: dict[str, Any] | None) -> list[str]:
    """The fixed-interval sweep behind :func:`periodic_floor`, as a table with what it bounds."""
    if not floor:
        return []
    rows = [{"interval_s": k, "work_lost_gpu_h": v} for k, v in sorted(floor["sweep"].items())]
    return ["How far below `static-10min` can a policy that checkpoints periodically go? The same machinery (P2",
            "destination, P3 traffic, final checkpoint) at fixed intervals, mean work lost over "
            + (f"seeds 1-{floor['seeds']}:" if floor["seeds"] > 1 else "seed 1:"), "", _md(rows, ["interval_s", "work_lost_gpu_h"]), "",
            f"The best constant interval here is {floor['best_interval_s']} s ({floor['best_gpu_h']:.3g} GPU-h). Theorem 2",
            "bounds what re-planning Δ per epoch can gain over it by the adaptivity gap, "
            f"{floor['gap_pct']:.1f}% on this campus's",
            "λ(t), B(t) (seed 1, as the Theorem 2 table computes it), so no periodic policy is expected below "
            f"{floor['floor_gpu_h']:.3g} GPU-h:",
            ", ".join(f"{signed_pct(v)} against `{p}`" for p, v in floor["vs"].items()) + " over the same seeds. "
            "The targets against those two policies ask for more than the interval can give under one "
            "machinery; the paper's static row (18.4% research degradation, 71.3% success, design §6) ran without "
            "P3's admission, so its 2.8 vs 7.6 GPU-h is not an interval-only contrast.", ""]
