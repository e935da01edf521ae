"""A literal, per-job-loop implementation of design §2-§4, written the way docs/design.md reads.

It is the reference the benchmark (`scripts/bench_scheduler.py`) times `scheduler/` against and the
tests compare answers with. Deliberately plain Python: lists, dicts and for loops, no numpy on the
decision path. Not part of the `scheduler` package.
"""

from __future__ import annotations

import math
from collections import deque


# ---------------------------------------------------------------- P1 (design §2)
def p1_allocate(lam: list[float], ckpt: list[float], budget: float, cap: list[float]) -> list[float]:
    """Theorem 1 then Lemma 2: fix over-cap jobs at the cap, subtract, re-solve (≤ K rounds)."""
    k = len(lam)
    b = [0.0] * k
    free = [True] * k
    left = budget
    for _ in range(k + 1):
        total = 0.0
        for i in range(k):
            if free[i]:
                total += (lam[i] * ckpt[i]) ** (1.0 / 3.0)
        if total == 0.0:
            break
        share = [0.0] * k
        any_over = False
        for i in range(k):
            if free[i]:
                share[i] = max(left, 0.0) * (lam[i] * ckpt[i]) ** (1.0 / 3.0) / total
                if share[i] > cap[i]:
                    any_over = True
        if not any_over:
            for i in range(k):
                if free[i]:
                    b[i] = share[i]
            break
        for i in range(k):
            if free[i] and share[i] > cap[i]:
                b[i] = cap[i]
                free[i] = False
                left -= cap[i]
    return b


def p1_plan(jobs: list[dict], budget: float, beta: float = 0.2) -> tuple[list[dict], float]:
    """Eq. 9 and the final-checkpoint test, one job at a time."""
    lam = [j["hazard_per_s"] for j in jobs]
    ckpt = [j["ckpt_bytes"] for j in jobs]
    cap = [j.get("cap_bytes_per_s", math.inf) for j in jobs]
    b = p1_allocate(lam, ckpt, budget, cap)
    out = []
    cost = 0.0
    for i, j in enumerate(jobs):
        free = math.sqrt(2 * ckpt[i] / (lam[i] * b[i]))
        lower = ckpt[i] / (beta * b[i])
        upper = 2 * j.get("loss_budget_s", math.inf)
        at_risk = lower > upper
        interval = lower if at_risk else min(max(free, lower), upper)
        notice = j.get("notice_s")
        final = notice is not None and ckpt[i] / b[i] + j.get("restart_s", 0.0) <= notice
        cost += lam[i] * interval / 2 + ckpt[i] / (b[i] * interval)
        out.append({"id": j["id"], "bandwidth": b[i], "interval": interval, "final": final, "at_risk": at_risk})
    return out, cost


# ---------------------------------------------------------------- P3 (design §4)
def p3_paths(flows: list[dict], link_capacity: list[float], beta: float = 0.3, b_min: float = 0.0) -> list[dict]:
    """Multi-bottleneck P3, flow by flow; each flow dict has "links" (link indices on its path)."""
    budget = [max(0.0, c - max(beta * c, b_min)) for c in link_capacity]
    res = []
    for f in flows:
        slack = f["notice_s"] - f.get("restart_s", 0.0)
        r = {"id": f["id"], "reason": None, "min": 0.0, "rate": 0.0, "admitted": False}
        if slack <= 0:
            r["reason"] = "notice"
        else:
            r["min"] = f["bytes"] / slack
            if r["min"] > f.get("cap", math.inf):
                r["reason"] = "cap"
        res.append(r)
    load = [0.0] * len(link_capacity)
    for f, r in zip(flows, res, strict=True):
        if r["reason"] is None:
            for link in set(f["links"]):
                load[link] += r["min"]
    if all(load[i] <= budget[i] * (1 + 1e-12) for i in range(len(budget))):
        for r in res:
            r["admitted"] = r["reason"] is None
    else:
        left = list(budget)
        order = sorted(
            (i for i, r in enumerate(res) if r["reason"] is None), key=lambda i: (flows[i]["notice_s"], flows[i]["id"])
        )
        for i in order:
            links = set(flows[i]["links"])
            if all(res[i]["min"] <= left[link] * (1 + 1e-12) for link in links):
                res[i]["admitted"] = True
                for link in links:
                    left[link] -= res[i]["min"]
            else:
                res[i]["reason"] = "capacity"
    # Progressive filling of what is left on each link.
    slack = list(budget)
    for f, r in zip(flows, res, strict=True):
        if r["admitted"]:
            r["rate"] = r["min"]
            for link in set(f["links"]):
                slack[link] -= r["min"]
    active = [i for i, r in enumerate(res) if r["admitted"] and flows[i].get("cap", math.inf) > r["min"]]
    while active:
        count = [0] * len(budget)
        for i in active:
            for link in set(flows[i]["links"]):
                count[link] += 1
        step = math.inf
        for link in range(len(budget)):
            if count[link]:
                step = min(step, max(slack[link], 0.0) / count[link])
        for i in active:
            step = min(step, flows[i].get("cap", math.inf) - res[i]["rate"])
        if not math.isfinite(step):
            break
        for i in active:
            res[i]["rate"] += step
            for link in set(flows[i]["links"]):
                slack[link] -= step
        still = []
        for i in active:
            full_link = any(slack[link] <= 1e-9 * max(1.0, step) for link in set(flows[i]["links"]))
            cap = flows[i].get("cap", math.inf)
            capped = cap - res[i]["rate"] <= 1e-12 * max(1.0, cap if math.isfinite(cap) else 0.0)
            if not (full_link or capped):
                still.append(i)
        active = still
    return res


