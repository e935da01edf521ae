"""Campus trace format (design §7): load/validate/save as one JSON file or a folder of CSV files.

A trace is a frozen dataclass of numpy column arrays per table. Validation is a separate step that raises
`TraceError` naming the offending field (``table.column``), so the CLI can exit 2 with ``{"error": ...}``.
Two optional keys beyond design §7 are understood: ``horizon_s`` (simulation end) and ``hazard`` (rows
``t_s, per_s``: the generator's true per-node emergency hazard, used only to score the estimator).
The fair queue (design §16.5) adds an optional ``groups`` table (``id, share``, optional quotas ``max_gpus``,
``max_gpu_h_30d``) and an optional ``group`` per job; a trace without them is one group, ``default``.
Gangs and elastic ranges (design §3 "Gangs", "Elastic") add two optional job columns: ``members`` (nodes the job
spans, ``gpus`` on each; missing = 1) and ``min_members`` (an elastic job's smallest size; missing = ``members``,
a rigid job). `scheduler.sim.gangs` simulates them; `scheduler.sim.engine` refuses a trace that has them.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

TABLES: dict[str, tuple[str, ...]] = {
    "nodes": ("id", "building", "gpus", "vram_gb", "capability"),
    "links": ("id", "a", "b", "bytes_per_s"),
    "jobs": ("id", "submit_s", "gpus", "vram_gb", "min_capability", "work_s", "ckpt_bytes", "restart_s",
             "loss_budget_s"),
    "reclaims": ("node", "t_s", "notice_s", "return_s"),
    "bandwidth": ("link", "t_s", "bytes_per_s"),
    "research": ("link", "t_s", "bytes_per_s"),
    "hazard": ("t_s", "per_s"),
    "groups": ("id", "share", "max_gpus", "max_gpu_h_30d"),
}
TABLES["jobs"] = (*TABLES["jobs"], "group", "members", "min_members")
DEFAULT_GROUP = "default"
STR_COLS = {("nodes", "id"), ("nodes", "building"), ("links", "id"), ("links", "a"), ("links", "b"),
            ("jobs", "id"), ("reclaims", "node"), ("bandwidth", "link"), ("research", "link")}
STR_COLS |= {("jobs", "group"), ("groups", "id")}
OPTIONAL_COLS = {("reclaims", "return_s")}
OPTIONAL_COLS |= {("jobs", "group"), ("groups", "max_gpus"), ("groups", "max_gpu_h_30d")}
OPTIONAL_COLS |= {("jobs", "members"), ("jobs", "min_members")}
STR_DEFAULTS = {("jobs", "group"): DEFAULT_GROUP}  # optional string columns: the value of a missing cell
OPTIONAL_TABLES = {"hazard", "research", "groups"}
REQUIRED_TABLES = ("nodes", "links", "jobs", "reclaims", "bandwidth")


class TraceError(ValueError):
    """Invalid trace input; ``field`` names the offending table/column (design §5/§7 error contract)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message

    def __reduce__(self) -> tuple:  # picklable, so a worker process can report it
        return (type(self), (self.field, self.message))


@dataclass(frozen=True)
class Trace:
    """Column arrays per table (strings as object arrays, numbers as float64)."""

    tables: dict[str, dict[str, np.ndarray]]
    horizon_s: float
    meta: dict[str, Any] = field(default_factory=dict)

    def col(self, table: str, name: str) -> np.ndarray:
        return self.tables[table][name]

    def n(self, table: str) -> int:
        t = self.tables.get(table)
        return 0 if not t else len(next(iter(t.values())))


def _column(table: str, name: str, values: list[Any]) -> np.ndarray:
    """Convert one column, raising TraceError naming it on a bad value."""
    if (table, name) in STR_DEFAULTS:
        values = [STR_DEFAULTS[table, name] if v is None or v == "" else v for v in values]
    if (table, name) in STR_COLS:
        out = np.array([str(v) for v in values], dtype=object)
        if any(v in ("", "None") for v in out):
            raise TraceError(f"{table}.{name}", "empty value")
        return out
    if not any(isinstance(v, (bool, str)) or v is None for v in values):
        try:  # fast path for clean numeric columns
            arr = np.asarray(values, dtype=float)
            if arr.ndim == 1 and np.all(np.isfinite(arr)):
                return arr
        except (TypeError, ValueError):
            pass
    arr = np.empty(len(values))
    for i, v in enumerate(values):
        if v is None or v == "":
            if (table, name) in OPTIONAL_COLS:
                arr[i] = np.nan
                continue
            raise TraceError(f"{table}.{name}", f"missing value in row {i}")
        if isinstance(v, bool):
            raise TraceError(f"{table}.{name}", f"not a number in row {i}")
        try:
            arr[i] = float(v)
        except (TypeError, ValueError):
            raise TraceError(f"{table}.{name}", f"not a number in row {i}: {v!r}") from None
        if not math.isfinite(arr[i]):
            raise TraceError(f"{table}.{name}", f"not finite in row {i}")
    return arr


