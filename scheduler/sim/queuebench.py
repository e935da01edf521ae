"""The fair queue on a busy campus (design §16.5): a generated campus of groups with equal shares and unequal
demand, run with the fair queue and with today's order (fifo), and what each group received.

The campus: 4-GPU nodes (the only ones 4-GPU jobs fit) and 1-GPU nodes; three groups with equal shares, one
submitting ``heavy_ratio`` times the jobs of each other one; a third of the jobs ask 4 GPUs. Jobs arrive
uniformly over ``submit_days`` at ``load`` times what the campus can run, so every group has work waiting the
whole time; the trace then runs on until the queue has (nearly) drained. No reclaims: this is about the queue,
so the control period (P1, P3, estimators) is 30 min instead of 10 to keep the run short.

Fairness is Jain's index over the groups' GPU-hours received *while jobs were being submitted* (all groups
backlogged), each divided by its share: 1 = every group got its share, 1/3 = one group got everything. Waits
are first start − submission; a job never started counts with its wait up to the horizon.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler.queue import jain_index
from scheduler.sim.engine import SimResult, simulate
from scheduler.sim.policies import get_policy
from scheduler.sim.trace import Trace, from_rows

HOUR_S = 3600.0
DAY_S = 86400.0


@dataclass(frozen=True)
class QueueCampus:
    """Knobs of the generated campus; the defaults are ``make bench-queue``'s."""

    nodes_4gpu: int = 8
    nodes_1gpu: int = 16
    groups: tuple[str, ...] = ("heavy", "vision", "speech")
    heavy_ratio: float = 5.0  # the first group submits this many times the jobs of each other group
    share_4gpu_jobs: float = 1 / 3
    load: float = 2.8  # GPU-hours submitted / GPU-hours the campus has, over the submission period
    submit_days: float = 3.0
    drain_days: float = 7.0  # simulated after the last submission
    median_work_h: float = 3.0
    seed: int = 1


BENCH = QueueCampus()
QUICK = QueueCampus(nodes_4gpu=2, nodes_1gpu=4, submit_days=1.0, drain_days=2.0)  # a smoke run, ~1/10 the time


def generate(cfg: QueueCampus = BENCH) -> Trace:
    """The campus as a design §7 trace with a groups table (design §16.5)."""
    rng = np.random.default_rng(cfg.seed)
    nodes = [{"id": f"a100-{i}", "building": "b0", "gpus": 4, "vram_gb": 80, "capability": 8.0}
             for i in range(cfg.nodes_4gpu)]
    nodes += [{"id": f"rtx-{i}", "building": "b0", "gpus": 1, "vram_gb": 24, "capability": 8.6}
              for i in range(cfg.nodes_1gpu)]
    links = [{"id": f"acc-{n['id']}", "a": n["id"], "b": "sw0", "bytes_per_s": 1.25e8} for n in nodes]
    links.append({"id": "up0", "a": "sw0", "b": "core", "bytes_per_s": 1.25e9})
    bandwidth = [{"link": lk["id"], "t_s": 0, "bytes_per_s": lk["bytes_per_s"]} for lk in links]
    capacity_gpu_h = (4 * cfg.nodes_4gpu + cfg.nodes_1gpu) * cfg.submit_days * 24.0
    weights = np.array([cfg.heavy_ratio] + [1.0] * (len(cfg.groups) - 1))
    counts = np.zeros(len(cfg.groups))
    jobs: list[dict[str, Any]] = []
    demand_gpu_h = 0.0
    target = cfg.load * capacity_gpu_h
    horizon_submit = cfg.submit_days * DAY_S
    while demand_gpu_h < target:
        gpus = 4 if rng.random() < cfg.share_4gpu_jobs else 1
        work_h = float(np.clip(rng.lognormal(np.log(cfg.median_work_h), 0.6), 0.5, 12.0))
        g = int(np.argmin((counts + 1) / weights))  # each group its exact proportion of the jobs
        counts[g] += 1
        group = cfg.groups[g]
        jobs.append({"submit_s": float(rng.uniform(0.0, horizon_submit)), "gpus": gpus,
                     "vram_gb": 40 if gpus == 4 else 16, "min_capability": 7.0, "work_s": work_h * HOUR_S,
                     "ckpt_bytes": 1e9, "restart_s": 30.0, "loss_budget_s": 3600.0, "group": group})
        demand_gpu_h += gpus * work_h
    jobs.sort(key=lambda r: r["submit_s"])
    for k, row in enumerate(jobs):
        row["id"] = f"j{k:05d}"
    groups = [{"id": g, "share": 1.0} for g in cfg.groups]
    return from_rows({"nodes": nodes, "links": links, "jobs": jobs, "reclaims": [], "bandwidth": bandwidth,
                      "groups": groups}, (cfg.submit_days + cfg.drain_days) * DAY_S)