# ---------------------------------------------------------------- P2 (design §3)
class LiteralTree:
    """The campus tree as a dict of adjacency lists; paths found by walking parents."""

    def __init__(self, links: list[dict]) -> None:
        self.adj: dict[str, list[tuple[str, int]]] = {}
        for i, link in enumerate(links):
            self.adj.setdefault(link["a"], []).append((link["b"], i))
            self.adj.setdefault(link["b"], []).append((link["a"], i))
        root = links[0]["a"] if links else ""
        self.parent: dict[str, tuple[str | None, int]] = {root: (None, -1)}
        self.depth: dict[str, int] = {root: 0}
        queue = deque([root])
        while queue:
            u = queue.popleft()
            for v, i in self.adj.get(u, []):
                if v not in self.parent:
                    self.parent[v] = (u, i)
                    self.depth[v] = self.depth[u] + 1
                    queue.append(v)

    def path(self, s: str, d: str) -> list[int]:
        out = []
        while self.depth[s] > self.depth[d]:
            s, i = self.parent[s]  # type: ignore[assignment]
            out.append(i)
        while self.depth[d] > self.depth[s]:
            d, i = self.parent[d]  # type: ignore[assignment]
            out.append(i)
        while s != d:
            s, i = self.parent[s]  # type: ignore[assignment]
            out.append(i)
            d, j = self.parent[d]  # type: ignore[assignment]
            out.append(j)
        return out

    def bottleneck(self, s: str, d: str, bw: list[float]) -> float:
        best = math.inf
        for i in self.path(s, d):
            best = min(best, bw[i])
        return best


def p2_select(tree: LiteralTree, bw: list[float], nodes: list[dict], req: dict) -> tuple[str | None, dict]:
    """design §3 one node at a time; returns (destination id, {id: score}) over the candidates."""
    by_id = {n["id"]: n for n in nodes}
    src, holder = req["source"], req.get("ckpt_holder", req["source"])
    c, tr = req["ckpt_bytes"], req.get("restart_s", 0.0)
    notice = req.get("notice_s")
    feasible = []
    for n in nodes:
        if n["id"] == src:
            continue
        if n["vram_gb"] < req.get("vram_gb", 0) or n["capability"] < req.get("min_capability", 0):
            continue
        if not n.get("compatible", True) or n["free_gpus"] < req.get("gpus", 1):
            continue
        t = c / tree.bottleneck(holder, n["id"], bw) + tr
        if notice is not None and t > notice:
            continue
        feasible.append((n, t))
    local = [(n, t) for n, t in feasible if n["building"] == by_id[src]["building"]]
    cands = local if len(local) >= max(req.get("k_min", 2), 1) else feasible  # an empty D_ℓ never wins
    others = [
        o for o in nodes
        if o["id"] != src and o["vram_gb"] >= req.get("vram_gb", 0) and o["capability"] >= req.get("min_capability", 0)
    ]
    scores = {}
    for n, t in cands:
        total, count = 0.0, 0
        for o in others:
            if o["id"] != n["id"]:
                total += c / tree.bottleneck(n["id"], o["id"], bw) + tr
                count += 1
        t_bar = total / count if count else 0.0
        integral = 0.0
        hour = req.get("now_hour", 0.0) % 24.0
        left = req["remaining_s"]
        while left > 0:
            k = int(hour) % 24
            step = min(left, (math.floor(hour) + 1 - hour) * 3600.0)
            integral += n["hazard_per_s_by_hour"][k] * step
            left -= step
            hour += step / 3600.0
        surv = math.exp(-integral)
        scores[n["id"]] = t + req.get("alpha", 1.0) * (1 - surv) * t_bar
    if not scores:
        return None, scores
    low = min(scores.values())
    best = min(i for i in scores if scores[i] <= low + 1e-12 * abs(low))  # ties up to rounding: smallest id
    return best, scores
