"""What-if comparison (design §7, "The what-if report"): several policies × seeds on one trace, one JSON report.

`compare` runs each (policy, seed) with the engine and `scheduler.sim.metrics.summarise` — the numbers
``python -m scheduler.sim`` prints — and adds the mean per policy over the seeds, the loss per class of job
(research group, checkpoint size), the Pareto front of work lost against research-traffic degradation and,
where a simpler policy lost less than ReclaimNet, which one, by how much and which setting would close the gap
(`simpler_wins`, design §7.1 "When ReclaimNet would lose").
`to_csv` and `pareto_svg` render a report (the portal's what-if page and its downloads); nothing here needs
Django. ``progress(fraction, label)`` is called as the runs advance (after every control period of each run and
after each run) and only observes: the report is the same with or without it.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Sequence
from typing import Any
from xml.sax.saxutils import escape

import numpy as np

from scheduler.sim.engine import SimResult, simulate
from scheduler.sim.metrics import summarise
from scheduler.sim.policies import RECLAIMNET, get_policy
from scheduler.sim.trace import Trace, TraceError

# the per-policy table: the design §7 numbers and the two parts of work lost (means over the seeds)
TABLE_KEYS: tuple[str, ...] = ("work_lost_gpu_h", "lost_gpu_h", "overhead_gpu_h", "downtime_median_s",
                               "downtime_p99_s", "migration_success", "traffic_degradation", "gpu_utilization",
                               "jobs_done", "interruptions")
CKPT_CLASSES: tuple[tuple[str, float], ...] = (("< 1 GB", 1e9), ("1-10 GB", 1e10), (">= 10 GB", math.inf))
MAX_RUNS = 64
ProgressFn = Callable[[float, str], None]


def check_choice(policies: Sequence[str], seeds: Sequence[int]) -> tuple[list[str], list[int]]:
    """Policy names the simulator knows (``scheduler.sim.policies.get_policy``) and integer seeds ≥ 0, each
    at most once, at most MAX_RUNS runs. Raises TraceError naming ``policies`` or ``seeds``."""
    names = list(dict.fromkeys(str(p).strip() for p in policies))
    if not names or any(not n for n in names):
        raise TraceError("policies", "choose at least one policy")
    for n in names:
        try:
            get_policy(n)
        except ValueError as e:
            raise TraceError("policies", str(e)) from None
    out: list[int] = []
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0 or s > 2**31:
            raise TraceError("seeds", f"a seed is an integer from 0 to 2^31, not {s!r}")
        if s not in out:
            out.append(s)
    if not out:
        raise TraceError("seeds", "give at least one seed")
    if len(names) * len(out) > MAX_RUNS:
        raise TraceError("seeds", f"{len(names)} policies x {len(out)} seeds is more than {MAX_RUNS} runs")
    return names, out


def _class_loss(trace: Trace, r: SimResult) -> dict[tuple[str, str], list[float]]:
    """(kind, class) → [jobs, GPU-h lost at reclaims, interruptions] of one run."""
    jobs = trace.tables["jobs"]
    groups = jobs.get("group")
    groups = np.full(len(jobs["id"]), "default", dtype=object) if groups is None else groups.astype(str)
    ckpt = jobs["ckpt_bytes"].astype(float)
    ck_class = [next(name for name, hi in CKPT_CLASSES if c < hi) for c in ckpt]
    out: dict[tuple[str, str], list[float]] = {}
    for j in range(len(ckpt)):
        for key in (("group", str(groups[j])), ("checkpoint", ck_class[j])):
            out.setdefault(key, [0.0, 0.0, 0.0])[0] += 1
    for x in r.interruptions:
        gpus = float(jobs["gpus"][x.job])
        for key in (("group", str(groups[x.job])), ("checkpoint", ck_class[x.job])):
            row = out[key]
            row[1] += x.lost_s * gpus / 3600.0
            row[2] += 1
    return out


def _front(points: list[tuple[float, float]]) -> list[bool]:
    """Non-dominated points when both coordinates are minimised."""
    return [not any((a <= x and b <= y) and (a < x or b < y) for a, b in points) for x, y in points]


# design §7.1 "When ReclaimNet would lose": a rival within TIE_PCT of ReclaimNet's work lost is a tie
TIE_PCT = 0.5


def _rival_decision(policy: str) -> tuple[str, str]:
    """What `policy` decides differently from ReclaimNet, and the setting that moves ReclaimNet toward it, read
    from the policy's own switches (`scheduler.sim.policies.Policy`), so ablations and new names are covered too.
    Taking research's share (TCP, or a reserve of another kind) is named first: on every trace family that is the
    larger of a TCP policy's differences (design §21.5)."""
    pol = get_policy(policy)
    if pol.traffic == "tcp" or pol.reserve != RECLAIMNET.reserve or not pol.reserve_borrow \
            or pol.reserve_quantile is not None:
        return ("the research reserve and admitted rates (P3)",
                "the research reserve: lower it per link (dashboard 'Research reserve per link', or PATCH "
                "/api/campus/links/{id}/reserve/) where research leaves it idle")
    if pol.interval == "fixed":
        return ("the checkpoint interval (P1)",
                f"the interval floor: RECLAIMNET_MIN_CHECKPOINT_INTERVAL_S = {pol.fixed_interval_s:.0f} (today's "
                f"floor is 60 s), so no job checkpoints more often than the constant interval that lost less")
    if pol.interval in ("static", "tv"):
        return ("the checkpoint interval (P1), planned without loss budgets",
                "the loss-budget mode: 'expected' (not 'bound'), or larger loss budgets for the jobs whose "
                "budgets shorten their intervals")
    if pol.interval == "static-budget":
        return ("the checkpoint interval (P1): static-budget plans every job at the trace's mean hazard, where "
                "ReclaimNet plans at each node's estimate",
                "the interval floor (RECLAIMNET_MIN_CHECKPOINT_INTERVAL_S) raised toward the intervals the "
                "trace-wide mean gives, or the paper's overhead floor (P1 overhead_floor='eq9')")
    if pol.loss_budget_scale != RECLAIMNET.loss_budget_scale:
        return ("the loss-budget mode", "the loss-budget mode 'bound' (every emergency within budget)")
    if pol.destination != RECLAIMNET.destination:
        return ("the destination (P2)",
                "no setting closes this one: P2 ranked destinations worse than this rule on this trace; keep the "
                "report and tell the ReclaimNet maintainers (design §21.5)")
    return ("its decisions", "compare the two policies' rows above")


