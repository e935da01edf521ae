"""P2 — volatility-aware destination selection (design §3).

Feasibility filter, locality (Lemma 3) with k_min fallback, survival over the remaining runtime from an
hourly hazard profile, and Score(d) = T_mig(s, d) + alpha·(1 - S_d)·T̄_mig(d). Vectorised over nodes; the
all-pairs mean T̄_mig comes from `topology.BottleneckIndex` (no nxn matrix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from scheduler.topology import BottleneckIndex, CampusTree

__all__ = [
    "EXCLUSION_REASONS", "P2Decision", "P2Request", "feasibility_checks", "feasible_mask", "response_view",
    "select_destination", "survival",
]

EXCLUSION_REASONS = ("vram", "capability", "compatibility", "busy", "deadline")
TIE_RELATIVE = 1e-12  # scores within this relative distance of the minimum tie (design §3: smallest id wins)


@dataclass(frozen=True, eq=False)
class P2Request:
    """One reclaimed job looking for a destination (design §3); node fields are per node index."""

    tree: CampusTree
    link_bytes_per_s: np.ndarray  # available bandwidth per link (lower confidence bound)
    building: np.ndarray  # per node (str/object array or int codes)
    free_gpus: np.ndarray
    vram_gb: np.ndarray
    capability: np.ndarray
    hazard_per_s_by_hour: np.ndarray  # (n_nodes, 24)
    compatible: np.ndarray | None  # bool per node: checkpoint-compatible (None = all)
    source: int
    ckpt_holder: int
    ckpt_bytes: float
    restart_s: float
    notice_s: float | None  # None (or NaN) = emergency reclaim
    remaining_s: float
    gpus: int = 1
    vram_gb_needed: float = 0
    min_capability: float = 0
    alpha: float = 1.0
    k_min: int = 2
    now_hour: float = 0.0
    # Optional per-period index shared by simultaneous reclaims (same tree and link bandwidths).
    index: BottleneckIndex | None = None


@dataclass(frozen=True, eq=False)
class P2Decision:
    """P2's answer (design §3, §5 p2 response). Candidate arrays follow `candidate` (ascending index)."""

    destination: int | None  # node index; None = degraded recovery from the freshest checkpoint
    candidate: np.ndarray  # node indices considered (after locality)
    transfer_s: np.ndarray  # T_mig(holder, d), includes T_r
    survival: np.ndarray
    score: np.ndarray
    local: np.ndarray  # bool: in the source's building
    excluded_index: np.ndarray  # node indices that failed a check (the source itself is not listed)
    excluded_code: np.ndarray  # per excluded node, index into EXCLUSION_REASONS

    @cached_property
    def excluded(self) -> tuple[tuple[int, str], ...]:
        """(node index, reason) pairs, built on first use (at 50,000 nodes this is the slow part)."""
        return tuple(
            zip(self.excluded_index.tolist(), [EXCLUSION_REASONS[k] for k in self.excluded_code.tolist()], strict=True)
        )


def feasibility_checks(
    free_gpus: np.ndarray, vram_gb: np.ndarray, capability: np.ndarray, compatible: np.ndarray | None, *,
    gpus: int, vram_gb_needed: float, min_capability: float,
) -> dict[str, np.ndarray]:
    """design §3 feasibility before locality and deadlines, one pass mask per check, keyed and ordered like
    EXCLUSION_REASONS (hardware first, then load): VRAM per GPU, compute capability, checkpoint compatibility
    (``compatible`` None = every node), enough free GPUs. A node's exclusion reason is its first failing check
    (``select_destination`` and ``scheduler.explain`` both read them from here)."""
    n = np.asarray(free_gpus).shape[0]
    return {
        "vram": np.asarray(vram_gb) >= vram_gb_needed,
        "capability": np.asarray(capability) >= min_capability,
        "compatibility": np.ones(n, dtype=bool) if compatible is None else np.asarray(compatible, dtype=bool),
        "busy": np.asarray(free_gpus) >= gpus,
    }


def feasible_mask(
    free_gpus: np.ndarray, vram_gb: np.ndarray, capability: np.ndarray, compatible: np.ndarray | None, *,
    gpus: int, vram_gb_needed: float, min_capability: float,
) -> np.ndarray:
    """design §3 feasibility, before locality and deadlines: every check of :func:`feasibility_checks` passes."""
    checks = feasibility_checks(free_gpus, vram_gb, capability, compatible, gpus=gpus,
                                vram_gb_needed=vram_gb_needed, min_capability=min_capability)
    return np.logical_and.reduce(list(checks.values()))


