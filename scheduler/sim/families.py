"""Trace families (design §21.5): six campus generators with named knobs, built from public trace formats.

Each family is a frozen knob dataclass and a pure generator ``build(family, seed, **knobs) -> Trace`` (design §7
format). The campus around the reclaims (nodes, links, available bandwidth, research traffic, jobs) is the
design §6 generator's (`scheduler.sim.tracegen.generate` with no departures), scaled to the family's nodes and
days; each family replaces what defines it. No I/O: the statistics taken from the public traces in
``shared/traces`` are constants here (measured once, see ``SOURCE`` per family), so a clone without that folder
builds every family.

- ``spot-1gpu``: preemption logs of single-GPU spot instances (skypilot ``availability-1node`` / ``preemption-1node``,
  V100, AWS): per node, lent and away periods alternate, lognormal with the trace's medians and spreads.
- ``small-pool``: availability log of a pool of at most 16 nodes (skypilot ``availability-16node``): the number of
  lent nodes jumps at exponential times by sizes drawn from the trace's jump-size histogram (many jumps are the
  whole pool).
- ``pod-list``: a cluster's pod list (alibaba ``cluster-trace-gpu-v2023``): jobs arrive in batches of a Poisson
  process, sizes from the trace's GPU-count histogram (8-GPU pods capped at 4, the largest node), heavy-tailed
  lognormal durations; a steady background of departures.
- ``diurnal-lab``: lab machines whose owners come back at the day's peak hours (weekdays), stay a few hours, and
  lend the machine again; little at night and at weekends.
- ``correlated``: lab-wide reclaims: at each provider event every lent node of that provider (building) leaves at
  the same second and returns together after an outage; a light independent background.
- ``drift``: a constant hazard that steps (or ramps) to ``factor`` x mid-trace; the true hazard is in the trace's
  ``hazard`` table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from scheduler.sim.trace import Trace, validate
from scheduler.sim.tracegen import DAY_S, GenConfig, _reclaim_rows, generate

HOUR_S = 3600.0

# Alibaba cluster-trace-gpu-v2023 openb_pod_list_multigpu50.csv: pods per GPU count (0-GPU pods dropped)
ALIBABA_GPU_HIST = {1: 6989, 2: 222, 4: 206, 8: 556}
# skypilot availability-16node-aws-08-27-2023-us-west-2a_v100_1.json (16.4 days, 300 s samples): sizes of
# the drops and rises of the available count (145 drops, 132 rises; mean hold between changes 1.42 h)
POOL16_DROPS = {16: 55, 1: 22, 8: 11, 2: 9, 14: 8, 15: 8, 6: 6, 10: 5, 5: 4, 9: 4, 7: 4, 11: 3, 4: 3, 3: 2, 12: 1}
POOL16_RISES = {16: 66, 1: 11, 2: 7, 8: 6, 3: 6, 5: 5, 9: 5, 14: 5, 6: 4, 4: 3, 12: 3, 15: 3, 10: 3, 11: 2,
                13: 2, 7: 1}


@dataclass(frozen=True)
class FamilyBase:
    """Knobs every family has: campus size and length, the jobs' share of the GPU-time."""

    nodes: int = 12
    days: float = 3.0
    load: float = 0.25  # jobs' GPU-hours as a share of the campus's GPU-hours
    emergency_share: float = 0.5  # the rest are scheduled reclaims with a notice of notice_lo_s..notice_hi_s
    notice_lo_s: float = 30.0
    notice_hi_s: float = 120.0


@dataclass(frozen=True)
class SpotOneGpu(FamilyBase):
    """skypilot 1-node V100 logs: available runs median 0.32 h (log-sd 0.93), unavailable median 0.54 h
    (log-sd 1.59) in availability-1node; 0.36 h / 0.52 h (log-sd 1.57 / 1.67) in preemption-1node."""

    nodes: int = 10
    lent_median_h: float = 0.9  # the trace's 0.32 h lengthened so a job can make progress at all
    lent_sigma: float = 1.0
    away_median_h: float = 0.54
    away_sigma: float = 1.6


@dataclass(frozen=True)
class SmallPool(FamilyBase):
    """skypilot 16-node availability: jumps every `hold_h` on average, sizes from POOL16_* scaled to `nodes`."""

    nodes: int = 12
    hold_h: float = 1.42
    drop_prob: float = 145 / 277  # share of the trace's jumps that are drops


