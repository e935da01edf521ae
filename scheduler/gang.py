"""Gangs and elastic ranges: jobs bigger than one node, and jobs that change size (design §3 "Gangs").

A gang job has N members of G GPUs each, one member per node, started together and checkpointed together (every
rank writes its shard at the same step; the checkpoint is complete only when every shard is). The decisions here
are the pure parts the portal, the simulator and the what-if page share:

- :func:`select_gang_destinations` — P2 for a whole gang: N nodes at once or none (all or nothing), each node
  feasible for one member by the same checks as a single job (:func:`scheduler.p2.feasibility_checks`), the
  set chosen by the survival of the whole set, the time for its slowest rank's shard to reach its node, and the
  narrowest path between two members.
- :func:`gang_hazard_per_s` and :func:`coordinated_interval_s` — P1 for a gang: it is interrupted when any member
  is, so its hazard is the sum of its members' (survival multiplies); its members checkpoint at one interval,
  the longest of their plans at that hazard (the checkpoint completes when the slowest shard is written).
- :func:`shrink_or_move` — for an elastic job that loses some of its GPUs to a reclaim: shrink (keep running on
  what is left, if that is at or above its minimum) or move whole, by which costs it fewer GPU-seconds.
- :func:`grow_pays` — whether an elastic job offered freed GPUs should take them: the wall time it saves against
  the save and re-rendezvous it costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from scheduler.p2 import feasible_mask, survival
from scheduler.topology import BottleneckIndex, CampusTree

__all__ = [
    "ElasticChoice", "GangDecision", "GangRequest", "coordinated_interval_s", "gang_hazard_per_s",
    "grow_pays", "select_gang_destinations", "shrink_or_move",
]

_UNREACHABLE_S = 1e18  # a rank that cannot be restored on a node in time (assignment costs must be finite)


@dataclass(frozen=True, eq=False)
class GangRequest:
    """One gang looking for nodes (design §3 "Gangs"); node fields are per node index, as in ``P2Request``."""

    tree: CampusTree
    link_bytes_per_s: np.ndarray  # available bandwidth per link (lower confidence bound)
    building: np.ndarray  # per node
    free_gpus: np.ndarray
    vram_gb: np.ndarray
    capability: np.ndarray
    hazard_per_s_by_hour: np.ndarray  # (n_nodes, 24)
    compatible: np.ndarray | None  # bool per node: every shard's checkpoint restores there (None = all)
    members: int  # N: nodes the gang spans, one member (rank) per node
    gpus_per_member: int  # G
    shard_bytes: float  # one rank's share of the coordinated checkpoint
    restart_s: float
    remaining_s: float
    # Per rank, the node index holding its shard's freshest copy; None: a fresh start (nothing to copy).
    holders: np.ndarray | None = None
    excluded: np.ndarray | None = None  # bool per node: may not hold a member (the nodes being reclaimed)
    notice_s: float | None = None  # scheduled: every rank restored within it; None = emergency or fresh start
    vram_gb_needed: float = 0.0
    min_capability: float = 0.0
    alpha: float = 1.0
    now_hour: float = 0.0
    index: BottleneckIndex | None = None


@dataclass(frozen=True)
class GangDecision:
    """P2's answer for a gang. ``destinations[r]`` is rank r's node index; None: no set of nodes holds it now."""

    destinations: tuple[int, ...] | None
    restore_s: float  # the slowest rank's copy plus the restart (NaN without destinations)
    survival: float  # that every member's node stays lent for the remaining runtime
    member_bytes_per_s: float  # the narrowest path between two members (inf for a gang of one)
    score: float
    feasible_nodes: int  # nodes that could hold one member
    considered: tuple[tuple[tuple[int, ...], float], ...]  # every candidate set and its score, best first
    reason: str  # why there is no set ("" when there is one)


def _assign(cost: np.ndarray) -> np.ndarray:
    """Columns (nodes) for each row (rank) minimising the summed cost, each node at most once."""
    rows, cols = linear_sum_assignment(cost)
    out = np.empty(cost.shape[0], dtype=np.int64)
    out[rows] = cols
    return out


def select_gang_destinations(req: GangRequest) -> GangDecision:
    """design §3 "Gangs": the N nodes for a gang, all or nothing.

    1. Feasible nodes: each has ``gpus_per_member`` GPUs free and passes the VRAM, capability and compatibility
       checks, and is not ``excluded``. Fewer than N: no set (``reason`` says how many there are).
    2. Per rank r and node d: T[r, d] = shard/bottleneck(holder_r, d) + T_r (T_r alone on a fresh start); on a
       scheduled reclaim a node that cannot receive rank r's shard before the notice ends cannot hold rank r.
    3. Candidate sets, one per pool: each building with at least N feasible nodes (its members talk through one
       switch) and the whole campus. In a pool, ranks go to nodes by a minimum-cost assignment of
       T[r, d] + α·(1 − S_d)·T̄_d (T̄_d: the mean of d's column, P2's expected cost of moving again).
    4. A set's score: restore + sync + α·(1 − S_set)·restore, with restore = max_r T[r, d_r] (the gang resumes
       when its slowest rank does), S_set = Π S_d (design §3 survival, the gang is interrupted when any member
       is) and sync = shard/(the narrowest path between two members). The lowest score wins; ties: the set
       whose sorted node ids come first.
    """
    n_members = int(req.members)
    if n_members < 1 or req.gpus_per_member < 1:
        raise ValueError("a gang needs members >= 1 and gpus_per_member >= 1")
    if req.holders is not None and len(req.holders) != n_members:
        raise ValueError(f"holders names {len(req.holders)} ranks, the gang has {n_members}")
    tree = req.tree
    feasible = feasible_mask(req.free_gpus, req.vram_gb, req.capability, req.compatible, gpus=req.gpus_per_member,
                             vram_gb_needed=req.vram_gb_needed, min_capability=req.min_capability)
    if req.excluded is not None:
        feasible = feasible & ~np.asarray(req.excluded, dtype=bool)
    cand = np.flatnonzero(feasible)
    if cand.size < n_members:
        return _none(int(cand.size), f"{cand.size} nodes can hold a member of {req.gpus_per_member} GPUs; "
                                     f"the gang needs {n_members}")
    index = req.index if req.index is not None else BottleneckIndex.build(tree, req.link_bytes_per_s)
    if req.holders is None:
        transfer = np.full((n_members, cand.size), float(req.restart_s))
    else:
        with np.errstate(divide="ignore"):
            transfer = np.stack([req.shard_bytes / index.bottleneck_from(int(h), cand) for h in req.holders])
        transfer = np.where(cand[None, :] == np.asarray(req.holders)[:, None], 0.0, transfer) + req.restart_s
    scheduled = req.notice_s is not None and not np.isnan(req.notice_s)
    reachable = transfer <= req.notice_s if scheduled else np.isfinite(transfer)
    surv = survival(np.asarray(req.hazard_per_s_by_hour)[cand], req.now_hour, req.remaining_s)
    counts = reachable.sum(axis=0)
    mean_t = np.where(counts > 0, np.where(reachable, transfer, 0.0).sum(axis=0) / np.maximum(counts, 1), 0.0)
    cost = np.where(reachable, transfer + req.alpha * (1.0 - surv)[None, :] * mean_t[None, :], _UNREACHABLE_S)
    building = np.asarray(req.building)[cand]
    pools = [np.flatnonzero(building == b) for b in dict.fromkeys(building.tolist())]
    pools = [p for p in pools if p.size >= n_members and p.size < cand.size] + [np.arange(cand.size)]
    scored: dict[tuple[int, ...], tuple[float, float, float, float]] = {}
    for pool in pools:
        pick = pool[_assign(cost[:, pool])]
        if not reachable[np.arange(n_members), pick].all():
            continue
        nodes = tuple(int(cand[k]) for k in pick)
        if nodes in scored:
            continue
        restore = float(transfer[np.arange(n_members), pick].max())
        s_set = float(np.prod(surv[pick]))
        narrowest = min((float(index.bottleneck_from(a, np.array(nodes[i + 1:])).min())
                         for i, a in enumerate(nodes[:-1])), default=np.inf)
        sync = req.shard_bytes / narrowest if np.isfinite(narrowest) else 0.0
        scored[nodes] = (restore + sync + req.alpha * (1.0 - s_set) * restore, restore, s_set, narrowest)
    if not scored:
        return _none(int(cand.size), "no set of nodes can receive every rank's shard before the notice ends")
    ids = tree.node_ids
    ranked = sorted(scored.items(), key=lambda kv: (kv[1][0], sorted(ids[i] for i in kv[0])))
    best, (score, restore, s_set, narrowest) = ranked[0]
    return GangDecision(destinations=best, restore_s=restore, survival=s_set, member_bytes_per_s=narrowest,
                        score=score, feasible_nodes=int(cand.size),
                        considered=tuple((nodes, v[0]) for nodes, v in ranked), reason="")


def _none(feasible_nodes: int, reason: str) -> GangDecision:
    return GangDecision(destinations=None, restore_s=float("nan"), survival=0.0, member_bytes_per_s=0.0,
                        score=float("inf"), feasible_nodes=feasible_nodes, considered=(), reason=reason)


def _per_gang(values: np.ndarray, gang_of: np.ndarray, reduce: np.ufunc) -> np.ndarray:
    """``reduce`` over each gang's members, given back to every member; a job with ``gang_of`` −1 is alone."""
    values = np.asarray(values, dtype=float)
    gang_of = np.asarray(gang_of)
    out = values.copy()
    in_gang = gang_of >= 0
    if not in_gang.any():
        return out
    labels, inverse = np.unique(gang_of[in_gang], return_inverse=True)
    start = np.full(labels.size, 0.0 if reduce is np.add else -np.inf)
    reduce.at(start, inverse, values[in_gang])
    out[in_gang] = start[inverse]
    return out