def simpler_wins(report: dict[str, Any]) -> list[dict[str, Any]]:
    """design §7.1 "When ReclaimNet would lose": every policy of `report` whose mean work lost is more than
    TIE_PCT below `reclaimnet`'s, best first, each with the decision it makes differently and the setting that
    would close the gap, in plain words. Empty when `reclaimnet` is not in the report or nothing beats it."""
    table = {r["policy"]: r for r in report.get("table", [])}
    ours = table.get("reclaimnet")
    if ours is None:
        return []
    out = []
    for name, row in table.items():
        if name in ("reclaimnet", "oracle", "informed"):  # hindsight is no rival
            continue
        theirs, mine = float(row["work_lost_gpu_h"]), float(ours["work_lost_gpu_h"])
        if theirs <= 0 or mine <= theirs * (1.0 + TIE_PCT / 100.0):
            continue
        decision, setting = _rival_decision(name)
        pct = 100.0 * (mine / theirs - 1.0)
        out.append({
            "policy": name, "work_lost_gpu_h": round(theirs, 4), "reclaimnet_work_lost_gpu_h": round(mine, 4),
            "margin_pct": round(pct, 1), "decision": decision, "setting": setting,
            "words": (f"On this trace {name} loses less work than ReclaimNet: {theirs:.2f} against {mine:.2f} GPU-h "
                      f"(ReclaimNet {pct:.1f}% more). The difference is {decision}. The setting that would close "
                      f"the gap: {setting}."),
        })
    return sorted(out, key=lambda w: w["work_lost_gpu_h"])


def compare(trace: Trace, policies: Sequence[str], seeds: Sequence[int] = (0,),
            progress: ProgressFn | None = None) -> dict[str, Any]:
    """Run every policy with every seed on ``trace``; the JSON-ready report (see the module docstring)."""
    names, seed_list = check_choice(policies, seeds)
    total = len(names) * len(seed_list)
    runs: list[dict[str, Any]] = []
    classes: dict[str, dict[tuple[str, str], list[float]]] = {}
    done = 0
    for name in names:
        policy = get_policy(name)
        for seed in seed_list:
            label = f"{name} seed {seed}"

            def step(frac: float, _done: int = done, _label: str = label) -> None:
                if progress is not None:
                    progress((_done + min(max(frac, 0.0), 1.0)) / total, _label)

            result = simulate(trace, policy, seed=seed, progress=step if progress is not None else None)
            runs.append({"policy": name, "seed": seed, **summarise(result, trace.horizon_s)})
            for key, (n_jobs, lost, count) in _class_loss(trace, result).items():
                acc = classes.setdefault(name, {}).setdefault(key, [0.0, 0.0, 0.0])
                acc[0], acc[1], acc[2] = n_jobs, acc[1] + lost, acc[2] + count
            done += 1
            if progress is not None:
                progress(done / total, label)
    table = []
    for name in names:
        mine = [r for r in runs if r["policy"] == name]
        row: dict[str, Any] = {"policy": name, "runs": len(mine)}
        for k in TABLE_KEYS:
            row[k] = round(float(np.mean([r[k] for r in mine])), 4)
        lost = [r["work_lost_gpu_h"] for r in mine]
        row["work_lost_gpu_h_min"], row["work_lost_gpu_h_max"] = min(lost), max(lost)
        table.append(row)
    class_rows = [{"policy": name, "kind": kind, "class": cls, "jobs": int(v[0]),
                   "lost_gpu_h": round(v[1] / len(seed_list), 4), "interruptions": round(v[2] / len(seed_list), 2)}
                  for name in names for (kind, cls), v in sorted(classes.get(name, {}).items())]
    front = _front([(r["traffic_degradation"], r["work_lost_gpu_h"]) for r in table])
    pareto = [{"policy": r["policy"], "traffic_degradation": r["traffic_degradation"],
               "work_lost_gpu_h": r["work_lost_gpu_h"], "on_front": f} for r, f in zip(table, front, strict=True)]
    report: dict[str, Any] = {
        "trace": {"horizon_s": trace.horizon_s, **{t: trace.n(t) for t in ("nodes", "links", "jobs", "reclaims",
                                                                            "bandwidth", "research")}},
        "policies": names, "seeds": seed_list, "table": table, "runs": runs, "classes": class_rows,
        "pareto": pareto,
    }
    report["simpler_wins"] = simpler_wins(report)
    return report