def from_rows(rows: dict[str, list[dict[str, Any]]], horizon_s: float | None = None) -> Trace:
    """Build and validate a trace from row dicts (the JSON shape of design §7)."""
    if not isinstance(rows, dict):
        raise TraceError("trace", "expected an object with nodes, links, jobs, reclaims, bandwidth")
    tables: dict[str, dict[str, np.ndarray]] = {}
    for table, cols in TABLES.items():
        if table not in rows:
            if table in REQUIRED_TABLES:
                raise TraceError(table, "missing table")
            continue
        data = rows[table]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise TraceError(table, "expected a list of objects")
        tables[table] = {}
        for c in cols:
            if (table, c) not in OPTIONAL_COLS and data and any(c not in r for r in data):
                raise TraceError(f"{table}.{c}", "missing column")
            tables[table][c] = _column(table, c, [r.get(c) for r in data])
    hz = horizon_s if horizon_s is not None else rows.get("horizon_s")
    trace = Trace(tables=tables, horizon_s=_horizon(tables, hz))
    validate(trace)
    return trace


def _horizon(tables: dict[str, dict[str, np.ndarray]], hz: Any) -> float:
    if hz is not None:
        try:
            val = float(hz)
        except (TypeError, ValueError):
            raise TraceError("horizon_s", "not a number") from None
        if not val > 0:
            raise TraceError("horizon_s", "must be > 0")
        return val
    ends = [0.0]
    for t, c in (("bandwidth", "t_s"), ("research", "t_s"), ("jobs", "submit_s"), ("reclaims", "t_s")):
        if t in tables and len(tables[t][c]):
            ends.append(float(np.max(tables[t][c])))
    return max(ends) + 86400.0


def validate(tr: Trace) -> None:
    """Check design §7 semantics: ids unique, references resolve, values in range. Raises TraceError."""
    nodes = tr.col("nodes", "id")
    if len(nodes) == 0:
        raise TraceError("nodes", "no nodes")
    if len(set(nodes)) != len(nodes):
        raise TraceError("nodes.id", "duplicate id")
    node_set = set(nodes)
    for c in ("gpus",):
        v = tr.col("nodes", c)
        if np.any(v < 1) or np.any(v != np.round(v)):
            raise TraceError(f"nodes.{c}", "must be a positive integer")
    if np.any(tr.col("nodes", "vram_gb") < 0):
        raise TraceError("nodes.vram_gb", "must be >= 0")
    links = tr.col("links", "id")
    if len(set(links)) != len(links):
        raise TraceError("links.id", "duplicate id")
    if np.any(tr.col("links", "bytes_per_s") <= 0):
        raise TraceError("links.bytes_per_s", "must be > 0")
    link_set = set(links)
    j = tr.tables["jobs"]
    if len(set(j["id"])) != len(j["id"]):
        raise TraceError("jobs.id", "duplicate id")
    checks = [("submit_s", 0.0, False), ("work_s", 0.0, True), ("ckpt_bytes", 0.0, True),
              ("restart_s", 0.0, False), ("loss_budget_s", 0.0, True), ("vram_gb", 0.0, False),
              ("min_capability", 0.0, False)]
    for c, lo, strict in checks:
        v = j[c]
        if np.any(v <= lo) if strict else np.any(v < lo):
            raise TraceError(f"jobs.{c}", f"must be {'>' if strict else '>='} {lo:g}")
    if np.any(j["gpus"] < 1) or np.any(j["gpus"] != np.round(j["gpus"])):
        raise TraceError("jobs.gpus", "must be a positive integer")
    _validate_gangs(j)
    _validate_groups(tr)
    r = tr.tables["reclaims"]
    if any(n not in node_set for n in r["node"]):
        raise TraceError("reclaims.node", "unknown node")
    if np.any(r["t_s"] < 0):
        raise TraceError("reclaims.t_s", "must be >= 0")
    if np.any(r["notice_s"] < 0):
        raise TraceError("reclaims.notice_s", "must be >= 0")
    ret = r["return_s"]
    bad = ~np.isnan(ret) & (ret < r["t_s"] + r["notice_s"])
    if np.any(bad):
        raise TraceError("reclaims.return_s", "must be >= t_s + notice_s")
    for t in ("bandwidth", "research"):
        if t not in tr.tables:
            continue
        if any(x not in link_set for x in tr.col(t, "link")):
            raise TraceError(f"{t}.link", "unknown link")
        if np.any(tr.col(t, "bytes_per_s") < 0):
            raise TraceError(f"{t}.bytes_per_s", "must be >= 0")
        if np.any(tr.col(t, "t_s") < 0):
            raise TraceError(f"{t}.t_s", "must be >= 0")


