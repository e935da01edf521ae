"""Synthetic campus trace generator matching the paper's deployment statistics (design §6), design §7 output.

    python -m scheduler.sim.tracegen --out trace.json|FOLDER [--days 60] [--seed 1]   (FOLDER: CSV files)

Prints every generated statistic next to its design §6 target. Model (all times in seconds):
- emergency hazard λ(t) = base · diurnal(hour) · drift(t): diurnal has smooth peaks 11:30-13:00 and
  17:30-20:00 reaching ~6x the off-peak level; drift multiplies by 1.7 from day 35 to day 42;
- scheduled reclaims are a flatter process sized so 42% of departures are emergencies; notice ≥ 10 s;
- a node leaves (reclaim), the owner keeps it for a lognormal time, then lends it again (``return_s``);
- some emergency events are building-wide bursts (up to 7 nodes at the same second);
- available bandwidth per link every 600 s: mean (access ≈ 820, building uplink ≈ 240 Mbit/s) x
  (1 + 0.6·x) with x ∈ [-1, 1] an AR(1) swing minus a term in λ(t) (gives corr(λ, B) ≈ -0.43);
- research demand per link: 15-40% of the available bandwidth, higher by day.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

import numpy as np

from scheduler.sim.trace import Trace, save, validate

DAY_S = 86400.0
EPOCH_S = 600.0
MBIT = 1e6 / 8.0
INITIAL_NOTICE_S = 10.0  # notice of the reclaim at t = 0 that marks a node not lent when the trace starts
GPU_MIX = (  # (name, count, gpus per node, vram_gb, capability) — design §6, plus one 3090 to make 54
    ("RTX3090", 21, 1, 24.0, 8.6), ("RTX4090", 15, 1, 24.0, 8.9),
    ("A100x4", 8, 4, 80.0, 8.0), ("A6000x2", 10, 2, 48.0, 8.6),
)


@dataclass(frozen=True)
class GenConfig:
    """Generator knobs; defaults are design §6's two-month, 54-node campus."""

    days: float = 60.0
    seed: int = 1
    n_jobs: int = 312
    total_gpu_h: float = 4890.0
    departures: int = 847
    emergency_frac: float = 0.42
    peak_ratio: float = 6.0
    drift_start_day: float = 35.0
    drift_days: float = 7.0
    drift_factor: float = 1.7
    intra_mbit: float = 820.0
    cross_mbit: float = 240.0
    swing: float = 0.6
    lam_b_coupling: float = 0.13
    burst_prob: float = 0.08
    max_burst: int = 7
    lent_mean_h: float = 23.0
    owner_mean_h: float = 69.0
    buildings: int = 4
    node_scale: float = 1.0  # fraction of the 54-node mix (small traces for tests)


# The paper-hazard campus (design §21.3): the count-faithful campus's statistics, but lending windows and owner periods
# this many times shorter (the lent share is unchanged) and as many times the departures per day, so the emergency
# hazard per lent node in its lent hours is ≈ 1/h (0.0164/h x 61 measured on seed 1: ≈ 1.0/h), which is what the
# paper's 10-minute static interval and 18-minute re-convergence imply. It may be shorter than the 60-day campus.
PAPER_HAZARD_X = 61.0
PAPER_HAZARD_DAYS = 7.0


def scaled_config(factor: float, days: float, seed: int = 1, base: GenConfig | None = None) -> GenConfig:
    """`base` (default: the count-faithful campus) over `days` with jobs and GPU-hours in proportion, lending
    windows and owner periods `factor` x shorter (same lent share) and `factor` x the departures per day, so
    `factor` x its emergency hazard per lent node; the 1.7x drift step sits at the same share of the days."""
    if not (factor > 0 and days > 0):
        raise ValueError(f"factor and days must be > 0, got {factor!r}, {days!r}")
    b = base or GenConfig()
    share = days / b.days
    return GenConfig(days=days, seed=seed, n_jobs=max(1, round(b.n_jobs * share)),
                     total_gpu_h=b.total_gpu_h * share, departures=max(1, round(b.departures * share * factor)),
                     emergency_frac=b.emergency_frac, peak_ratio=b.peak_ratio,
                     drift_start_day=b.drift_start_day * share, drift_days=b.drift_days * share,
                     drift_factor=b.drift_factor, intra_mbit=b.intra_mbit, cross_mbit=b.cross_mbit, swing=b.swing,
                     lam_b_coupling=b.lam_b_coupling, burst_prob=b.burst_prob, max_burst=b.max_burst,
                     lent_mean_h=b.lent_mean_h / factor, owner_mean_h=b.owner_mean_h / factor,
                     buildings=b.buildings, node_scale=b.node_scale)