def to_csv(report: dict[str, Any], table: str = "table") -> str:
    """One of the report's tables (``table``, ``runs`` or ``classes``) as CSV text."""
    if table not in ("table", "runs", "classes"):
        raise TraceError("table", "one of table, runs, classes")
    rows = report.get(table) or []
    out = io.StringIO()
    if rows:  # a fixed column order (a report read back from PostgreSQL's jsonb has its keys reordered)
        first = [k for k in ("policy", "seed", "runs", "kind", "class", "jobs", *TABLE_KEYS) if k in rows[0]]
        names = first + sorted(k for k in rows[0] if k not in first)
        w = csv.DictWriter(out, fieldnames=names, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return out.getvalue()


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not hi > lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    return [round(start + i * step, 10) for i in range(math.ceil((hi - start) / step) + 1)]


def pareto_svg(report: dict[str, Any], width: int = 640, height: int = 400) -> str:
    """The Pareto plot: work lost (GPU-h) against research-traffic degradation (%) per policy, the
    non-dominated policies joined by a line. Plain SVG with presentation attributes (no script, no style)."""
    pts = report.get("pareto") or []
    ml, mr, mt, mb = 64, 24, 24, 52
    xs = [100.0 * p["traffic_degradation"] for p in pts] or [0.0]
    ys = [p["work_lost_gpu_h"] for p in pts] or [0.0]
    xt, yt = _ticks(0.0, max(xs) * 1.1 or 1.0), _ticks(0.0, max(ys) * 1.1 or 1.0)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def sx(v: float) -> float:
        return ml + (v - x0) / (x1 - x0) * (width - ml - mr)

    def sy(v: float) -> float:
        return height - mb - (v - y0) / (y1 - y0) * (height - mt - mb)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
             f'height="{height}" role="img" aria-labelledby="pareto-title" font-family="sans-serif" font-size="12">',
             '<title id="pareto-title">Work lost against research-traffic degradation, per policy</title>',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>']
    for v in xt:
        parts.append(f'<line x1="{sx(v):.1f}" y1="{mt}" x2="{sx(v):.1f}" y2="{height - mb}" stroke="#e4e4e4"/>'
                     f'<text x="{sx(v):.1f}" y="{height - mb + 16}" text-anchor="middle" fill="#333">{v:g}</text>')
    for v in yt:
        parts.append(f'<line x1="{ml}" y1="{sy(v):.1f}" x2="{width - mr}" y2="{sy(v):.1f}" stroke="#e4e4e4"/>'
                     f'<text x="{ml - 6}" y="{sy(v) + 4:.1f}" text-anchor="end" fill="#333">{v:g}</text>')
    parts.append(f'<line x1="{ml}" y1="{height - mb}" x2="{width - mr}" y2="{height - mb}" stroke="#333"/>'
                 f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{height - mb}" stroke="#333"/>'
                 f'<text x="{(ml + width - mr) / 2:.0f}" y="{height - 12}" text-anchor="middle" fill="#111">'
                 'research-traffic degradation (%)</text>'
                 f'<text transform="translate(16 {(mt + height - mb) / 2:.0f}) rotate(-90)" text-anchor="middle" '
                 'fill="#111">work lost (GPU-h)</text>')
    front = sorted((p for p in pts if p["on_front"]), key=lambda p: p["traffic_degradation"])
    if len(front) > 1:
        path = " ".join(f"{sx(100.0 * p['traffic_degradation']):.1f},{sy(p['work_lost_gpu_h']):.1f}" for p in front)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#1f6feb" stroke-width="2"/>')
    for p in pts:
        cx, cy = sx(100.0 * p["traffic_degradation"]), sy(p["work_lost_gpu_h"])
        colour = "#1f6feb" if p["on_front"] else "#888888"
        name = escape(str(p["policy"]))
        parts.append(f'<g class="point" data-policy="{escape(str(p["policy"]), {chr(34): "&quot;"})}">'
                     f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{colour}"/>'
                     f'<text x="{cx + 8:.1f}" y="{cy - 6:.1f}" fill="#111">{name}</text></g>')
    parts.append("</svg>")
    return "".join(parts)