def _validate_gangs(jobs: dict[str, np.ndarray]) -> None:
    """design §3 "Gangs", "Elastic": members a positive integer, 1 <= min_members <= members (missing: 1, members)."""
    members = jobs.get("members")
    if members is None:
        return
    members = np.where(np.isnan(members), 1.0, members)
    if np.any(members < 1) or np.any(members != np.round(members)):
        raise TraceError("jobs.members", "must be a positive integer")
    low = jobs.get("min_members")
    if low is None:
        return
    low = np.where(np.isnan(low), members, low)
    if np.any(low != np.round(low)) or np.any(low < 1):
        raise TraceError("jobs.min_members", "must be a positive integer")
    if np.any(low > members):
        raise TraceError("jobs.min_members", "must be <= members")


def gang_columns(tr: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Per job, (members, min_members) as integers: 1 and ``members`` where the trace leaves them out."""
    jobs = tr.tables["jobs"]
    n = len(jobs["id"])
    members = jobs.get("members")
    members = np.ones(n) if members is None else np.where(np.isnan(members), 1.0, members)
    low = jobs.get("min_members")
    low = members.copy() if low is None else np.where(np.isnan(low), members, low)
    return members.astype(np.int64), low.astype(np.int64)


def _validate_groups(tr: Trace) -> None:
    """design §16.5: group ids unique, shares ≥ 0, quotas ≥ 0 (missing = none), every job's group listed."""
    g = tr.tables.get("groups")
    if g is None:
        return
    if len(set(g["id"])) != len(g["id"]):
        raise TraceError("groups.id", "duplicate id")
    if np.any(g["share"] < 0):
        raise TraceError("groups.share", "must be >= 0")
    for c in ("max_gpus", "max_gpu_h_30d"):
        if np.any(g[c][~np.isnan(g[c])] < 0):
            raise TraceError(f"groups.{c}", "must be >= 0")
    job_groups = tr.tables["jobs"].get("group")
    if job_groups is not None and not set(job_groups) <= set(g["id"]):
        raise TraceError("jobs.group", "unknown group")


def _rows(tr: Trace, table: str) -> list[dict[str, Any]]:
    cols = tr.tables[table]
    names = list(cols)
    out = []
    for i in range(tr.n(table)):
        row: dict[str, Any] = {}
        for c in names:
            v = cols[c][i]
            if isinstance(v, str):
                row[c] = v
            elif np.isnan(v):
                continue
            else:
                fv = float(v)
                row[c] = int(fv) if fv.is_integer() and abs(fv) < 2**53 else fv
        out.append(row)
    return out


def to_json_obj(tr: Trace) -> dict[str, Any]:
    obj: dict[str, Any] = {t: _rows(tr, t) for t in TABLES if t in tr.tables}
    obj["horizon_s"] = tr.horizon_s
    return obj


def save(tr: Trace, path: str | Path) -> None:
    """Write JSON (path ends in .json) or a CSV folder (design §7), plus horizon in meta.csv."""
    p = Path(path)
    if p.suffix == ".json":
        p.write_text(json.dumps(to_json_obj(tr), separators=(",", ":")))
        return
    p.mkdir(parents=True, exist_ok=True)
    for t, cols in TABLES.items():
        if t not in tr.tables:
            continue
        with (p / f"{t}.csv").open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(cols))
            w.writeheader()
            w.writerows(_rows(tr, t))
    (p / "meta.csv").write_text(f"key,value\nhorizon_s,{tr.horizon_s!r}\n")


def load(path: str | Path) -> Trace:
    """Read a design §7 trace from a JSON file or a CSV folder. Raises TraceError on bad input."""
    p = Path(path)
    if not p.exists():
        raise TraceError("trace", f"no such file or folder: {p}")
    if p.is_dir():
        rows: dict[str, Any] = {}
        for t in TABLES:
            f = p / f"{t}.csv"
            if f.exists():
                with f.open(newline="") as fh:
                    rows[t] = [{k: v for k, v in r.items() if v != "" or k not in ("return_s",)}
                               for r in csv.DictReader(fh)]
        hz = None
        if (p / "meta.csv").exists():
            with (p / "meta.csv").open(newline="") as fh:
                for r in csv.DictReader(fh):
                    if r.get("key") == "horizon_s":
                        hz = r.get("value")
        return from_rows(rows, hz)
    try:
        obj = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise TraceError("trace", f"invalid JSON: {e.msg}") from None
    return from_rows(obj)
