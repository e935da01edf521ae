"""The JSON decision contract (design §5): validate a request, then decide.

Validation is a separate first step that turns untrusted JSON into the library's frozen dataclasses and
raises `ContractError` naming the offending field (e.g. `jobs[2].hazard_per_s`); deciding never raises
for an infeasible instance — infeasibility is reported in the response (degraded flows, a null
destination, `loss_budget_at_risk`). The same `decide` serves the CLI and the portal's what-if API.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from scheduler.p1 import LOSS_BUDGET_MODES, MIN_INTERVAL_S, P1Jobs, plan_checkpoints
from scheduler.p2 import P2Request, response_view, select_destination
from scheduler.p3 import P3Flows, admit_flows
from scheduler.topology import CampusTree

__all__ = ["KINDS", "ContractError", "decide", "validate"]


class ContractError(ValueError):
    """An invalid request; `field` is the JSON path of the offending field ('' for the whole request)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


_MISSING = object()
# Plausible-magnitude limits: far beyond any campus (1 PB, 8 Pbit/s, 30 million years), close enough that
# no intermediate of P1/P2/P3 can overflow or underflow to a non-finite answer.
MAX_MAGNITUDE = 1e15
MIN_POSITIVE = 1e-12


def _obj(x: Any, field: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise ContractError(field, "must be a JSON object")
    return x


def _list(d: dict[str, Any], key: str, prefix: str) -> list[Any]:
    field = f"{prefix}{key}"
    if key not in d:
        raise ContractError(field, "is required")
    x = d[key]
    if not isinstance(x, list):
        raise ContractError(field, "must be a JSON array")
    return x


def _finite(x: float) -> bool:
    try:
        return math.isfinite(float(x))
    except OverflowError:  # a JSON integer too large for a float
        return False


def _num(
    d: dict[str, Any],
    key: str,
    prefix: str = "",
    *,
    default: Any = _MISSING,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    nullable: bool = False,
    integer: bool = False,
) -> float | None:
    """A finite number (never a bool) with optional bounds; `default` makes the key optional."""
    field = f"{prefix}{key}"
    if key not in d:
        if default is _MISSING:
            raise ContractError(field, "is required")
        return default
    x = d[key]
    if x is None:
        if nullable:
            return None
        raise ContractError(field, "must be a number, not null")
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise ContractError(field, f"must be a number, got {type(x).__name__}")
    if not _finite(x):
        raise ContractError(field, "must be a finite number (no NaN or infinity)")
    if abs(x) > MAX_MAGNITUDE:
        raise ContractError(field, f"must be at most {MAX_MAGNITUDE:g} in magnitude, got {x!r}")
    if gt == 0 and 0 < x < MIN_POSITIVE:
        raise ContractError(field, f"must be >= {MIN_POSITIVE:g} (too small to compute with), got {x!r}")
    if integer and float(x) != int(x):
        raise ContractError(field, "must be an integer")
    if gt is not None and not x > gt:
        raise ContractError(field, f"must be > {gt:g}, got {x!r}")
    if ge is not None and not x >= ge:
        raise ContractError(field, f"must be >= {ge:g}, got {x!r}")
    if le is not None and not x <= le:
        raise ContractError(field, f"must be <= {le:g}, got {x!r}")
    return float(x)


def _ident(d: dict[str, Any], key: str, prefix: str, *, strings_only: bool = False) -> Any:
    field = f"{prefix}{key}"
    if key not in d:
        raise ContractError(field, "is required")
    x = d[key]
    ok = (isinstance(x, str) and x != "") or (not strings_only and isinstance(x, int) and not isinstance(x, bool))
    if not ok:
        raise ContractError(field, "must be a non-empty string" + ("" if strings_only else " or an integer"))
    return x


def _sortable_ids(ids: list[Any]) -> tuple[str, ...]:
    """Library ids whose string order is the JSON ids' order (design §3 "ties: smallest id").

    The library breaks ties on its string ids; JSON integer ids must compare as numbers (9 before 10),
    so when any id is an integer each flow gets its rank in (integers by value, then strings) order,
    zero-padded. The response still uses the caller's ids.
    """
    if all(isinstance(x, str) for x in ids):
        return tuple(ids)
    order = sorted(range(len(ids)), key=lambda i: (0, ids[i], "") if isinstance(ids[i], int) else (1, 0, ids[i]))
    width = len(str(len(ids)))
    rank = [""] * len(ids)
    for r, i in enumerate(order):
        rank[i] = f"{r:0{width}d}"
    return tuple(rank)


def _unique(ids: list[Any], list_field: str) -> None:
    seen: set[Any] = set()
    for i, x in enumerate(ids):
        if x in seen:
            raise ContractError(f"{list_field}[{i}].id", f"duplicate id {x!r}")
        seen.add(x)


# ---------------------------------------------------------------- p1
def _loss_budget_mode(j: dict[str, Any], prefix: str) -> str:
    """A job's ``loss_budget_mode`` (design §2): "expected" (default, Eq. 9) or "bound"."""
    mode = j.get("loss_budget_mode", "expected")
    if mode is None:
        return "expected"
    if mode not in LOSS_BUDGET_MODES:
        raise ContractError(f"{prefix}loss_budget_mode", f"must be one of {', '.join(LOSS_BUDGET_MODES)}, got {mode!r}")
    return str(mode)


def _guaranteed_budget(req: dict[str, Any], budget: float) -> float | None:
    """The request's ``guaranteed_budget_bytes_per_s`` (design §2 "Loss budget modes", §4.2): the part of the budget
    no one takes back, at which a `bound` job's transfer time T is taken. Absent/null = the budget itself (None);
    otherwise > 0 and at most the budget (the budget less borrowed reserve, as the tick and the simulator pass it)."""
    guaranteed = _num(req, "guaranteed_budget_bytes_per_s", default=None, gt=0, nullable=True)
    if guaranteed is not None and guaranteed > budget:
        raise ContractError("guaranteed_budget_bytes_per_s",
                            f"must be <= budget_bytes_per_s ({budget:g}), got {guaranteed!r}")
    return guaranteed


def _validate_p1(req: dict[str, Any]) -> tuple[P1Jobs, float, float, list[Any], float, float | None]:
    """The p1 request as ``plan_checkpoints`` takes it: (jobs, budget, β, caller's ids, Δ_min, guaranteed budget).

    ``jobs.hazard_per_s`` is the hazard planned with (design §2 "Estimators"): each job's ``hazard_per_s`` (λ̂) plus
    its optional ``short_notice_hazard_per_s`` (≥ 0, default 0), the rate of scheduled reclaims whose notice is
    shorter than its final checkpoint needs — added to λ before planning, as the portal's tick and the simulator do
    (``scheduler.estimators.short_notice_rate_per_s``)."""
    budget = _num(req, "budget_bytes_per_s", gt=0)
    beta = _num(req, "beta", default=0.2, gt=0)
    min_interval = _num(req, "min_interval_s", default=MIN_INTERVAL_S, ge=0)  # Δ_min of design §2
    guaranteed = _guaranteed_budget(req, budget)  # type: ignore[arg-type]
    jobs = _list(req, "jobs", "")
    ids: list[Any] = []
    modes: list[str] = []
    cols: dict[str, list[float]] = {k: [] for k in ("lam", "c", "cap", "loss", "notice", "tr", "stall", "xfer")}
    for i, j in enumerate(jobs):
        p = f"jobs[{i}]."
        j = _obj(j, f"jobs[{i}]")
        ids.append(_ident(j, "id", p))
        lam = _num(j, "hazard_per_s", p, gt=0)
        short = _num(j, "short_notice_hazard_per_s", p, default=0.0, ge=0)  # design §2 "Estimators"
        cols["lam"].append(lam + short)  # type: ignore[operator]
        cols["c"].append(_num(j, "ckpt_bytes", p, gt=0))  # type: ignore[arg-type]
        cap = _num(j, "cap_bytes_per_s", p, default=None, gt=0, nullable=True)
        cols["cap"].append(math.inf if cap is None else cap)
        loss = _num(j, "loss_budget_s", p, default=None, gt=0, nullable=True)
        cols["loss"].append(math.inf if loss is None else loss)
        notice = _num(j, "notice_s", p, default=None, ge=0, nullable=True)
        cols["notice"].append(math.nan if notice is None else notice)
        cols["tr"].append(_num(j, "restart_s", p, default=0.0, ge=0))  # type: ignore[arg-type]
        # design §2 "Asynchronous snapshots": absent/null = a synchronous checkpoint (planned as before)
        stall = _num(j, "stall_s", p, default=None, ge=0, nullable=True)
        cols["stall"].append(math.nan if stall is None else stall)
        xfer = _num(j, "transfer_s", p, default=None, ge=0, nullable=True)
        cols["xfer"].append(math.nan if xfer is None else xfer)
        modes.append(_loss_budget_mode(j, p))  # design §2 "Loss budget modes"
    _unique(ids, "jobs")
    p1 = P1Jobs(
        ids=tuple(str(x) for x in ids),
        hazard_per_s=np.array(cols["lam"], dtype=float),
        ckpt_bytes=np.array(cols["c"], dtype=float),
        cap_bytes_per_s=np.array(cols["cap"], dtype=float),
        loss_budget_s=np.array(cols["loss"], dtype=float),
        notice_s=np.array(cols["notice"], dtype=float),
        restart_s=np.array(cols["tr"], dtype=float),
        stall_s=np.array(cols["stall"], dtype=float) if any(math.isfinite(x) for x in cols["stall"]) else None,
        transfer_s=np.array(cols["xfer"], dtype=float) if any(math.isfinite(x) for x in cols["xfer"]) else None,
        loss_budget_mode=np.array(modes, dtype=object) if "bound" in modes else None,
    )
    return p1, budget, beta, ids, min_interval, guaranteed  # type: ignore[return-value]


def _decide_p1(req: dict[str, Any]) -> dict[str, Any]:
    jobs, budget, beta, ids, min_interval, guaranteed = _validate_p1(req)
    plan = plan_checkpoints(jobs, budget, beta, min_interval_s=min_interval, guaranteed_budget_bytes_per_s=guaranteed)
    return {
        "jobs": [
            {
                "id": ids[i],
                "planned_hazard_per_s": float(jobs.hazard_per_s[i]),  # λ̂ + the short-notice rate
                "bandwidth_bytes_per_s": float(plan.bandwidth_bytes_per_s[i]),
                "interval_s": float(plan.interval_s[i]),
                "final_checkpoint": bool(plan.final_checkpoint[i]),
                "loss_budget_at_risk": bool(plan.loss_budget_at_risk[i]),
            }
            for i in range(len(ids))
        ],
        "expected_cost": float(plan.expected_cost),
    }


# ---------------------------------------------------------------- p2
def _validate_p2(req: dict[str, Any]) -> P2Request:
    links = _list(req, "links", "")
    nodes = _list(req, "nodes", "")
    if not nodes:
        raise ContractError("nodes", "must not be empty")
    link_ids: list[str] = []
    ends_a: list[str] = []
    ends_b: list[str] = []
    link_bw: list[float] = []
    for i, link in enumerate(links):
        p = f"links[{i}]."
        link = _obj(link, f"links[{i}]")
        link_ids.append(_ident(link, "id", p, strings_only=True))
        ends_a.append(_ident(link, "a", p, strings_only=True))
        ends_b.append(_ident(link, "b", p, strings_only=True))
        link_bw.append(_num(link, "bytes_per_s", p, gt=0))  # type: ignore[arg-type]
    _unique(link_ids, "links")
    node_ids: list[str] = []
    building: list[Any] = []
    free: list[float] = []
    vram: list[float] = []
    capability: list[float] = []
    compatible: list[bool] = []
    hazard: list[list[float]] = []
    for i, n in enumerate(nodes):
        p = f"nodes[{i}]."
        n = _obj(n, f"nodes[{i}]")
        node_ids.append(_ident(n, "id", p, strings_only=True))
        building.append(str(_ident(n, "building", p)))
        free.append(_num(n, "free_gpus", p, ge=0, integer=True))  # type: ignore[arg-type]
        vram.append(_num(n, "vram_gb", p, ge=0))  # type: ignore[arg-type]
        capability.append(_num(n, "capability", p, ge=0))  # type: ignore[arg-type]
        comp = n.get("compatible", True)
        if not isinstance(comp, bool):
            raise ContractError(f"{p}compatible", "must be true or false")
        compatible.append(comp)
        hz = _list(n, "hazard_per_s_by_hour", p)
        if len(hz) != 24:
            raise ContractError(f"{p}hazard_per_s_by_hour", f"must have 24 numbers, got {len(hz)}")
        hazard.append([_hour(x, f"{p}hazard_per_s_by_hour[{k}]") for k, x in enumerate(hz)])
    _unique(node_ids, "nodes")
    index = {x: i for i, x in enumerate(node_ids)}
    source = _ident(req, "source", "", strings_only=True)
    if source not in index:
        raise ContractError("source", f"unknown node {source!r}")
    holder = req.get("ckpt_holder", source)
    if holder is None:
        holder = source
    if not isinstance(holder, str) or holder not in index:
        raise ContractError("ckpt_holder", f"unknown node {holder!r}")
    if "notice_s" not in req:
        raise ContractError("notice_s", "is required (null for an emergency reclaim)")
    notice = _num(req, "notice_s", ge=0, nullable=True)
    try:
        tree = CampusTree.from_links(link_ids, ends_a, ends_b, node_ids)
    except ValueError as exc:
        raise ContractError("links", str(exc)) from None
    return P2Request(
        tree=tree,
        link_bytes_per_s=np.array(link_bw, dtype=float),
        building=np.array(building, dtype=object),
        free_gpus=np.array(free, dtype=float),
        vram_gb=np.array(vram, dtype=float),
        capability=np.array(capability, dtype=float),
        hazard_per_s_by_hour=np.array(hazard, dtype=float).reshape(len(nodes), 24),
        compatible=np.array(compatible, dtype=bool),
        source=index[source],
        ckpt_holder=index[holder],
        ckpt_bytes=_num(req, "ckpt_bytes", gt=0),  # type: ignore[arg-type]
        restart_s=_num(req, "restart_s", default=0.0, ge=0),  # type: ignore[arg-type]
        notice_s=notice,
        remaining_s=_num(req, "remaining_s", ge=0),  # type: ignore[arg-type]
        gpus=int(_num(req, "gpus", default=1.0, ge=1, integer=True)),  # type: ignore[arg-type]
        vram_gb_needed=_num(req, "vram_gb", default=0.0, ge=0),  # type: ignore[arg-type]
        min_capability=_num(req, "min_capability", default=0.0, ge=0),  # type: ignore[arg-type]
        alpha=_num(req, "alpha", default=1.0, ge=0),  # type: ignore[arg-type]
        k_min=int(_num(req, "k_min", default=2.0, ge=0, integer=True)),  # type: ignore[arg-type]
        now_hour=_num(req, "now_hour", default=0.0, ge=0, le=24),  # type: ignore[arg-type]
    )


def _hour(x: Any, field: str) -> float:
    """One entry of an hourly hazard profile: a finite number >= 0."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not _finite(x) or not 0 <= x <= MAX_MAGNITUDE:
        raise ContractError(field, f"must be a finite number in [0, {MAX_MAGNITUDE:g}], got {x!r}")
    return float(x)


def _decide_p2(req: dict[str, Any]) -> dict[str, Any]:
    r = _validate_p2(req)
    return response_view(select_destination(r), r.tree.node_ids)


def _validate_p3(req: dict[str, Any]) -> tuple[P3Flows, float, float, float, list[Any]]:
    capacity = _num(req, "capacity_bytes_per_s", gt=0)
    frac = _num(req, "reserve_fraction", default=0.3, ge=0, le=1)
    b_min = _num(req, "reserve_min_bytes_per_s", default=0.0, ge=0)
    flows = _list(req, "flows", "")
    ids: list[Any] = []
    cols: dict[str, list[float]] = {k: [] for k in ("c", "notice", "tr", "cap")}
    for i, f in enumerate(flows):
        p = f"flows[{i}]."
        f = _obj(f, f"flows[{i}]")
        ids.append(_ident(f, "id", p))
        cols["c"].append(_num(f, "bytes", p, gt=0))  # type: ignore[arg-type]
        cols["notice"].append(_num(f, "notice_s", p, ge=0))  # type: ignore[arg-type]
        cols["tr"].append(_num(f, "restart_s", p, default=0.0, ge=0))  # type: ignore[arg-type]
        cap = _num(f, "cap_bytes_per_s", p, default=None, gt=0, nullable=True)
        cols["cap"].append(math.inf if cap is None else cap)
    _unique(ids, "flows")
    p3 = P3Flows(
        ids=_sortable_ids(ids),
        bytes=np.array(cols["c"], dtype=float),
        notice_s=np.array(cols["notice"], dtype=float),
        restart_s=np.array(cols["tr"], dtype=float),
        cap_bytes_per_s=np.array(cols["cap"], dtype=float),
    )
    return p3, capacity, frac, b_min, ids  # type: ignore[return-value]


def _decide_p3(req: dict[str, Any]) -> dict[str, Any]:
    flows, capacity, frac, b_min, ids = _validate_p3(req)
    d = admit_flows(flows, capacity, frac, b_min)
    return {
        "migration_budget_bytes_per_s": float(d.migration_budget_bytes_per_s),
        "admitted": [
            {
                "id": ids[i],
                "min_rate": float(d.min_rate_bytes_per_s[i]),
                "rate": float(d.rate_bytes_per_s[i]),
                "dscp": int(d.dscp[i]),
            }
            for i in np.flatnonzero(d.admitted).tolist()
        ],
        "degraded": [
            {"id": ids[i], "reason": reason} for i, reason in enumerate(d.degraded_reason) if reason is not None
        ],
    }


_DECIDERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "p1": _decide_p1,
    "p2": _decide_p2,
    "p3": _decide_p3,
}
KINDS = tuple(_DECIDERS)
_VALIDATORS: dict[str, Callable[[dict[str, Any]], object]] = {
    "p1": _validate_p1,
    "p2": _validate_p2,
    "p3": _validate_p3,
}


def validate(kind: str, request: Any) -> object:
    """Only the validation step (design §5); raises ContractError naming the field."""
    if kind not in _VALIDATORS:
        raise ContractError("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    return _VALIDATORS[kind](_obj(request, "request"))


def decide(kind: str, request: Any) -> dict[str, Any]:
    """design §5: validate `request` for `kind` (p1|p2|p3), decide, return the JSON-ready response."""
    if kind not in _DECIDERS:
        raise ContractError("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    response = _DECIDERS[kind](_obj(request, "request"))
    if not _all_finite(response):  # a safety net behind the magnitude limits: JSON has no inf/NaN
        raise ContractError("request", "numbers out of range: the answer would not be finite")
    return response


def _all_finite(x: Any) -> bool:
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, dict):
        return all(_all_finite(v) for v in x.values())
    if isinstance(x, list):
        return all(_all_finite(v) for v in x)
    return True