def gang_hazard_per_s(member_hazard_per_s: np.ndarray, gang_of: np.ndarray) -> np.ndarray:
    """Per job, the hazard P1 plans it with (design §3 "Gangs"): a gang member's is the sum over its gang (the
    gang stops when any member's node leaves, so survival multiplies); a job alone keeps its own."""
    return _per_gang(member_hazard_per_s, gang_of, np.add)


def coordinated_interval_s(member_interval_s: np.ndarray, gang_of: np.ndarray) -> np.ndarray:
    """Per job, the interval it checkpoints at: a gang's members all at the longest of their plans (each planned
    at the gang's hazard: with equal λ the member with the costliest shard, whose write completes the coordinated
    checkpoint, plans the longest interval); a job alone keeps its own."""
    return _per_gang(member_interval_s, gang_of, np.maximum)


@dataclass(frozen=True)
class ElasticChoice:
    """What an elastic job does when a reclaim takes ``gpus_reclaimed`` of its GPUs (design §3 "Elastic")."""

    action: str  # "shrink", "move" or "stop" (neither possible: requeued from its last complete checkpoint)
    gpus_after: int
    shrink_cost_gpu_s: float | None  # None: shrinking would go below the job's minimum
    move_cost_gpu_s: float | None  # None: no destination holds it whole
    reason: str


