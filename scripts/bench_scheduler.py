"""Benchmark one full scheduler control period against a literal per-job-loop implementation.

One control period (design §2-§4) on a synthetic campus (buildings of ~50 nodes, 1 Gbit/s access links,
10 Gbit/s building uplinks to the core; available bandwidth drawn below nominal):
  1. P2 for 7 simultaneous reclaims (the paper's worst case), sharing one per-period bottleneck index;
  2. P3 over all bottlenecks: the 7 migrations plus n/100 other planned migrations, multi-bottleneck form
     (every flow must fit on its access links, building uplinks and the core path);
  3. P1 over all jobs (one per node): per building, the checkpoint budget is what migrations leave on the
     uplink and each job is capped by what they leave on its access link (grouped water-filling).
"Ours" is `scheduler/`; "literal" is `scripts/scheduler_literal.py` (plain loops, the design as written),
given the same inputs; at 54 and 500 nodes the two must agree. The campus tree (CampusTree /
LiteralTree) is built once outside the timed period, as in production. The literal run at 50,000 nodes
would take minutes, so it is extrapolated linearly from 5,000 (both its P2 and P1/P3 parts grow ~n with
~50-node buildings) and marked as such.

    .venv/bin/python scripts/bench_scheduler.py [--sizes 54,500,5000,50000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import scheduler_literal as literal

from scheduler.p1 import P1Jobs, plan_checkpoints
from scheduler.p2 import P2Request, select_destination
from scheduler.p3 import P3Flows, admit_flows_on_incidence
from scheduler.topology import BottleneckIndex, CampusTree

ACCESS_BYTES_PER_S = 1.25e8  # 1 Gbit/s
UPLINK_BYTES_PER_S = 1.25e9  # 10 Gbit/s
N_RECLAIMS = 7


@dataclass(frozen=True, eq=False)
class Campus:
    """A synthetic campus and one control period's inputs."""

    tree: CampusTree
    link_ids: list[str]
    ends: list[tuple[str, str]]
    link_bytes_per_s: np.ndarray  # available (lower-bound) bandwidth this period
    building: np.ndarray  # int code per node
    access_link: np.ndarray  # link index per node
    uplink: np.ndarray  # link index per building
    free_gpus: np.ndarray
    vram_gb: np.ndarray
    capability: np.ndarray
    hazard_by_hour: np.ndarray  # (n, 24)
    jobs: P1Jobs  # one job per node
    reclaims: list[dict]  # source, holder, notice_s, ckpt_bytes, restart_s, remaining_s, vram, cap
    flows: list[tuple[int, int, float, float]]  # other planned migrations: src, dst, bytes, notice_s