def survival(
    hazard_per_s_by_hour: np.ndarray, now_hour: float, remaining_s: float
) -> np.ndarray:
    """S_d = exp(-∫ h_d(u) du) over [now, now + remaining] with h_d piecewise constant by hour (design §3)."""
    h = np.asarray(hazard_per_s_by_hour, dtype=float)
    cum = np.concatenate([np.zeros((h.shape[0], 1)), np.cumsum(h, axis=1) * 3600.0], axis=1)  # (n, 25)
    day = cum[:, 24]

    def integral_to(t_hour: float) -> np.ndarray:
        days, rem = divmod(t_hour, 24.0)
        k = min(int(rem), 23)
        return days * day + cum[:, k] + (rem - k) * 3600.0 * h[:, k]

    start = float(now_hour) % 24.0
    return np.exp(-(integral_to(start + remaining_s / 3600.0) - integral_to(start)))


def select_destination(req: P2Request) -> P2Decision:
    """design §3: filter, localise (Lemma 3), score, pick the minimum (ties: smallest node id)."""
    tree = req.tree
    n = tree.n_nodes
    nodes = np.arange(n)
    index = req.index if req.index is not None else BottleneckIndex.build(tree, req.link_bytes_per_s)
    # Transfer starts at the freshest replica's holder (the source is gone in an emergency).
    with np.errstate(divide="ignore"):
        transfer = req.ckpt_bytes / index.bottleneck_from(req.ckpt_holder, nodes) + req.restart_s
    hardware_and_load = feasibility_checks(req.free_gpus, req.vram_gb, req.capability, req.compatible,
                                           gpus=req.gpus, vram_gb_needed=req.vram_gb_needed,
                                           min_capability=req.min_capability)
    vram_ok, cap_ok, compat_ok, busy_ok = hardware_and_load.values()
    scheduled = req.notice_s is not None and not np.isnan(req.notice_s)
    deadline_ok = transfer <= req.notice_s if scheduled else np.ones(n, dtype=bool)
    not_source = nodes != req.source
    checks = (vram_ok, cap_ok, compat_ok, busy_ok, deadline_ok)
    feasible = not_source & vram_ok & cap_ok & compat_ok & busy_ok & deadline_ok
    # First failing check names the reason (hardware first, then load, then time).
    fail = np.stack([~c for c in checks])
    first = np.argmax(fail, axis=0)
    bad = not_source & ~feasible
    building = np.asarray(req.building)
    local_all = building == building[req.source]
    d_local = feasible & local_all
    # Lemma 3: D_ℓ if |D_ℓ| ≥ k_min, else D_c. An empty D_ℓ never wins (k_min = 0 would otherwise leave a job
    # with no destination while D_c is not empty; design §3's "No feasible node" applies only to an empty D_c).
    cand_mask = d_local if int(d_local.sum()) >= max(req.k_min, 1) else feasible
    cand = np.flatnonzero(cand_mask)
    # T̄_mig(d): mean T_mig(d, o) over compatible o (VRAM and capability only), o ≠ source, o ≠ d.
    members = vram_ok & cap_ok & not_source
    sums = index.inverse_bottleneck_sums(members, cand)
    count = int(members.sum()) - members[cand].astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_bar = np.where(count > 0, req.ckpt_bytes * sums / np.maximum(count, 1) + req.restart_s, 0.0)
    surv = survival(np.asarray(req.hazard_per_s_by_hour)[cand], req.now_hour, req.remaining_s)
    score = transfer[cand] + req.alpha * (1.0 - surv) * t_bar
    destination: int | None = None
    if cand.size:
        # Scores equal up to rounding are ties (the vectorised T̄_mig sums in another order than a per-node
        # loop, so mathematically equal scores can differ in the last bits): smallest id among them.
        low = score.min()
        best = np.flatnonzero(score <= low + TIE_RELATIVE * abs(low))
        if best.size > 1:
            ids = np.array([tree.node_ids[i] for i in cand[best]])
            best = best[np.argsort(ids, kind="stable")]
        destination = int(cand[best[0]])
    return P2Decision(
        destination=destination,
        candidate=cand,
        transfer_s=transfer[cand],
        survival=surv,
        score=score,
        local=local_all[cand],
        excluded_index=np.flatnonzero(bad),
        excluded_code=first[bad],
    )


def response_view(decision: P2Decision, ids: Sequence[Any]) -> dict[str, Any]:
    """The design §5 p2 response of ``decision``, naming node index i as ``ids[i]`` (the contract's node ids, or
    the portal's node pks)."""
    return {
        "destination": None if decision.destination is None else ids[int(decision.destination)],
        "candidates": [
            {"id": ids[int(c)], "transfer_s": float(t), "survival": float(s), "score": float(sc), "local": bool(lo)}
            for c, t, s, sc, lo in zip(decision.candidate, decision.transfer_s, decision.survival, decision.score,
                                       decision.local, strict=True)
        ],
        "excluded": [{"id": ids[i], "reason": reason} for i, reason in decision.excluded],
    }

