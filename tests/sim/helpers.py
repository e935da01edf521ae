"""Small trace builders for the simulator tests (design §7 rows)."""

from __future__ import annotations

from typing import Any

import numpy as np

from scheduler.sim.trace import Trace, from_rows


def star_campus(n_nodes: int, bw_bytes_per_s: float, buildings: int = 1) -> dict[str, list[dict[str, Any]]]:
    """Nodes (1 GPU each) on building switches joined by a core switch; constant bandwidth rows."""
    nodes = [{"id": f"n{i}", "building": f"b{i % buildings}", "gpus": 1, "vram_gb": 24, "capability": 8.6}
             for i in range(n_nodes)]
    links = [{"id": f"acc-n{i}", "a": f"n{i}", "b": f"sw{i % buildings}", "bytes_per_s": 1.25e8}
             for i in range(n_nodes)]
    links += [{"id": f"up{b}", "a": f"sw{b}", "b": "core", "bytes_per_s": 1.25e9} for b in range(buildings)]
    bw = [{"link": lk["id"], "t_s": 0, "bytes_per_s": bw_bytes_per_s if lk["id"].startswith("acc") else 1e9}
          for lk in links]
    return {"nodes": nodes, "links": links, "bandwidth": bw}


def poisson_trace(n_nodes: int, n_jobs: int, hazard_per_s: float, horizon_s: float, ckpt_bytes: float,
                  bw_bytes_per_s: float, seed: int = 0, return_after_s: float = 1.0) -> Trace:
    """Stationary Poisson emergency reclaims on every node, long jobs, constant bandwidth, no research."""
    rng = np.random.default_rng(seed)
    rows = star_campus(n_nodes, bw_bytes_per_s)
    rows["jobs"] = [{"id": f"j{k}", "submit_s": 0, "gpus": 1, "vram_gb": 0, "min_capability": 0,
                     "work_s": 1e12, "ckpt_bytes": ckpt_bytes, "restart_s": 0, "loss_budget_s": 1e9}
                    for k in range(n_jobs)]
    rec = []
    for i in range(n_nodes):
        t = 0.0
        while True:
            t += rng.exponential(1.0 / hazard_per_s)
            if t >= horizon_s:
                break
            rec.append({"node": f"n{i}", "t_s": t, "notice_s": 0, "return_s": t + return_after_s})
            t += return_after_s
    rows["reclaims"] = sorted(rec, key=lambda r: r["t_s"])
    rows["hazard"] = [{"t_s": 0, "per_s": hazard_per_s}]
    return from_rows(rows, horizon_s)