def shrink_or_move(*, gpus_now: int, gpus_reclaimed: int, min_gpus: int, checkpoint_s: float, restart_s: float,
                   move_transfer_s: float | None, regrow_s: float, since_checkpoint_s: float = 0.0) -> ElasticChoice:
    """Shrink or move, by the GPU-seconds each costs the job (design §3 "Elastic").

    Either way the job saves (``checkpoint_s``, 0 in an emergency) and re-rendezvouses (``restart_s``), and the
    work since its last complete checkpoint (``since_checkpoint_s``, 0 with a final checkpoint) is lost on every
    GPU it had. Shrinking idles the GPUs left only for the save and the restart, then runs without the reclaimed
    ones until it can grow back (``regrow_s``: the caller's estimate of when GPUs free up for it; 0 counts only
    the idle time). Moving idles all of them for the save, the copy (``move_transfer_s``; None: no destination)
    and the restart, then runs whole. The smaller cost wins; a tie shrinks (nothing crosses the network)."""
    if gpus_reclaimed < 1 or gpus_reclaimed > gpus_now or min_gpus < 1:
        raise ValueError("need 1 <= gpus_reclaimed <= gpus_now and min_gpus >= 1")
    if min(checkpoint_s, restart_s, regrow_s, since_checkpoint_s) < 0 or (move_transfer_s or 0.0) < 0:
        raise ValueError("times must be >= 0 seconds")
    after = gpus_now - gpus_reclaimed
    lost_before = gpus_now * since_checkpoint_s
    shrink = (after * (checkpoint_s + restart_s) + gpus_reclaimed * regrow_s + lost_before
              if after >= min_gpus else None)
    move = (gpus_now * (checkpoint_s + move_transfer_s + restart_s) + lost_before
            if move_transfer_s is not None else None)
    if shrink is None and move is None:
        return ElasticChoice("stop", 0, None, None, f"{after} GPUs would be left, below its minimum of {min_gpus}, "
                                                    "and no node set holds it whole")
    if move is None or (shrink is not None and shrink <= move):
        why = (f"keeps running on {after} GPUs: {shrink:.0f} GPU-s against "
               + (f"{move:.0f} to move" if move is not None else "no destination to move to"))
        return ElasticChoice("shrink", after, shrink, move, why)
    why = (f"moves whole: {move:.0f} GPU-s against "
           + (f"{shrink:.0f} to shrink" if shrink is not None else f"{after} GPUs left, below its minimum of "
              f"{min_gpus}"))
    return ElasticChoice("move", gpus_now, shrink, move, why)


GROW_SAFETY = 2.0  # growing must save this many times what it costs (a reclaim may cut the rest of the job short)


def grow_pays(*, remaining_s: float, gpus_now: int, gpus_after: int, checkpoint_s: float, restart_s: float) -> bool:
    """Whether an elastic job running ``gpus_now`` GPUs with ``remaining_s`` of wall time left should grow to
    ``gpus_after`` (design §3 "Elastic"): with work shared evenly over its GPUs, the rest takes
    remaining·now/after, so growing saves remaining·(1 − now/after) seconds; it costs a save and a
    re-rendezvous (``checkpoint_s`` + ``restart_s``) during which the job does no work. It pays when the saving
    is at least GROW_SAFETY times the cost."""
    if gpus_now < 1 or gpus_after <= gpus_now:
        raise ValueError("need 1 <= gpus_now < gpus_after")
    if min(remaining_s, checkpoint_s, restart_s) < 0:
        raise ValueError("times must be >= 0 seconds")
    saved_s = remaining_s * (1.0 - gpus_now / gpus_after)
    return saved_s >= GROW_SAFETY * (checkpoint_s + restart_s)
