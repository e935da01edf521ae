"""ReclaimNet against gang kill-and-requeue on the campus with gang and elastic jobs (design §21.6).

    .venv/bin/python scripts/evaluate_gangs.py [--out reports/gangs] [--jobs 2] [--seeds 8] [--quick]

Runs every policy of `scheduler.sim.gangs.GANG_POLICIES` on `gang_campus(seed)` for seeds 1..S, paired, and
prints a row per policy (means over the seeds), then as its last line
    gangs: S seeds, reclaimnet W GPU-h lost and J jobs done, slurm-gang W2 and J2 (-X%), gang-requeue W3 (-Y%), rigid W4 (Z%)
Work lost is the GPU-hours redone after reclaims plus those stalled writing checkpoints (the engine's
work_lost_gpu_h, design §21); -X% is ReclaimNet's mean against the rival's. `make evaluate` prints the same rows
above its own last lines.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.sim.gangs import GANG_POLICIES, gang_campus, simulate_gangs

KEYS = ("work_lost_gpu_h", "lost_gpu_h", "stall_gpu_h", "restore_idle_gpu_h", "jobs_done", "useful_gpu_h",
        "interruptions", "moves", "restores", "requeues", "shrinks", "grows")
QUICK_DAYS = 2.0
CALIBRATION_SEED_OFFSET = 1000  # as scripts/evaluate_families.py


def _run(task: tuple[int, str, bool]) -> tuple[int, str, dict[str, Any]]:
    seed, policy, quick = task
    days = QUICK_DAYS if quick else 7.0
    # the estimator's prior comes from the campus's previous period (design §21.5), never the evaluated trace
    trace, calibration = gang_campus(seed, days=days), gang_campus(seed + CALIBRATION_SEED_OFFSET, days=days)
    return seed, policy, simulate_gangs(trace, policy, calibration=calibration).summary()


def run(seeds: int = 8, jobs: int = 2, quick: bool = False) -> list[dict[str, Any]]:
    """Per policy, the mean of KEYS over seeds 1..``seeds`` (one row each, in GANG_POLICIES order)."""
    tasks = [(seed, policy, quick) for seed in range(1, seeds + 1) for policy in GANG_POLICIES]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(_run, tasks))
    rows = []
    for policy in GANG_POLICIES:
        per_seed = [s for _, p, s in results if p == policy]
        rows.append({"policy": policy, "seeds": len(per_seed),
                     **{k: round(float(np.mean([s[k] for s in per_seed])), 2) for k in KEYS}})
    return rows


def _pct(a: float, b: float) -> float:
    return 100.0 * (a / b - 1.0) if b > 0 else float("inf")


def lines(rows: list[dict[str, Any]]) -> list[str]:
    """The table and the `gangs:` line (module docstring)."""
    by = {r["policy"]: r for r in rows}
    rn, slurm, requeue, rigid = by["reclaimnet"], by["slurm-gang"], by["gang-requeue"], by["reclaimnet-rigid"]
    out = ["campus with gangs and elastic jobs (design §21.6), means over seeds:",
           f"  {'policy':18s} " + " ".join(f"{k:>18s}" for k in KEYS)]
    out += [f"  {r['policy']:18s} " + " ".join(f"{r[k]:18g}" for k in KEYS) for r in rows]
    out.append(f"gangs: {rn['seeds']} seeds, reclaimnet {rn['work_lost_gpu_h']:.1f} GPU-h lost and "
               f"{rn['jobs_done']:.1f} jobs done, slurm-gang {slurm['work_lost_gpu_h']:.1f} and {slurm['jobs_done']:.1f} "
               f"({_pct(rn['work_lost_gpu_h'], slurm['work_lost_gpu_h']):+.1f}%), gang-requeue "
               f"{requeue['work_lost_gpu_h']:.1f} ({_pct(rn['work_lost_gpu_h'], requeue['work_lost_gpu_h']):+.1f}%), "
               f"rigid {rigid['work_lost_gpu_h']:.1f} ({_pct(rn['work_lost_gpu_h'], rigid['work_lost_gpu_h']):+.1f}%)")
    return out


def write(out: Path, rows: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "gangs.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="reports/gangs")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_DAYS:g}-day campuses")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    rows = run(args.seeds, args.jobs, args.quick)
    write(Path(args.out), rows)
    text = lines(rows)
    print("\n".join(text[:-1]))
    print(f"({time.perf_counter() - started:.0f} s; {Path(args.out) / 'gangs.csv'})")
    print(text[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