def paper_hazard_config(days: float = PAPER_HAZARD_DAYS, seed: int = 1) -> GenConfig:
    """The paper-hazard campus (≈ 1/h emergency hazard per lent node): `scaled_config(PAPER_HAZARD_X, days)`."""
    return scaled_config(PAPER_HAZARD_X, days, seed)


def diurnal(hour: np.ndarray, peak_ratio: float = 6.0) -> np.ndarray:
    """Relative emergency hazard by hour of day: 1 off-peak, `peak_ratio` inside both peak windows."""
    h = np.asarray(hour, dtype=float) % 24.0

    def bump(lo: float, hi: float) -> np.ndarray:
        ramp = 0.5  # hours of cosine ramp either side
        x = np.clip(np.minimum(h - (lo - ramp), (hi + ramp) - h) / ramp, 0.0, 1.0)
        return 0.5 - 0.5 * np.cos(np.pi * x)

    return 1.0 + (peak_ratio - 1.0) * np.maximum(bump(11.5, 13.0), bump(17.5, 20.0))


def hazard_shape(t_s: np.ndarray, cfg: GenConfig) -> np.ndarray:
    """Unscaled emergency hazard shape over time (diurnal x drift step)."""
    t = np.asarray(t_s, dtype=float)
    d0 = cfg.drift_start_day * DAY_S
    drift = np.where((t >= d0) & (t < d0 + cfg.drift_days * DAY_S), cfg.drift_factor, 1.0)
    return diurnal(t / 3600.0, cfg.peak_ratio) * drift