@dataclass(frozen=True)
class PodList(FamilyBase):
    """Alibaba GPU pod sizes; arrivals in batches (a sweep or a hyper-parameter search), heavy-tailed durations."""

    batch_mean: float = 3.0  # mean jobs per arrival batch (geometric)
    duration_median_h: float = 2.0
    duration_sigma: float = 1.4
    lent_mean_h: float = 8.0  # background departures: lent windows exponential with this mean
    away_mean_h: float = 3.0


@dataclass(frozen=True)
class DiurnalLab(FamilyBase):
    """Owners return at peak hours of weekdays (design §6's peaks moved to a lab's working day)."""

    base_per_h: float = 0.05  # hazard per lent node off-peak
    peak_ratio: float = 10.0
    peaks: tuple[tuple[float, float], ...] = ((9.0, 11.0), (13.5, 16.0))
    weekend_factor: float = 0.3
    away_median_h: float = 3.0
    away_sigma: float = 0.6
    emergency_share: float = 0.7


@dataclass(frozen=True)
class Correlated(FamilyBase):
    """Each provider (building) loses every lent node at once at rate `event_per_h`; outages lognormal."""

    providers: int = 3
    event_per_h: float = 0.08
    outage_median_h: float = 1.5
    outage_sigma: float = 0.8
    background_per_h: float = 0.02
    away_median_h: float = 1.0
    emergency_share: float = 0.8


@dataclass(frozen=True)
class Drift(FamilyBase):
    """Constant hazard `base_per_h` per lent node, then x`factor`: a step at `change_frac` of the trace
    ('step') or a linear ramp from `change_frac` to the end ('ramp')."""

    base_per_h: float = 0.15
    factor: float = 3.0
    change_frac: float = 0.5
    mode: str = "step"
    away_median_h: float = 1.5
    away_sigma: float = 0.8


FAMILIES: dict[str, type[FamilyBase]] = {
    "spot-1gpu": SpotOneGpu, "small-pool": SmallPool, "pod-list": PodList, "diurnal-lab": DiurnalLab,
    "correlated": Correlated, "drift": Drift,
}
SOURCE = {
    "spot-1gpu": "skypilot-org/spot-traces availability-1node / preemption-1node (run lengths resampled)",
    "small-pool": "skypilot-org/spot-traces availability-16node (jump sizes and rate resampled)",
    "pod-list": "alibaba/clusterdata cluster-trace-gpu-v2023 openb_pod_list_multigpu50 (GPU-count histogram)",
    "diurnal-lab": "generator (design §6 diurnal model, owner returns at a lab's peak hours)",
    "correlated": "generator (provider-wide outages, as in bamboo's and skypilot's all-at-once drops)",
    "drift": "generator (design §2 drift: hazard step or ramp mid-trace)",
}


def knobs(name: str, **overrides: Any) -> FamilyBase:
    """The knob set of family `name` with `overrides` (ValueError on an unknown family or knob)."""
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; one of {', '.join(FAMILIES)}")
    cls = FAMILIES[name]
    names = {f.name for f in fields(cls)}
    bad = set(overrides) - names
    if bad:
        raise ValueError(f"unknown knob(s) {', '.join(sorted(bad))} for family {name!r}; one of {', '.join(sorted(names))}")
    k = cls(**overrides)
    if k.nodes < 1 or k.days <= 0:
        raise ValueError("nodes must be >= 1 and days > 0")
    if name == "small-pool" and k.nodes > 16:
        raise ValueError("small-pool has at most 16 nodes")
    return k