def queue_summary(r: SimResult, window_s: float, period_s: float = 600.0) -> dict[str, Any]:
    """Per group: GPU-hours received in [0, window_s] and overall, waits (mean, p95); Jain's index over the
    groups' GPU-hours in the window relative to their shares; the p95 wait of 4-GPU jobs (design §16.5)."""
    k = min(round(window_s / period_s), len(r.group_gpu_s_at_epoch) - 1)
    in_window = r.group_gpu_s_at_epoch[k] if k >= 0 else r.group_gpu_s
    share = r.group_share / r.group_share.sum()
    rows = []
    for g, name in enumerate(r.group_ids):
        waits = r.job_wait_s[r.job_group == g]
        rows.append({"group": name, "share": round(float(share[g]), 3),
                     "jobs": int(waits.size),
                     "gpu_h_window": round(float(in_window[g]) / HOUR_S, 1),
                     "gpu_h_total": round(float(r.group_gpu_s[g]) / HOUR_S, 1),
                     "wait_mean_h": round(float(waits.mean()) / HOUR_S, 2) if waits.size else 0.0,
                     "wait_p95_h": round(float(np.percentile(waits, 95)) / HOUR_S, 2) if waits.size else 0.0})
    four = r.job_wait_s[r.job_gpus >= 4]
    return {"policy": r.policy,
            "jain": round(jain_index(in_window / np.maximum(share, 1e-12)), 3),
            "p95_wait_4gpu_h": round(float(np.percentile(four, 95)) / HOUR_S, 1) if four.size else 0.0,
            "preemptions": r.preemptions, "groups": rows}


def run(cfg: QueueCampus = BENCH, base_policy: str = "reclaimnet",
        period_s: float = 1800.0) -> tuple[dict, dict]:
    """The campus with the fair queue and with fifo: their :func:`queue_summary` rows."""
    trace = generate(cfg)
    window = cfg.submit_days * DAY_S
    fair = queue_summary(simulate(trace, get_policy(base_policy + "+fair"), period_s=period_s), window, period_s)
    fifo = queue_summary(simulate(trace, get_policy(base_policy), period_s=period_s), window, period_s)
    return fair, fifo


def bench_line(fair: dict, fifo: dict) -> str:
    """``queue: jain fair X fifo Y, p95 wait 4-GPU fair A h fifo B h`` (the last line of make bench-queue)."""
    return (f"queue: jain fair {fair['jain']:.3f} fifo {fifo['jain']:.3f}, p95 wait 4-GPU fair "
            f"{fair['p95_wait_4gpu_h']:.1f} h fifo {fifo['p95_wait_4gpu_h']:.1f} h")


def report_rows(*summaries: dict) -> list[dict[str, Any]]:
    """One row per queue and group for the evaluation report's queue section (``extra["queue_rows"]``)."""
    return [{"queue": s["policy"], "jain": s["jain"], "p95_wait_4gpu_h": s["p95_wait_4gpu_h"],
             **{k: v for k, v in g.items() if k != "jobs"}} for s in summaries for g in s["groups"]]