def _nodes(cfg: GenConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    rows = []
    for name, count, gpus, vram, cap in GPU_MIX:
        rows += [(name, gpus, vram, cap)] * max(1, round(count * cfg.node_scale))
    n = len(rows)
    building = np.array([f"b{i % cfg.buildings}" for i in rng.permutation(n)], dtype=object)
    return {
        "id": np.array([f"n{i:02d}" for i in range(n)], dtype=object),
        "building": building,
        "gpus": np.array([r[1] for r in rows], dtype=float),
        "vram_gb": np.array([r[2] for r in rows], dtype=float),
        "capability": np.array([r[3] for r in rows], dtype=float),
    }


def _links(nodes: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Three-tier tree: node—building switch (1 Gbit/s), building switch—core (10 Gbit/s)."""
    blds = sorted(set(nodes["building"]))
    ids, a, b, cap = [], [], [], []
    for nid, bl in zip(nodes["id"], nodes["building"], strict=True):
        ids.append(f"acc-{nid}")
        a.append(nid)
        b.append(f"sw-{bl}")
        cap.append(1000 * MBIT)
    for bl in blds:
        ids.append(f"up-{bl}")
        a.append(f"sw-{bl}")
        b.append("core")
        cap.append(10000 * MBIT)
    return {"id": np.array(ids, dtype=object), "a": np.array(a, dtype=object),
            "b": np.array(b, dtype=object), "bytes_per_s": np.array(cap)}


def _departures(nodes: dict[str, np.ndarray], cfg: GenConfig, rng: np.random.Generator,
                scale: float) -> dict[str, np.ndarray]:
    """Per node: lending windows ended by a departure (thinning of emergency + scheduled rates), then an
    owner period (lognormal, mean `owner_mean_h`), then lent again at ``return_s``. A node not lent at
    t = 0 is written as a scheduled reclaim at t = 0 (10 s notice) returning when its first window opens.
    Some emergencies are building-wide bursts that end the lent peers' windows at the same second."""
    horizon = cfg.days * DAY_S
    n = len(nodes["id"])
    lent_frac = cfg.lent_mean_h / (cfg.lent_mean_h + cfg.owner_mean_h)
    per_lent_s = scale / (cfg.lent_mean_h * 3600.0)  # departures per lent node-second
    extra = 1.0 + cfg.burst_prob * cfg.max_burst / 3.3
    lam_s = (1.0 - cfg.emergency_frac) * per_lent_s
    mean_shape = float(np.mean(hazard_shape(np.arange(0, horizon, 300.0), cfg)))
    lam_e_base = cfg.emergency_frac / extra * per_lent_s / mean_shape
    bound = lam_e_base * cfg.peak_ratio * cfg.drift_factor + lam_s
    sig = 1.0
    mu = np.log(cfg.owner_mean_h * 3600.0) - sig**2 / 2
    windows: list[list[list[float]]] = []  # per node: [start, end, notice, kind(1=emergency)]
    for _ in range(n):
        wins: list[list[float]] = []
        t = 0.0 if rng.random() < lent_frac else float(rng.exponential(cfg.owner_mean_h * 3600.0))
        while t < horizon:
            start = t
            while True:
                t += rng.exponential(1.0 / bound)
                if t >= horizon:
                    break
                le = lam_e_base * float(hazard_shape(np.array([t]), cfg)[0])
                u = rng.random() * bound
                if u <= le + lam_s:
                    break
            if t >= horizon:
                wins.append([start, np.inf, 0.0, 0.0])
                break
            emergency = u <= le
            notice = 0.0 if emergency else float(np.clip(rng.lognormal(np.log(120.0), 0.9), 10.0, 1800.0))
            wins.append([start, t, notice, 1.0 if emergency else 0.0])
            t += notice + float(np.clip(rng.lognormal(mu, sig), 1800.0, 20 * DAY_S))
        windows.append(wins)
    bld = nodes["building"]
    for i in range(n):  # bursts: end the windows of lent peers in the same building at the same time
        for w in windows[i]:
            if w[3] != 1.0 or not np.isfinite(w[1]) or rng.random() >= cfg.burst_prob:
                continue
            k = int(rng.integers(1, cfg.max_burst))
            peers = [p for p in rng.permutation(np.flatnonzero(bld == bld[i])) if p != i]
            hit = 0
            for p in peers:
                for pw in windows[p]:
                    if pw[0] < w[1] < pw[1] and hit < k:
                        pw[1], pw[2], pw[3] = w[1], 0.0, 1.0
                        hit += 1
    _largest_burst(windows, bld, cfg.max_burst)
    return _reclaim_rows(windows, nodes["id"])


def _reclaim_rows(windows: list[list[list[float]]], node_ids: np.ndarray) -> dict[str, np.ndarray]:
    """design §7 reclaim rows from per-node lending windows [start, end, notice, emergency]: each finite end
    is a reclaim returning when the next window opens; a node whose first window opens after t = 0 is
    reclaimed at 0 with INITIAL_NOTICE_S (or counts as lent from the start if it opens before that
    notice could end, so no row ever returns before its deadline)."""
    out_node, out_t, out_notice, out_ret = [], [], [], []
    for i, wins in enumerate(windows):
        if wins and 0 < wins[0][0] <= INITIAL_NOTICE_S:
            wins[0][0] = 0.0
        if wins and wins[0][0] > 0:
            out_node.append(i)
            out_t.append(0.0)
            out_notice.append(INITIAL_NOTICE_S)
            out_ret.append(wins[0][0])
        for k, w in enumerate(wins):
            if not np.isfinite(w[1]):
                continue
            nxt = wins[k + 1][0] if k + 1 < len(wins) else np.nan
            if np.isfinite(nxt) and nxt < w[1] + w[2]:
                nxt = w[1] + w[2] + 1800.0
            out_node.append(i)
            out_t.append(w[1])
            out_notice.append(w[2])
            out_ret.append(nxt)
    order = np.argsort(np.array(out_t), kind="stable")
    node_idx = np.array(out_node, dtype=int)[order]
    return {"node": node_ids[node_idx], "t_s": np.array(out_t)[order],
            "notice_s": np.array(out_notice)[order], "return_s": np.array(out_ret)[order]}


def _largest_burst(windows: list[list[list[float]]], bld: np.ndarray, size: int) -> None:
    """Make sure one burst reaches `size` simultaneous departures (design §6: up to 7) if any building ever
    has that many nodes lent at an emergency: the emergency with the most lent peers takes them along."""
    rows = [(i, w) for i in range(len(windows)) for w in windows[i]]
    node = np.array([i for i, _ in rows])
    start = np.array([w[0] for _, w in rows])
    end = np.array([w[1] for _, w in rows])
    _, code = np.unique(bld.astype(str), return_inverse=True)  # building as an integer code, per node
    row_code = code[node] if node.size else np.zeros(0, dtype=int)
    best, best_hit = -1, np.zeros(0, dtype=int)
    for k, (i, w) in enumerate(rows):
        if w[3] != 1.0 or not np.isfinite(w[1]):
            continue
        hit = np.flatnonzero((start < w[1]) & (end > w[1]) & (row_code == code[i]) & (node != i))
        if hit.size + 1 > best_hit.size + 1 or best < 0:
            best, best_hit = k, hit
    if best < 0 or best_hit.size + 1 < size:
        return
    t = rows[best][1][1]
    if np.sum(end == t) >= size:
        return
    for h in best_hit[: size - 1]:
        w = rows[h][1]
        w[1], w[2], w[3] = t, 0.0, 1.0


def _bandwidth(links: dict[str, np.ndarray], cfg: GenConfig, rng: np.random.Generator
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Available bandwidth and research demand per link per 600 s epoch."""
    t = np.arange(0.0, cfg.days * DAY_S, EPOCH_S)
    lam = hazard_shape(t, cfg)
    z = (lam - lam.mean()) / lam.std()
    n_l = len(links["id"])
    x = np.empty((n_l, len(t)))
    x[:, 0] = rng.normal(size=n_l)
    phi = 0.5
    noise = rng.normal(size=(n_l, len(t))) * np.sqrt(1 - phi**2)
    for k in range(1, len(t)):
        x[:, k] = phi * x[:, k - 1] + noise[:, k]
    common = rng.normal(size=len(t))  # campus-wide swing shared by all links
    sig = 0.6 * x + 0.5 * common[None, :] - cfg.lam_b_coupling * 2.0 * z[None, :]
    sig = np.tanh(sig / 1.5)  # x ∈ (-1, 1): at most ±swing
    mean = np.where(np.char.startswith(links["id"].astype(str), "acc-"), cfg.intra_mbit, cfg.cross_mbit) * MBIT
    bw = mean[:, None] * (1.0 + cfg.swing * sig)
    day = ((t / 3600.0) % 24 >= 8) & ((t / 3600.0) % 24 < 22)
    frac = 0.15 + 0.2 * day[None, :] + 0.05 * rng.random((n_l, len(t)))
    res = bw * frac
    lk = np.repeat(links["id"], len(t))
    tt = np.tile(t, n_l)
    return ({"link": lk, "t_s": tt, "bytes_per_s": bw.ravel()},
            {"link": lk.copy(), "t_s": tt.copy(), "bytes_per_s": res.ravel()}, bw)


def _jobs(cfg: GenConfig, rng: np.random.Generator, gpu_choices: np.ndarray | None = None
          ) -> dict[str, np.ndarray]:
    """312 jobs, 4,890 GPU-h; checkpoint sizes lognormal median 3.2 GB clipped to [120 MB, 48 GB]."""
    n = cfg.n_jobs
    horizon = cfg.days * DAY_S
    submit = np.sort(rng.uniform(0.0, 0.85 * horizon, n))
    if gpu_choices is None:
        gpus = rng.choice([1, 1, 1, 1, 1, 1, 2, 2, 4, 4], size=n).astype(float)
    else:
        gpus = rng.choice(gpu_choices, size=n).astype(float)
    work = rng.lognormal(np.log(8 * 3600.0), 0.8, n)
    work *= cfg.total_gpu_h * 3600.0 / float(np.sum(work * gpus))
    ckpt = np.clip(rng.lognormal(np.log(3.2e9), 1.2, n), 120e6, 48e9)
    ckpt *= 3.2e9 / float(np.median(ckpt))
    ckpt[np.argmin(ckpt)], ckpt[np.argmax(ckpt)] = 120e6, 48e9  # the paper's observed range ends
    ckpt = np.clip(ckpt, 120e6, 48e9)
    vram = np.where(gpus >= 4, 40.0, rng.choice([8.0, 16.0, 24.0], n))
    mincap = rng.choice([7.0, 8.0], n)
    restart = 15.0 + ckpt / 1e9 * 2.0 + rng.uniform(0, 20, n)
    budget = rng.choice([900.0, 1800.0, 3600.0], n)
    return {"id": np.array([f"j{i:03d}" for i in range(n)], dtype=object), "submit_s": submit,
            "gpus": gpus, "vram_gb": vram, "min_capability": mincap, "work_s": work,
            "ckpt_bytes": ckpt, "restart_s": restart, "loss_budget_s": budget}


def generate(cfg: GenConfig | None = None, gpu_choices: np.ndarray | None = None) -> Trace:
    """Generate one deterministic trace for `cfg.seed` (design §6 statistics, design §7 format)."""
    cfg = cfg or GenConfig()
    nodes = _nodes(cfg, np.random.default_rng([cfg.seed, 1]))
    links = _links(nodes)
    # Calibrate the departure rate so the expected count matches (owner-away time removes exposure).
    scale = 1.0
    if cfg.departures > 0:
        for _ in range(3):
            rec = _departures(nodes, cfg, np.random.default_rng([cfg.seed, 2]), scale)
            target = cfg.departures * len(nodes["id"]) / 54.0
            scale *= target / max(int(np.sum(rec["t_s"] > 0)), 1)
        rec = _departures(nodes, cfg, np.random.default_rng([cfg.seed, 2]), scale)
    else:  # the caller supplies reclaims (external-trace adapters)
        rec = {"node": np.zeros(0, dtype=object), "t_s": np.zeros(0), "notice_s": np.zeros(0),
               "return_s": np.zeros(0)}
    bw, res, _ = _bandwidth(links, cfg, np.random.default_rng([cfg.seed, 3]))
    jobs = _jobs(cfg, np.random.default_rng([cfg.seed, 4]), gpu_choices)
    horizon = cfg.days * DAY_S
    ht = np.arange(0.0, horizon, 300.0)
    n_em = float(np.sum(rec["notice_s"] == 0))
    lent_node_s = _lent_node_s(rec, len(nodes["id"]), horizon)
    shape = hazard_shape(ht, cfg)
    lam0 = n_em / lent_node_s / float(np.mean(shape)) if lent_node_s > 0 else 0.0
    tables = {"nodes": nodes, "links": links, "jobs": jobs, "reclaims": rec, "bandwidth": bw,
              "research": res, "hazard": {"t_s": ht, "per_s": lam0 * shape}}
    tr = Trace(tables=tables, horizon_s=horizon, meta={"config": cfg})
    validate(tr)
    return tr


def _lent_node_s(rec: dict[str, np.ndarray], n_nodes: int, horizon: float) -> float:
    ret = np.where(np.isnan(rec["return_s"]), horizon, rec["return_s"])
    away = np.minimum(ret, horizon) - np.minimum(rec["t_s"] + rec["notice_s"], horizon)
    return n_nodes * horizon - float(np.sum(away))


def statistics(tr: Trace) -> list[tuple[str, str, str]]:
    """(statistic, generated, design §6 target) rows."""
    n = tr.tables["nodes"]
    j = tr.tables["jobs"]
    r0 = tr.tables["reclaims"]
    real = r0["t_s"] > 0  # t = 0 rows only encode "not lent at the start"
    r = {k: v[real] for k, v in r0.items()}
    mix = {}
    for g, v in zip(n["gpus"], n["vram_gb"], strict=True):
        mix[(int(g), int(v))] = mix.get((int(g), int(v)), 0) + 1
    em = r["notice_s"] == 0
    rows = [
        ("nodes / buildings", f"{len(n['id'])} / {len(set(n['building']))}", "54 / 4"),
        ("GPU mix (gpusxvram: nodes)", ", ".join(f"{g}x{v}GB: {c}" for (g, v), c in sorted(mix.items())),
         "20 RTX3090, 15 RTX4090 (1x24GB), 8 A100x4, 10 A6000x2"),
        ("jobs / GPU-h", f"{len(j['id'])} / {float(np.sum(j['gpus'] * j['work_s'])) / 3600:.0f}", "312 / 4890"),
        ("departures", f"{len(r['t_s'])}", "847"),
        ("emergency share", f"{100 * float(np.mean(em)):.1f}%", "42%"),
        ("min notice (scheduled)", f"{float(np.min(r['notice_s'][~em])) if np.any(~em) else 0:.0f} s", ">= 10 s"),
    ]
    hours = (r["t_s"][em] / 3600.0) % 24.0
    lent_h = np.zeros(24)
    t = np.arange(0, tr.horizon_s, 300.0)
    np.add.at(lent_h, ((t / 3600) % 24).astype(int), 1)
    counts = np.bincount(hours.astype(int), minlength=24) / np.maximum(lent_h, 1)
    peak_h = [11, 12, 17, 18, 19]
    off = [h for h in range(24) if h not in (10, 11, 12, 13, 16, 17, 18, 19, 20)]
    ratio = float(np.mean(counts[peak_h]) / max(np.mean(counts[off]), 1e-12))
    rows.append(("emergency peak/off-peak (by hour)", f"{ratio:.1f}x", "up to 6x (11:30-13:00, 17:30-20:00)"))
    if "hazard" in tr.tables:
        hz = tr.tables["hazard"]["per_s"]
        rows.append(("true hazard max/min", f"{float(hz.max() / hz.min()):.1f}x (incl. 1.7x drift)", "6x, 1.7x step"))
        rows.append(("mean emergency hazard", f"{float(hz.mean()) * 3600:.3f}/h per node", "≈0.99/h per spot GPU-h"))
    c = j["ckpt_bytes"]
    rows.append(("checkpoint min/median/max", f"{c.min() / 1e6:.0f} MB / {np.median(c) / 1e9:.2f} GB / "
                 f"{c.max() / 1e9:.1f} GB", "120 MB / 3.2 GB / 48 GB"))
    bw = tr.tables["bandwidth"]
    acc = np.char.startswith(bw["link"].astype(str), "acc-")
    v = bw["bytes_per_s"] / MBIT
    rows.append(("intra-building / cross-core Mbit/s", f"{v[acc].mean():.0f} / {v[~acc].mean():.0f}", "≈820 / ≈240"))
    rows.append(("swing (p2/p98 vs mean)", f"{100 * (np.percentile(v[acc], 2) / v[acc].mean() - 1):+.0f}% / "
                 f"{100 * (np.percentile(v[acc], 98) / v[acc].mean() - 1):+.0f}%", "±60%"))
    if "hazard" in tr.tables:
        hz = tr.tables["hazard"]
        tb = bw["t_s"][acc]
        e = (tb // EPOCH_S).astype(int)
        mean_b = np.bincount(e, weights=v[acc]) / np.maximum(np.bincount(e), 1)
        lam_e = np.interp(np.arange(len(mean_b)) * EPOCH_S, hz["t_s"], hz["per_s"])
        rows.append(("corr(λ, B_eff)", f"{float(np.corrcoef(lam_e, mean_b)[0, 1]):+.2f}", "-0.43"))
    _, cnt = np.unique(r["t_s"], return_counts=True)
    rows.append(("max simultaneous departures", f"{int(cnt.max()) if len(cnt) else 0}", "up to 7"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scheduler.sim.tracegen", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output .json file or CSV folder")
    ap.add_argument("--days", type=float, default=None, help="default 60 (paper-hazard campus: 7)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=312)
    ap.add_argument("--node-scale", type=float, default=1.0)
    ap.add_argument("--paper-hazard", action="store_true",
                    help="the paper-hazard campus of design §21.3 (≈ 1/h emergency hazard per lent node)")
    args = ap.parse_args(argv)
    if args.paper_hazard:
        cfg = replace(paper_hazard_config(args.days or PAPER_HAZARD_DAYS, args.seed), node_scale=args.node_scale)
    else:
        days = args.days or 60.0
        frac = days / 60.0
        cfg = GenConfig(days=days, seed=args.seed, n_jobs=args.jobs, node_scale=args.node_scale,
                        departures=max(1, round(847 * frac)), total_gpu_h=4890.0 * frac * args.jobs / 312,
                        drift_start_day=min(35.0, days * 0.55), drift_days=min(7.0, days * 0.12))
    tr = generate(cfg)
    save(tr, args.out)
    print(f"{'statistic':38s} {'generated':44s} target (design §6)")
    for name, got, want in statistics(tr):
        print(f"{name:38s} {got:44s} {want}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