def _base(k: FamilyBase, seed: int, gpu_choices: np.ndarray | None = None, n_jobs: int | None = None) -> Trace:
    """The design §6 campus (no departures) of about k.nodes nodes over k.days, jobs at k.load of its GPU-time.
    Every building gets at least two nodes, so every node has a pre-sync replica off itself (design §2; a node
    alone in its building has none, and its jobs run on to the deadline instead of draining)."""
    scale = k.nodes / 54.0
    gpu_h = max(1.0, 88.0 * scale * k.days * 24.0 * k.load)
    cfg = GenConfig(days=k.days, seed=seed, node_scale=scale, n_jobs=n_jobs or max(8, round(gpu_h / 12.0)),
                    total_gpu_h=gpu_h, departures=0, drift_start_day=k.days * 0.55, drift_days=k.days * 0.12,
                    buildings=max(1, min(getattr(k, "providers", 4), k.nodes // 2)))
    return generate(cfg, gpu_choices=gpu_choices)


def _notice(k: FamilyBase, rng: np.random.Generator) -> float:
    return 0.0 if rng.random() < k.emergency_share else float(rng.uniform(k.notice_lo_s, k.notice_hi_s))


def _lognormal_s(rng: np.random.Generator, median_h: float, sigma: float) -> float:
    return float(np.clip(rng.lognormal(np.log(median_h * HOUR_S), sigma), 300.0, 20 * DAY_S))


Windows = list[list[list[float]]]  # per node: [start, end, notice, emergency] (tracegen's lending windows)


def _thinned_windows(n: int, horizon_s: float, hazard_per_s: Any, bound_per_s: float, away: Any,
                     k: FamilyBase, rng: np.random.Generator) -> Windows:
    """Per node, lent windows ended by a departure of hazard `hazard_per_s(t)` (thinning under `bound_per_s`),
    each followed by an owner period of `away()` seconds."""
    out: Windows = []
    for _ in range(n):
        wins: list[list[float]] = []
        t = 0.0
        while t < horizon_s:
            start = t
            while True:
                t += float(rng.exponential(1.0 / bound_per_s))
                if t >= horizon_s or rng.random() * bound_per_s <= hazard_per_s(t):
                    break
            if t >= horizon_s:
                wins.append([start, np.inf, 0.0, 0.0])
                break
            notice = _notice(k, rng)
            wins.append([start, t, notice, 1.0 if notice == 0 else 0.0])
            t += notice + away()
        out.append(wins)
    return out


def _with(base: Trace, windows: Windows, name: str, k: FamilyBase, seed: int,
          hazard: dict[str, np.ndarray] | None = None, jobs: dict[str, np.ndarray] | None = None,
          nodes: dict[str, np.ndarray] | None = None, extra: dict[str, Any] | None = None) -> Trace:
    tables = dict(base.tables)
    if nodes is not None:
        tables["nodes"] = nodes
    for wins in windows:  # a node never lent: reclaimed at t = 0, back after the end
        if not wins:
            wins.append([base.horizon_s + 1.0, np.inf, 0.0, 0.0])
    tables["reclaims"] = _reclaim_rows(windows, tables["nodes"]["id"])
    if hazard is None:
        tables.pop("hazard", None)
    else:
        tables["hazard"] = hazard
    if jobs is not None:
        tables["jobs"] = jobs
    meta = {"family": name, "seed": seed, "knobs": asdict(k), "source": SOURCE[name], **(extra or {})}
    tr = replace(base, tables=tables, meta=meta)
    validate(tr)
    return tr


def _spot_1gpu(k: SpotOneGpu, seed: int) -> Trace:
    base = _base(k, seed, gpu_choices=np.array([1.0]))
    nd = dict(base.tables["nodes"])
    n = len(nd["id"])
    nd["gpus"], nd["vram_gb"], nd["capability"] = np.ones(n), np.full(n, 16.0), np.full(n, 7.0)  # V100 16 GB
    jobs = dict(base.tables["jobs"])
    jobs["vram_gb"] = np.minimum(jobs["vram_gb"], 16.0)
    jobs["min_capability"] = np.full(len(jobs["id"]), 7.0)
    rng = np.random.default_rng([seed, 101])
    horizon = k.days * DAY_S
    windows: Windows = []
    for _ in range(n):
        wins: list[list[float]] = []
        t = 0.0 if rng.random() < 0.6 else _lognormal_s(rng, k.away_median_h, k.away_sigma)
        while t < horizon:
            end = t + _lognormal_s(rng, k.lent_median_h, k.lent_sigma)
            if end >= horizon:
                wins.append([t, np.inf, 0.0, 0.0])
                break
            notice = _notice(k, rng)
            wins.append([t, end, notice, 1.0 if notice == 0 else 0.0])
            t = end + notice + _lognormal_s(rng, k.away_median_h, k.away_sigma)
        windows.append(wins)
    return _with(base, windows, "spot-1gpu", k, seed, jobs=jobs, nodes=nd)


def _scaled_hist(hist: dict[int, int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Jump sizes of a 16-node pool scaled to an n-node pool (≥ 1), with their probabilities."""
    sizes = np.array([max(1, round(s * n / 16.0)) for s in hist])
    p = np.array(list(hist.values()), dtype=float)
    return sizes, p / p.sum()


def _small_pool(k: SmallPool, seed: int) -> Trace:
    base = _base(k, seed)
    n = len(base.tables["nodes"]["id"])
    rng = np.random.default_rng([seed, 102])
    horizon = k.days * DAY_S
    drops, p_drop = _scaled_hist(POOL16_DROPS, n)
    rises, p_rise = _scaled_hist(POOL16_RISES, n)
    lent = np.zeros(n, dtype=bool)
    lent[: int(rng.integers(0, n + 1))] = True
    windows: Windows = [[[0.0, np.inf, 0.0, 0.0]] if lent[i] else [] for i in range(n)]
    t = 0.0
    while True:
        t += float(rng.exponential(k.hold_h * HOUR_S))
        if t >= horizon:
            break
        drop = lent.any() and (not (~lent).any() or rng.random() < k.drop_prob)
        if drop:  # the highest lent slots leave at the same second (a pool-wide drop)
            size = min(int(rng.choice(drops, p=p_drop)), int(lent.sum()))
            notice = _notice(k, rng)
            for s in np.flatnonzero(lent)[::-1][:size]:
                w = windows[s][-1]
                w[1], w[2], w[3] = max(t - notice, w[0] + 1.0), t - max(t - notice, w[0] + 1.0), float(notice == 0)
                lent[s] = False
        else:
            size = min(int(rng.choice(rises, p=p_rise)), int((~lent).sum()))
            for s in np.flatnonzero(~lent)[:size]:
                prev_end = windows[s][-1][1] + windows[s][-1][2] if windows[s] else 0.0
                windows[s].append([max(t, prev_end + 60.0), np.inf, 0.0, 0.0])
                lent[s] = True
    return _with(base, windows, "small-pool", k, seed)


def _pod_jobs(k: PodList, base: Trace, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Jobs of a pod list: batches at Poisson times over the first 85% of the trace, Alibaba GPU counts
    (8 → 4), lognormal durations, total GPU-hours at k.load of the campus; the rest as the base campus's jobs."""
    j = base.tables["jobs"]
    n = len(j["id"])
    horizon = k.days * DAY_S
    n_batches = max(1, round(n / k.batch_mean))
    starts = np.sort(rng.uniform(0.0, 0.85 * horizon, n_batches))
    submit = np.sort(np.resize(np.repeat(starts, rng.geometric(1.0 / k.batch_mean, n_batches)), n)
                     + rng.uniform(0.0, 60.0, n))
    sizes = np.array(list(ALIBABA_GPU_HIST), dtype=float)
    p = np.array(list(ALIBABA_GPU_HIST.values()), dtype=float)
    gpus = np.minimum(rng.choice(sizes, size=n, p=p / p.sum()), 4.0)
    work = rng.lognormal(np.log(k.duration_median_h * HOUR_S), k.duration_sigma, n)
    target_gpu_s = float(np.sum(j["gpus"] * j["work_s"]))
    work = np.clip(work * target_gpu_s / float(np.sum(work * gpus)), 60.0, 0.5 * horizon)
    return {**j, "submit_s": submit, "gpus": gpus, "work_s": work,
            "vram_gb": np.where(gpus >= 4, 40.0, j["vram_gb"])}


def _pod_list(k: PodList, seed: int) -> Trace:
    base = _base(k, seed)
    rng = np.random.default_rng([seed, 103])
    n = len(base.tables["nodes"]["id"])
    lam = 1.0 / (k.lent_mean_h * HOUR_S)
    windows = _thinned_windows(n, k.days * DAY_S, lambda t: lam, lam, lambda: float(rng.exponential(k.away_mean_h * HOUR_S)) + 300.0, k, rng)
    return _with(base, windows, "pod-list", k, seed, jobs=_pod_jobs(k, base, rng))


def diurnal_profile(t_s: np.ndarray | float, k: DiurnalLab) -> np.ndarray:
    """Relative hazard: 1 off-peak, k.peak_ratio in the peak windows of weekdays (days 5 and 6 of each week
    are the weekend, where everything is x k.weekend_factor)."""
    t = np.asarray(t_s, dtype=float)
    h = (t / HOUR_S) % 24.0
    peak = np.zeros_like(h, dtype=bool)
    for lo, hi in k.peaks:
        peak |= (h >= lo) & (h < hi)
    weekend = ((t // DAY_S) % 7) >= 5
    return np.where(peak, k.peak_ratio, 1.0) * np.where(weekend, k.weekend_factor, 1.0)


def _diurnal_lab(k: DiurnalLab, seed: int) -> Trace:
    base = _base(k, seed)
    rng = np.random.default_rng([seed, 104])
    n = len(base.tables["nodes"]["id"])
    lam0 = k.base_per_h / HOUR_S
    windows = _thinned_windows(n, k.days * DAY_S, lambda t: lam0 * float(diurnal_profile(t, k)),
                               lam0 * k.peak_ratio, lambda: _lognormal_s(rng, k.away_median_h, k.away_sigma), k, rng)
    ht = np.arange(0.0, k.days * DAY_S, 300.0)
    hz = {"t_s": ht, "per_s": lam0 * diurnal_profile(ht, k) * k.emergency_share}
    return _with(base, windows, "diurnal-lab", k, seed, hazard=hz)


def _correlated(k: Correlated, seed: int) -> Trace:
    base = _base(k, seed)
    rng = np.random.default_rng([seed, 105])
    nd = base.tables["nodes"]
    horizon = k.days * DAY_S
    bg = k.background_per_h / HOUR_S
    events: list[tuple[str, float, float, float]] = []  # (provider, t_s, notice_s, back_s)
    for prov in sorted(set(nd["building"])):
        t = 0.0
        while True:
            t += float(rng.exponential(HOUR_S / k.event_per_h))
            if t >= horizon:
                break
            notice = _notice(k, rng)
            events.append((str(prov), t, notice, t + notice + _lognormal_s(rng, k.outage_median_h, k.outage_sigma)))
    windows: Windows = []
    for prov in nd["building"]:  # per node: background departures, and every provider event while lent
        mine = [e for e in events if e[0] == prov]
        wins: list[list[float]] = []
        t = 0.0
        while t < horizon:
            tb = t + float(rng.exponential(1.0 / bg)) if bg > 0 else np.inf
            ev = next((e for e in mine if e[1] > t), None)
            if ev is not None and ev[1] <= tb:
                wins.append([t, ev[1], ev[2], float(ev[2] == 0)])
                t = ev[3]
            elif tb < horizon:
                notice = _notice(k, rng)
                wins.append([t, tb, notice, float(notice == 0)])
                t = tb + notice + _lognormal_s(rng, k.away_median_h, 0.8)
            else:
                wins.append([t, np.inf, 0.0, 0.0])
                break
        windows.append(wins)
    return _with(base, windows, "correlated", k, seed, extra={"events": events})


def drift_hazard_per_s(t_s: np.ndarray | float, k: Drift) -> np.ndarray:
    """The drift family's departure hazard per lent node at t (before the emergency share)."""
    t = np.asarray(t_s, dtype=float)
    t0 = k.change_frac * k.days * DAY_S
    lam0 = k.base_per_h / HOUR_S
    if k.mode == "ramp":
        x = np.clip((t - t0) / max(k.days * DAY_S - t0, 1.0), 0.0, 1.0)
        return lam0 * (1.0 + (k.factor - 1.0) * x)
    return lam0 * np.where(t >= t0, k.factor, 1.0)


def _drift(k: Drift, seed: int) -> Trace:
    if k.mode not in ("step", "ramp"):
        raise ValueError(f"drift mode must be 'step' or 'ramp', got {k.mode!r}")
    base = _base(k, seed)
    rng = np.random.default_rng([seed, 106])
    n = len(base.tables["nodes"]["id"])
    bound = k.base_per_h / HOUR_S * max(k.factor, 1.0)
    windows = _thinned_windows(n, k.days * DAY_S, lambda t: float(drift_hazard_per_s(t, k)), bound,
                               lambda: _lognormal_s(rng, k.away_median_h, k.away_sigma), k, rng)
    ht = np.arange(0.0, k.days * DAY_S, 300.0)
    hz = {"t_s": ht, "per_s": drift_hazard_per_s(ht, k) * k.emergency_share}
    return _with(base, windows, "drift", k, seed, hazard=hz)


_BUILDERS = {"spot-1gpu": _spot_1gpu, "small-pool": _small_pool, "pod-list": _pod_list,
             "diurnal-lab": _diurnal_lab, "correlated": _correlated, "drift": _drift}


def build(name: str, seed: int, **overrides: Any) -> Trace:
    """One deterministic trace of family `name` for `seed` (design §21.5), knobs overridden by `overrides`."""
    k = knobs(name, **overrides)
    return _BUILDERS[name](k, seed)  # type: ignore[operator]


def departures_per_lent_h(tr: Trace, t0_s: float, t1_s: float) -> float:
    """Departures (t_s > 0) per lent node-hour in [t0_s, t1_s): the empirical hazard a test checks."""
    r = tr.tables["reclaims"]
    ids = list(tr.tables["nodes"]["id"])
    away = np.zeros(len(ids))
    count = 0
    for node, t, notice, ret in zip(r["node"], r["t_s"], r["notice_s"], r["return_s"], strict=True):
        lo = t + notice
        hi = tr.horizon_s if np.isnan(ret) else ret
        away[ids.index(node)] += max(0.0, min(hi, t1_s) - max(lo, t0_s))
        if t > 0 and t0_s <= t + notice < t1_s:
            count += 1
    lent_h = (len(ids) * (t1_s - t0_s) - float(away.sum())) / HOUR_S
    return count / lent_h if lent_h > 0 else 0.0