def make_campus(n_nodes: int, seed: int = 0) -> Campus:
    """Three-tier campus: core - building switches - nodes; ~50 nodes per building (4 at 54 nodes)."""
    rng = np.random.default_rng(seed)
    n_b = max(4, n_nodes // 50)
    building = np.arange(n_nodes) % n_b
    link_ids: list[str] = []
    ends: list[tuple[str, str]] = []
    uplink = np.empty(n_b, dtype=np.int64)
    for k in range(n_b):
        uplink[k] = len(link_ids)
        link_ids.append(f"up-{k}")
        ends.append((f"sw-{k}", "core"))
    node_ids = [f"n{i}" for i in range(n_nodes)]
    access = np.arange(n_nodes) + n_b
    for i in range(n_nodes):
        link_ids.append(f"acc-{i}")
        ends.append((node_ids[i], f"sw-{building[i]}"))
    tree = CampusTree.from_links(link_ids, [a for a, _ in ends], [b for _, b in ends], node_ids)
    bw = np.empty(len(link_ids))
    bw[uplink] = UPLINK_BYTES_PER_S * rng.uniform(0.2, 0.8, n_b)
    bw[access] = ACCESS_BYTES_PER_S * rng.uniform(0.4, 1.0, n_nodes)
    kind = rng.integers(0, 4, n_nodes)  # RTX 3090, RTX 4090, A100, A6000
    vram = np.array([24.0, 24.0, 80.0, 48.0])[kind]
    capability = np.array([8.6, 8.9, 8.0, 8.6])[kind]
    free = rng.integers(0, 5, n_nodes)
    hours = np.arange(24) + 0.5
    peak = ((hours >= 11.5) & (hours < 13)) | ((hours >= 17.5) & (hours < 20))
    shape = np.where(peak, 6.0, 1.0)
    hazard = (rng.lognormal(0, 0.5, n_nodes)[:, None] * shape[None, :]) * (0.5 / 3600.0)
    ckpt = np.clip(rng.lognormal(np.log(3.2e9), 1.2, n_nodes), 1.2e8, 4.8e10)
    ids = tuple(f"j{i}" for i in range(n_nodes))
    notice = np.full(n_nodes, np.nan)
    jobs = P1Jobs(
        ids=ids,
        hazard_per_s=hazard[:, 12] * 1.2,
        ckpt_bytes=ckpt,
        cap_bytes_per_s=np.full(n_nodes, np.inf),
        loss_budget_s=rng.choice([np.inf, 900.0, 3600.0], n_nodes),
        notice_s=notice,
        restart_s=rng.uniform(5, 60, n_nodes),
    )
    sources = rng.choice(n_nodes, N_RECLAIMS, replace=False)
    reclaims = []
    for r, s in enumerate(sources):
        same = np.flatnonzero((building == building[s]) & (np.arange(n_nodes) != s))
        emergency = r % 2 == 0
        reclaims.append(
            {
                "source": int(s),
                "holder": int(rng.choice(same)) if emergency and same.size else int(s),
                "notice_s": None if emergency else float(rng.uniform(120, 900)),
                "ckpt_bytes": float(ckpt[s]),
                "restart_s": float(jobs.restart_s[s]),
                "remaining_s": float(rng.uniform(600, 86400)),
                "vram": float(rng.choice([0.0, 24.0, 40.0])),
                "cap": float(rng.choice([0.0, 8.6])),
            }
        )
    flows = []
    for _ in range(n_nodes // 100):
        s = int(rng.integers(n_nodes))
        same = np.flatnonzero(building == building[s])
        d = int(rng.choice(same)) if rng.random() < 0.8 else int(rng.integers(n_nodes))
        if d != s:
            flows.append((s, d, float(ckpt[s]), float(rng.uniform(60, 900))))
    return Campus(tree, link_ids, ends, bw, building, access, uplink, free, vram, capability, hazard, jobs,
                  reclaims, flows)


# ------------------------------------------------------------------ ours
def period_ours(c: Campus) -> dict:
    """One control period with `scheduler/` (vectorised)."""
    index = BottleneckIndex.build(c.tree, c.link_bytes_per_s)
    dest: list[int | None] = []
    for r in c.reclaims:
        d = select_destination(
            P2Request(
                tree=c.tree, link_bytes_per_s=c.link_bytes_per_s, building=c.building, free_gpus=c.free_gpus,
                vram_gb=c.vram_gb, capability=c.capability, hazard_per_s_by_hour=c.hazard_by_hour, compatible=None,
                source=r["source"], ckpt_holder=r["holder"], ckpt_bytes=r["ckpt_bytes"], restart_s=r["restart_s"],
                notice_s=r["notice_s"], remaining_s=r["remaining_s"], vram_gb_needed=r["vram"],
                min_capability=r["cap"], now_hour=12.0, index=index,
            )
        )
        dest.append(d.destination)
    src, dst, size, notice, restart = _flow_arrays(c, dest)
    pair, link = c.tree.path_incidence(src, dst)
    flows = P3Flows(tuple(f"f{k}" for k in range(src.size)), size, notice, restart, np.full(src.size, np.inf))
    p3 = admit_flows_on_incidence(flows, c.link_bytes_per_s, pair, link)
    # What migrations leave on each link goes to checkpoint pre-sync (P1's budget and caps).
    used = np.bincount(link, weights=p3.rate_bytes_per_s[pair], minlength=len(c.link_ids))
    left = np.maximum(p3.migration_budget_bytes_per_s - used, 0.0)
    jobs = P1Jobs(c.jobs.ids, c.jobs.hazard_per_s, c.jobs.ckpt_bytes, np.maximum(left[c.access_link], 1.0),
                  c.jobs.loss_budget_s, c.jobs.notice_s, c.jobs.restart_s)
    plan = plan_checkpoints(jobs, np.maximum(left[c.uplink], 1.0), group=c.building)
    return {"dest": dest, "rates": p3.rate_bytes_per_s, "reasons": p3.degraded_reason,
            "bandwidth": plan.bandwidth_bytes_per_s, "interval": plan.interval_s}


def _flow_arrays(c: Campus, dest: list[int | None]) -> tuple[np.ndarray, ...]:
    rows = [(r["holder"], d, r["ckpt_bytes"], r["notice_s"], r["restart_s"])
            for r, d in zip(c.reclaims, dest, strict=True) if d is not None and r["notice_s"] is not None]
    rows += [(s, d, b, n, 0.0) for s, d, b, n in c.flows]
    if not rows:
        return tuple(np.zeros(0) for _ in range(5))
    a = np.array(rows, dtype=float).T
    return a[0].astype(np.int64), a[1].astype(np.int64), a[2], a[3], a[4]


# ------------------------------------------------------------------ literal
def literal_inputs(c: Campus) -> dict:
    """Plain-Python views of the campus (built once, outside the timed period, like the tree)."""
    lt = literal.LiteralTree([{"a": a, "b": b} for a, b in c.ends])
    nodes = [
        {"id": c.tree.node_ids[i], "building": int(c.building[i]), "free_gpus": int(c.free_gpus[i]),
         "vram_gb": float(c.vram_gb[i]), "capability": float(c.capability[i]),
         "hazard_per_s_by_hour": c.hazard_by_hour[i].tolist()}
        for i in range(c.tree.n_nodes)
    ]
    return {"tree": lt, "nodes": nodes, "bw": c.link_bytes_per_s.tolist()}


def period_literal(c: Campus, li: dict) -> dict:
    """The same control period, one job / node / flow at a time."""
    ids = c.tree.node_ids
    index_of = {x: i for i, x in enumerate(ids)}
    dest: list[int | None] = []
    for r in c.reclaims:
        req = {"source": ids[r["source"]], "ckpt_holder": ids[r["holder"]], "ckpt_bytes": r["ckpt_bytes"],
               "restart_s": r["restart_s"], "notice_s": r["notice_s"], "remaining_s": r["remaining_s"],
               "vram_gb": r["vram"], "min_capability": r["cap"], "now_hour": 12.0}
        best, _ = literal.p2_select(li["tree"], li["bw"], li["nodes"], req)
        dest.append(None if best is None else index_of[best])
    src, dst, size, notice, restart = _flow_arrays(c, dest)
    flows = [
        {"id": f"f{k}", "bytes": float(size[k]), "notice_s": float(notice[k]), "restart_s": float(restart[k]),
         "links": li["tree"].path(ids[src[k]], ids[dst[k]])}
        for k in range(len(src))
    ]
    res = literal.p3_paths(flows, li["bw"])
    budget = [max(0.0, b - 0.3 * b) for b in li["bw"]]
    left = list(budget)
    for f, r in zip(flows, res, strict=True):
        for link in set(f["links"]):
            left[link] -= r["rate"]
    by_building: dict[int, list[int]] = {}
    for i in range(len(ids)):
        by_building.setdefault(int(c.building[i]), []).append(i)
    bandwidth = [0.0] * len(ids)
    interval = [0.0] * len(ids)
    for k, members in by_building.items():
        rows = [
            {"id": c.jobs.ids[i], "hazard_per_s": float(c.jobs.hazard_per_s[i]), "ckpt_bytes": float(c.jobs.ckpt_bytes[i]),
             "cap_bytes_per_s": max(left[int(c.access_link[i])], 1.0), "loss_budget_s": float(c.jobs.loss_budget_s[i]),
             "notice_s": None, "restart_s": float(c.jobs.restart_s[i])}
            for i in members
        ]
        plan, _ = literal.p1_plan(rows, max(left[int(c.uplink[k])], 1.0))
        for i, p in zip(members, plan, strict=True):
            bandwidth[i] = p["bandwidth"]
            interval[i] = p["interval"]
    return {"dest": dest, "rates": np.array([r["rate"] for r in res]), "reasons": tuple(r["reason"] for r in res),
            "bandwidth": np.array(bandwidth), "interval": np.array(interval)}


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float, float]:
    """(min wall, median wall, median CPU) ms over `repeats` calls after one warm-up call.

    The machine is shared: the median wall time includes waiting for a core, so the headline number is
    the minimum wall time (timeit's convention); the median and this process's CPU time are shown beside.
    """
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return min(wall), statistics.median(wall), statistics.median(cpu)


def same_answers(a: dict, b: dict) -> bool:
    return (
        a["dest"] == b["dest"]
        and tuple(a["reasons"]) == tuple(b["reasons"])
        and np.allclose(a["rates"], b["rates"], rtol=1e-6)
        and np.allclose(a["bandwidth"], b["bandwidth"], rtol=1e-9)
        and np.allclose(a["interval"], b["interval"], rtol=1e-9)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description="scheduler control-period benchmark")
    ap.add_argument("--sizes", default="54,500,5000,50000")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--literal-max", type=int, default=5000, help="largest size the literal version runs at")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    print("one control period = P2 x 7 reclaims + P3 on all bottlenecks + P1 on all jobs; times in ms")
    print(f"{'nodes':>7} {'links':>7} {'flows':>6} {'ours min':>9} {'median':>8} {'cpu':>7} {'x prev':>7} "
          f"{'us/node':>8} {'literal':>10} {'lit/ours':>9}  answers")
    ours_ms: dict[int, float] = {}
    ratio: dict[int, float] = {}
    prev: float | None = None
    last_literal: tuple[int, float] | None = None
    for n in sizes:
        c = make_campus(n)
        reps = max(5, args.repeats if n <= 5000 else args.repeats // 3)
        t_ours, t_med, t_cpu = timed(lambda c=c: period_ours(c), reps)
        ours_ms[n] = t_ours
        if n <= args.literal_max:
            li = literal_inputs(c)
            t_lit = timed(lambda c=c, li=li: period_literal(c, li), 2 if n <= 500 else 1)[0]
            agree = "match" if same_answers(period_ours(c), period_literal(c, li)) else "DIFFER"
            last_literal = (n, t_lit)
            lit_txt = f"{t_lit:10.1f}"
        else:
            assert last_literal is not None
            t_lit = last_literal[1] * n / last_literal[0]
            agree = f"(literal extrapolated x n from {last_literal[0]})"
            lit_txt = f"{t_lit:9.0f}*"
        ratio[n] = t_lit / t_ours
        growth = f"{t_ours / prev:7.1f}" if prev else f"{'-':>7}"
        n_flows = len(c.flows) + sum(r["notice_s"] is not None for r in c.reclaims)
        print(f"{n:>7} {len(c.link_ids):>7} {n_flows:>6} {t_ours:9.2f} {t_med:8.2f} {t_cpu:7.2f} {growth} "
              f"{t_ours / n * 1e3:8.2f} {lit_txt} {ratio[n]:9.0f}  {agree}")
        prev = t_ours
    print("targets: < 5 ms at 500, < 50 ms at 5000, literal/ours >= 10 at 5000 "
          "(paper's C++ coordinator: 3 ms at 54, 18 ms at 500)")
    x = ours_ms.get(500, float("nan"))
    y = ours_ms.get(5000, float("nan"))
    z = ratio.get(5000, float("nan"))
    print(f"bench: 500 nodes {x:.2f} ms, 5000 nodes {y:.2f} ms, literal/ours at 5000 {z:.0f}")


if __name__ == "__main__":
    main()
