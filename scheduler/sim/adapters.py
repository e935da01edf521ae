"""Adapters from public external traces to the campus model (design §7 "External traces").

The traces live outside the project, in the folder ``RECLAIMNET_TRACES_DIR`` names (default: a ``shared/traces``
folder beside the checkout); evaluation sections whose trace is missing are skipped.

None of these traces is a campus log, so each is mapped explicitly (the evaluation report repeats this):
- bamboo ``t_ms,add|remove,nodeN`` (AWS spot pools): every instance occupies a campus node slot while it
  exists; ``remove`` = a reclaim of that slot, ``add`` = a slot lent again (``return_s``). The spot market
  gives a 30 s-2 min notice or none: each removal is an emergency with probability 1/2, else its notice is
  uniform in [30, 120] s (seeded). Slots = the most instances alive at once; the GPU mix, links,
  bandwidth, research traffic and jobs come from the generator (scaled to the trace length).
- skypilot availability ``{"metadata": {"gap_seconds"}, "data": [count]}``: the count of available spot
  instances is the number of lent nodes of a pool of max(count) nodes (drops = reclaims of the highest
  lent slots, rises = returns). The first 30 days of the one-node, 45-day file are replicated over 12
  nodes with independent random circular time shifts (a lending pattern per node). Notice as for bamboo.
- alibaba ``openb_pod_list_multigpu50.csv``: the GPU counts of real tasks give the job mix (tasks with 0
  GPUs dropped; 8-GPU tasks capped at 4, the largest campus node, since a gang job is never split). This
  copy has no creation/deletion times, so durations stay the generator's lognormal.
The 1-node preemption probe file is not used: its 0/1 polarity cannot be checked against a known outage.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from scheduler.sim.trace import Trace, TraceError, load, validate
from scheduler.sim.tracegen import DAY_S, GenConfig, generate

SHARED = Path(os.environ.get("RECLAIMNET_TRACES_DIR")
              or Path(__file__).resolve().parents[3] / "shared" / "traces")
EXTERNAL = {
    "bamboo-p3": "bamboo/p3-trace.csv",
    "bamboo-g4dn": "bamboo/g4dn-trace.csv",
    "spot-16node": "spot-traces/availability-16node-aws-08-27-2023-us-west-2a_v100_1.json",
    "spot-1node-x12": "spot-traces/availability-1node-aws-02-15-2023-us-east-1a_v100_1.json",
    "alibaba-mix": "alibaba-gpu-2023/openb_pod_list_multigpu50.csv",
}


def _notice(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.where(rng.random(n) < 0.5, 0.0, rng.uniform(30.0, 120.0, n))


def _campus(n_nodes: int, horizon_s: float, seed: int, gpu_choices: np.ndarray | None = None) -> Trace:
    """A generated campus of about `n_nodes` nodes over `horizon_s` (jobs sized to ~half the capacity)."""
    days = horizon_s / DAY_S
    scale = n_nodes / 54.0
    total_gpu_h = max(1.0, 88 * scale * horizon_s / 3600.0 * 0.25)  # a quarter of the GPU-time
    cfg = GenConfig(days=days, seed=seed, node_scale=scale, n_jobs=max(24, round(total_gpu_h / 12.0)),
                    total_gpu_h=total_gpu_h, departures=0, drift_start_day=days * 0.55, drift_days=days * 0.12)
    return generate(cfg, gpu_choices=gpu_choices)


def _with_reclaims(base: Trace, slot_rows: list[tuple[int, float, float, float]], name: str) -> Trace:
    """Replace the generated reclaims by (slot, t_s, notice_s, return_s) rows; slot i = i-th node."""
    ids = base.tables["nodes"]["id"]
    rows = sorted(slot_rows, key=lambda r: r[1])
    rec = {"node": np.array([ids[r[0] % len(ids)] for r in rows], dtype=object),
           "t_s": np.array([r[1] for r in rows], dtype=float),
           "notice_s": np.array([r[2] for r in rows], dtype=float),
           "return_s": np.array([r[3] for r in rows], dtype=float)}
    tables = dict(base.tables)
    tables["reclaims"] = rec
    tables.pop("hazard", None)
    tr = replace(base, tables=tables, meta={"source": name})
    validate(tr)
    return tr


def _slots_from_presence(events: list[tuple[float, int]], n_slots: int, horizon_s: float,
                         rng: np.random.Generator) -> list[tuple[int, float, float, float]]:
    """events: (t_s, +1 add / -1 remove) pool changes → per-slot reclaim rows (slots start not lent)."""
    lent = np.zeros(n_slots, dtype=bool)
    open_row: dict[int, list[float]] = {}
    rows: list[list[float]] = []
    for s in range(n_slots):  # not lent at t = 0: a t = 0 scheduled reclaim returning at the first add
        open_row[s] = [s, 0.0, 10.0, np.nan]
        rows.append(open_row[s])
    notices = _notice(rng, len(events))
    for k, (t, d) in enumerate(events):
        if d > 0:
            free = np.flatnonzero(~lent)
            if free.size == 0:
                continue
            s = int(free[0])
            lent[s] = True
            r = open_row.pop(s)
            r[3] = max(t, r[1] + r[2])
        else:
            busy = np.flatnonzero(lent)
            if busy.size == 0:
                continue
            s = int(busy[-1])
            lent[s] = False
            t0 = max(t - notices[k], 0.0)  # the notice precedes the removal
            open_row[s] = [s, t0, t - t0, np.nan]
            rows.append(open_row[s])
    return [(int(r[0]), r[1], r[2], r[3]) for r in rows]


def bamboo(path: Path, seed: int = 0) -> Trace:
    """AWS spot add/remove events (bamboo) → campus reclaims (see module docstring)."""
    events: list[tuple[float, int]] = []
    with path.open(newline="") as fh:
        for i, row in enumerate(csv.reader(fh)):
            if len(row) != 3 or row[1] not in ("add", "remove"):
                raise TraceError("bamboo", f"row {i}: expected t_ms,add|remove,nodeN")
            try:
                events.append((float(row[0]) / 1000.0, 1 if row[1] == "add" else -1))
            except ValueError:
                raise TraceError("bamboo.t_ms", f"row {i}: not a number") from None
    alive, peak = 0, 0
    for _, d in events:
        alive = max(0, alive + d)
        peak = max(peak, alive)
    horizon = max(t for t, _ in events) + 3600.0
    base = _campus(max(peak, 2), horizon, seed)
    n = len(base.tables["nodes"]["id"])
    rows = _slots_from_presence(events, n, horizon, np.random.default_rng([seed, 7]))
    return _with_reclaims(base, rows, f"bamboo:{path.name}")


def skypilot(path: Path, seed: int = 0, replicate: int = 12) -> Trace:
    """Spot availability counts (skypilot) → lending pattern (see module docstring)."""
    try:
        obj = json.loads(path.read_text())
        gap = float(obj["metadata"]["gap_seconds"])
        data = np.asarray(obj["data"], dtype=float)
    except (KeyError, TypeError, ValueError, json.JSONDecodeError):
        raise TraceError("availability", "expected {metadata: {gap_seconds}, data: [counts]}") from None
    horizon = gap * len(data)
    rng = np.random.default_rng([seed, 8])
    if data.max() <= 1:  # one instance: replicate with random circular shifts, one pattern per node
        data = data[: int(30 * DAY_S / gap)]  # the first 30 of 45 days (keeps `make evaluate` short)
        horizon = gap * len(data)
        base = _campus(replicate, horizon, seed)
        n = len(base.tables["nodes"]["id"])
        rows: list[tuple[int, float, float, float]] = []
        for s in range(n):
            shifted = np.roll(data, int(rng.integers(len(data))))
            ev = [(k * gap, int(shifted[k] - shifted[k - 1])) for k in range(1, len(data))
                  if shifted[k] != shifted[k - 1]]
            if shifted[0] > 0:
                ev.insert(0, (0.0, 1))
            for r in _slots_from_presence(ev, 1, horizon, rng):
                rows.append((s, r[1], r[2], r[3]))
        return _with_reclaims(base, rows, f"skypilot:{path.name}")
    peak = int(data.max())
    base = _campus(peak, horizon, seed)
    n = len(base.tables["nodes"]["id"])
    events: list[tuple[float, int]] = []
    prev = 0
    for k, c in enumerate(data.astype(int)):
        d = c - prev
        events += [(k * gap, 1 if d > 0 else -1)] * abs(d)
        prev = c
    rows = _slots_from_presence(events, n, horizon, rng)
    return _with_reclaims(base, rows, f"skypilot:{path.name}")


def alibaba(path: Path, seed: int = 0) -> Trace:
    """Generated two-month campus with the GPU-count mix of real Alibaba GPU tasks."""
    gpus: list[float] = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                g = float(row["num_gpu"])
            except (KeyError, ValueError):
                raise TraceError("alibaba.num_gpu", "missing or not a number") from None
            if g > 0:
                gpus.append(min(g, 4.0))
    if not gpus:
        raise TraceError("alibaba.num_gpu", "no GPU tasks")
    tr = generate(GenConfig(seed=seed), gpu_choices=np.array(gpus))
    return replace(tr, meta={"source": f"alibaba:{path.name}"})


def load_external(name: str, seed: int = 0, root: Path | None = None) -> Trace:
    """One of EXTERNAL by name."""
    if name not in EXTERNAL:
        raise TraceError("trace", f"unknown external trace {name!r}; one of {', '.join(EXTERNAL)}")
    return load_any(str((root or SHARED) / EXTERNAL[name]), seed)


def load_any(spec: str, seed: int = 0) -> Trace:
    """design §7 JSON/CSV folder, ``ext:NAME``, or a raw bamboo CSV / skypilot JSON / alibaba pod CSV."""
    if spec.startswith("ext:"):
        return load_external(spec[4:], seed)
    p = Path(spec)
    if p.is_file() and p.suffix == ".csv":
        with p.open() as fh:
            head = fh.readline()
        if head.startswith("name,") and "num_gpu" in head:
            return alibaba(p, seed)
        return bamboo(p, seed)
    if p.is_file() and p.suffix == ".json":
        with p.open() as fh:
            start = fh.read(200)
        if '"metadata"' in start and '"gap_seconds"' in start:
            return skypilot(p, seed)
    return load(p)
