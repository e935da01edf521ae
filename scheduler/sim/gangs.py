"""Gang and elastic jobs on a campus of lent nodes, simulated (design §3 "Gangs", "Elastic"; design §21.6).

A job here spans ``members`` nodes with ``gpus`` GPUs on each (a job alone on one node is a gang of one) and, if
its ``min_members`` is lower, may run on any number of members in between (elastic). Its work ``work_s`` is
counted in seconds at full size: on k of its M members it progresses at k/M (work shared evenly over ranks).
Time runs from event to event (submissions, reclaim notices and deadlines, node returns, restores ending, jobs
finishing, the control period) and, between events, a running gang alternates Δ seconds of work with a
coordinated checkpoint of s seconds (every rank writes its shard C/k at its share b of its node's checkpoint
budget; the checkpoint is complete, and durable off the nodes, when the slowest shard is), in closed form
(`scheduler.sim.cycles`). A reclaim that ends a member's node interrupts the whole gang: it loses the work since
its last complete checkpoint on every GPU it had.

The decisions are the production ones (`scheduler.gang`, `scheduler.p1`): which nodes a gang gets
(`select_gang_destinations`), its coordinated interval (`plan_checkpoints` per member at the gang's hazard, then
`coordinated_interval_s`), shrink or move (`shrink_or_move`) and growth (`grow_pays`). What differs between the
policies (`GANG_POLICIES`) is which of them a policy uses:

- ``reclaimnet``: P2 places whole gangs by set survival and bandwidth, P1 plans the coordinated interval, a
  reclaim with notice enough for the coordinated save moves the gang whole (or an elastic one shrinks, whichever
  loses less), an emergency restores the gang from its last complete checkpoint at once elsewhere (or shrinks it),
  and elastic jobs grow into GPUs nobody queued is owed.
- ``reclaimnet-rigid``: the same, with elastic jobs kept at the size they started (the ablation of growth and
  shrinking).
- ``gang-requeue``: P2 and P1 as ReclaimNet, but a member's reclaim kills the gang at its deadline and requeues it
  from its last complete checkpoint, as Slurm does with a job whose node is taken (no final save, no move).
- ``slurm-gang``: Slurm as a campus runs it: first fit, a fixed 10-minute checkpoint, kill and requeue.

Every policy starts an elastic job at what is free within its range (Slurm's ``--nodes=min-max``); only
ReclaimNet changes its size afterwards. The queue is FIFO with backfill and one reservation: once a job cannot
start, no later job (and no growth) takes a node it could use. The estimator's prior comes from a calibration trace
when one is given (the campus's previous period), else from the evaluated trace's first week. Simplifications, the same for every policy: links' available bandwidth is
the trace's link rate less its mean research traffic; a restore copies each rank's shard from where the last
complete checkpoint lies (the member's node, or its building peer once the node is gone) at MIGRATION_FRACTION of
each link on the path; no admission control (design §4's P3 is evaluated by `scheduler.sim.engine`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scheduler.estimators import PLAN_HAZARD_QUANTILE, HazardEstimator, short_notice_rate_per_s
from scheduler.gang import (
    GangRequest,
    coordinated_interval_s,
    gang_hazard_per_s,
    grow_pays,
    select_gang_destinations,
    shrink_or_move,
)
from scheduler.p1 import P1Jobs, plan_checkpoints
from scheduler.sim.cycles import advance_cycles, time_to_finish
from scheduler.sim.states import DONE, FUTURE, QUEUED, RESTART, RUNNING
from scheduler.sim.trace import Trace, gang_columns
from scheduler.topology import BottleneckIndex, CampusTree

CHECKPOINT_BUDGET_FRACTION = 0.3  # B_ckpt of a node: this share of its access link (the portal's default)
RESERVE_FRACTION = 0.3  # research's reserve β: a final save on a notice may use the rest of the link (design §4)
MIGRATION_FRACTION = 0.5  # the share of each link on its path a restore's copy gets
MIN_RATE_BYTES_PER_S = 1e5


@dataclass(frozen=True)
class GangPolicy:
    """Which decisions a simulated policy uses (module docstring)."""

    name: str
    placement: str = "p2"  # "p2" (select_gang_destinations) or "first_fit" (the lowest-numbered free nodes)
    interval: str = "p1"  # "p1" (the coordinated plan) or "fixed"
    fixed_interval_s: float = 600.0
    on_reclaim: str = "move"  # "move" (save, leave whole or shrink) or "requeue" (killed at the deadline)
    elastic: bool = True  # grow into freed GPUs and shrink on a reclaim


GANG_POLICIES: dict[str, GangPolicy] = {
    "reclaimnet": GangPolicy("reclaimnet"),
    "reclaimnet-rigid": GangPolicy("reclaimnet-rigid", elastic=False),
    "gang-requeue": GangPolicy("gang-requeue", on_reclaim="requeue", elastic=False),
    "slurm-gang": GangPolicy("slurm-gang", placement="first_fit", interval="fixed", on_reclaim="requeue",
                             elastic=False),
}


@dataclass
class GangResult:
    """What one run did; `summary` gives the evaluation's numbers."""

    policy: str
    n_jobs: int = 0
    jobs_done: int = 0
    lost_gpu_s: float = 0.0
    held_gpu_s: float = 0.0  # GPUs held by running and restoring jobs, integrated over time
    stall_gpu_s: float = 0.0  # GPU-time of running jobs stalled writing their coordinated checkpoints
    useful_gpu_s: float = 0.0
    interruptions: int = 0  # a reclaim that stopped a gang (or a member of it)
    moves: int = 0  # gangs that left whole with a coordinated final checkpoint
    restores: int = 0  # gangs restored elsewhere from their last complete checkpoint after an emergency
    requeues: int = 0
    shrinks: int = 0
    grows: int = 0
    gang_jobs: int = 0
    elastic_jobs: int = 0
    reasons: list[str] = field(default_factory=list)  # the shrink-or-move reasons, in order

    def summary(self) -> dict[str, Any]:
        idle = max(self.held_gpu_s - self.useful_gpu_s - self.lost_gpu_s - self.stall_gpu_s, 0.0)
        return {"policy": self.policy, "work_lost_gpu_h": round((self.lost_gpu_s + self.stall_gpu_s) / 3600.0, 2),
                "lost_gpu_h": round(self.lost_gpu_s / 3600.0, 2), "stall_gpu_h": round(self.stall_gpu_s / 3600.0, 2),
                "restore_idle_gpu_h": round(idle / 3600.0, 2),
                "jobs_done": self.jobs_done, "jobs": self.n_jobs, "useful_gpu_h": round(self.useful_gpu_s / 3600.0, 1),
                "interruptions": self.interruptions,
                "moves": self.moves, "restores": self.restores, "requeues": self.requeues, "shrinks": self.shrinks,
                "grows": self.grows}


class GangSimulator:
    """One policy on one trace with gang and elastic jobs. `run()` returns a GangResult."""

    def __init__(self, trace: Trace, policy: GangPolicy, period_s: float = 600.0,
                 calibration: Trace | None = None) -> None:
        self.tr, self.pol, self.period_s = trace, policy, float(period_s)
        self.calibration = calibration  # where the estimator's prior is read from (the campus's previous period)
        nd = trace.tables["nodes"]
        self.node_ids = tuple(str(x) for x in nd["id"])
        self.n_nodes = len(self.node_ids)
        nidx = {v: i for i, v in enumerate(self.node_ids)}
        _, self.building = np.unique(nd["building"].astype(str), return_inverse=True)
        self.gpus = nd["gpus"].astype(float)
        self.vram, self.cap = nd["vram_gb"].astype(float), nd["capability"].astype(float)
        lk = trace.tables["links"]
        link_ids = tuple(str(x) for x in lk["id"])
        self.tree = CampusTree.from_links(link_ids, [str(x) for x in lk["a"]], [str(x) for x in lk["b"]],
                                          self.node_ids)
        available = lk["bytes_per_s"].astype(float) - self._mean_research(trace, link_ids)
        self.available = np.maximum(available, MIN_RATE_BYTES_PER_S)
        self.index = BottleneckIndex.build(self.tree, MIGRATION_FRACTION * self.available)
        self.access = np.array([int(self.tree.parent_link[i]) for i in range(self.n_nodes)])
        self.node_budget = CHECKPOINT_BUDGET_FRACTION * self.available[self.access]
        self.peer = np.arange(self.n_nodes)  # where a node's pre-synced shards lie once it is gone
        for i in range(self.n_nodes):
            same = np.flatnonzero(self.building == self.building[i])
            self.peer[i] = same[(np.searchsorted(same, i) + 1) % len(same)]
        jb = trace.tables["jobs"]
        self.J = len(jb["id"])
        self.M, self.kmin = gang_columns(trace)
        self.G = jb["gpus"].astype(float)
        self.submit, self.work = jb["submit_s"].astype(float), jb["work_s"].astype(float)
        self.C, self.Tr = jb["ckpt_bytes"].astype(float), jb["restart_s"].astype(float)
        self.Lmax = jb["loss_budget_s"].astype(float)
        self.jvram, self.jcap = jb["vram_gb"].astype(float), jb["min_capability"].astype(float)
        rc = trace.tables["reclaims"]
        self.rc_node = np.array([nidx[str(x)] for x in rc["node"]], dtype=np.int64)
        self.rc_t, self.rc_notice = rc["t_s"].astype(float), rc["notice_s"].astype(float)
        self.rc_ret = rc["return_s"].astype(float)
        self.hz = HazardEstimator(self.n_nodes, group_of=self.building.astype(np.int64),
                                  prior_per_s=self._prior_hazard_per_s())

    @staticmethod
    def _mean_research(trace: Trace, link_ids: tuple[str, ...]) -> np.ndarray:
        out = np.zeros(len(link_ids))
        rs = trace.tables.get("research")
        if rs is None or not len(rs["link"]):
            return out
        lidx = {v: i for i, v in enumerate(link_ids)}
        li = np.array([lidx[str(x)] for x in rs["link"]], dtype=np.int64)
        total = np.bincount(li, weights=rs["bytes_per_s"].astype(float), minlength=len(link_ids))
        count = np.bincount(li, minlength=len(link_ids))
        return np.where(count > 0, total / np.maximum(count, 1), 0.0)

    def _prior_hazard_per_s(self) -> float:
        """The estimator's prior: the emergency rate per lent node-second over the first week of the calibration
        trace (the campus's previous period, design §21.5), or of the evaluated trace when none is given."""
        tr = self.calibration if self.calibration is not None else self.tr
        rc = tr.tables["reclaims"]
        rc_t, notice, ret = (rc[c].astype(float) for c in ("t_s", "notice_s", "return_s"))
        week = min(7 * 86400.0, tr.horizon_s)
        n_week = float(np.sum((notice == 0) & (rc_t < week)))
        gone_from = np.minimum(rc_t + notice, week)
        back_at = np.minimum(np.nan_to_num(ret, nan=week), week)
        lent_s = max(self.n_nodes * week - float(np.sum(np.maximum(back_at - gone_from, 0.0))), week)
        return max((n_week + 1.0) / lent_s, 1e-8)

    # ---- state -----------------------------------------------------------------------------------
    def _init_state(self) -> None:
        J = self.J
        self.st = np.full(J, FUTURE)
        self.members: list[list[int]] = [[] for _ in range(J)]  # the nodes the job holds now (rank order)
        self.holders: list[list[int]] = [[] for _ in range(J)]  # where its last complete checkpoint's shards lie
        self.prog, self.durable, self.pos = np.zeros(J), np.zeros(J), np.zeros(J)
        self.delta, self.stall = np.full(J, self.pol.fixed_interval_s), np.ones(J)
        self.size = np.zeros(J)  # members running now (0 when not running)
        self.token = np.zeros(J, dtype=np.int64)  # invalidates a restore event once the job's plans change
        self.free = self.gpus.copy()
        self.lent = np.ones(self.n_nodes, dtype=bool)
        self.pending = np.zeros(self.n_nodes, dtype=bool)
        self.queue: list[int] = []
        self.heap: list[tuple[float, int, int, str, int, int]] = []
        self.seq = 0
        self.profile: np.ndarray | None = None
        self.res = GangResult(self.pol.name, n_jobs=J, gang_jobs=int(np.sum(self.M > 1)),
                              elastic_jobs=int(np.sum(self.kmin < self.M)))
        for j in range(J):
            self._push(self.submit[j], "submit", j)
        for k in range(len(self.rc_t)):
            self._push(self.rc_t[k], "notice", k)
            self._push(self.rc_t[k] + self.rc_notice[k], "deadline", k)
            if np.isfinite(self.rc_ret[k]):
                self._push(self.rc_ret[k], "return", k)
        for e in range(int(np.ceil(self.tr.horizon_s / self.period_s))):
            self._push(e * self.period_s, "epoch", e)

    def _push(self, t: float, kind: str, arg: int, token: int = 0) -> None:
        order = {"epoch": 0, "return": 1, "deadline": 2, "notice": 3, "restore": 4, "requeue": 4, "submit": 5}[kind]
        self.seq += 1
        heapq.heappush(self.heap, (float(t), order, self.seq, kind, arg, token))

    # ---- nodes and sets --------------------------------------------------------------------------
    def _profile(self, t: float) -> np.ndarray:
        """P2's hourly hazard profile, refreshed once per control period."""
        if self.profile is None:
            self.profile = self.hz.hourly_profile_per_s(t)
        return self.profile

    def _open(self) -> np.ndarray:
        return self.lent & ~self.pending

    def _request(self, j: int, k: int, t: float, holders: list[int] | None, notice_s: float | None,
                 free: np.ndarray) -> GangRequest:
        rate = k / self.M[j]
        return GangRequest(
            tree=self.tree, link_bytes_per_s=MIGRATION_FRACTION * self.available, building=self.building,
            free_gpus=np.where(self._open(), free, 0.0), vram_gb=self.vram, capability=self.cap,
            hazard_per_s_by_hour=self._profile(t), compatible=None, members=k,
            gpus_per_member=int(self.G[j]), shard_bytes=float(self.C[j]) / k, restart_s=float(self.Tr[j]),
            remaining_s=float(max(self.work[j] - self.prog[j], 1.0)) / rate,
            holders=None if holders is None else np.array([holders[r % len(holders)] for r in range(k)]),
            notice_s=notice_s, vram_gb_needed=float(self.jvram[j]), min_capability=float(self.jcap[j]),
            now_hour=float((t / 3600.0) % 24), index=self.index)

    def _find_set(self, j: int, k: int, t: float, holders: list[int] | None, free: np.ndarray,
                  notice_s: float | None = None) -> tuple[list[int], float] | None:
        """k nodes for job j and the restore time (slowest shard's copy + restart; 0 on a fresh start), or None."""
        if self.pol.placement == "p2":
            d = select_gang_destinations(self._request(j, k, t, holders, notice_s, free))
            if d.destinations is None:
                return None
            return list(d.destinations), (0.0 if holders is None else d.restore_s)
        ok = self._fits(j, free)
        cand = np.flatnonzero(ok)
        if cand.size < k:
            return None
        nodes = [int(x) for x in cand[:k]]
        return nodes, (0.0 if holders is None else self._restore_s(j, nodes, holders))

    def _restore_s(self, j: int, nodes: list[int], holders: list[int]) -> float:
        shard = float(self.C[j]) / len(nodes)
        copy = max(shard / float(self.index.bottleneck_from(holders[r % len(holders)], np.array([d]))[0])
                   for r, d in enumerate(nodes))
        return copy + float(self.Tr[j])

    def _occupy(self, j: int, nodes: list[int]) -> None:
        for n in nodes:
            self.free[n] -= self.G[j]
        self.members[j] = list(nodes)

    def _release(self, j: int) -> None:
        for n in self.members[j]:
            self.free[n] += self.G[j]
        self.members[j] = []

    def _shard_homes(self, j: int) -> list[int]:
        """Where to read the job's last complete checkpoint's shards from: each holder while it is lent and not
        being reclaimed, else the building peer its shard was pre-synced to."""
        return [n if self.lent[n] and not self.pending[n] else int(self.peer[n])
                for n in (self.holders[j] or self.members[j])]

    # ---- job transitions -------------------------------------------------------------------------
    def _restore(self, j: int, nodes: list[int], t: float, after_s: float) -> None:
        """Hold ``nodes``; the job runs again in ``after_s`` seconds (its save, copy and re-rendezvous)."""
        if self.members[j] != nodes:
            self._release(j)
            self._occupy(j, nodes)
        self.st[j] = RESTART
        self.size[j] = 0
        self.token[j] += 1
        self._push(t + after_s, "restore", j, int(self.token[j]))

    def _requeue(self, j: int) -> None:
        self.holders[j] = self._shard_homes(j)
        self._release(j)
        self.st[j] = QUEUED
        self.size[j] = 0
        self.token[j] += 1
        self.queue.insert(0, j)
        self.res.requeues += 1

    def _run(self, j: int, t: float) -> None:
        self.st[j] = RUNNING
        self.size[j] = len(self.members[j])
        self.pos[j] = 0.0
        self.durable[j] = self.prog[j]
        self.holders[j] = list(self.members[j])
        self._replan(t, [j])

    def _lose(self, j: int) -> None:
        """The gang stops without a final save: the work since its last complete checkpoint is lost."""
        lost = self.prog[j] - self.durable[j]
        self.res.lost_gpu_s += lost * self.M[j] * self.G[j]
        self.prog[j] = self.durable[j]

    # ---- P1 ----------------------------------------------------------------------------------------
    def _replan(self, t: float, jobs: list[int] | None = None) -> None:
        """The coordinated interval and the shard write time of each running job (design §3 "Gangs"): P1 per
        member at the gang's hazard, each node's checkpoint budget shared by the members on it, then the longest
        member plan for every member; the stall is the slowest shard's write. ``fixed``: Δ is the policy's, the
        budget split evenly among the members on a node."""
        running = np.flatnonzero(self.st == RUNNING)
        if running.size == 0:
            return
        member_job = np.array([j for j in running for _ in self.members[j]], dtype=np.int64)
        member_node = np.array([n for j in running for n in self.members[j]], dtype=np.int64)
        shard = self.C[member_job] / self.size[member_job]
        on_node = np.bincount(member_node, minlength=self.n_nodes)
        even_rate = self.node_budget[member_node] / on_node[member_node]
        if self.pol.interval == "p1":
            # λ of each member's node plus its scheduled reclaims with less notice than the coordinated save needs
            # (those lose what an emergency loses; design §2 "Estimators"), summed over the gang
            lam = (self.hz.hazard_plan_per_s(t, PLAN_HAZARD_QUANTILE)[member_node]
                   + short_notice_rate_per_s(self.hz.short_notice_rates_per_s(t)[member_node], shard / even_rate))
            plan = plan_checkpoints(
                P1Jobs.build(ids=tuple(str(x) for x in range(member_job.size)),
                             hazard_per_s=gang_hazard_per_s(lam, member_job), ckpt_bytes=shard,
                             loss_budget_s=self.Lmax[member_job], restart_s=self.Tr[member_job]),
                self.node_budget, group=member_node)
            rate = plan.bandwidth_bytes_per_s
            interval = coordinated_interval_s(plan.interval_s, member_job)
        else:
            rate = even_rate
            interval = np.full(member_job.size, self.pol.fixed_interval_s)
        write_s = shard / np.maximum(rate, MIN_RATE_BYTES_PER_S)
        stall = np.zeros(self.J)
        np.maximum.at(stall, member_job, write_s)
        delta = np.zeros(self.J)
        delta[member_job] = interval
        for j in (running if jobs is None else np.array(jobs, dtype=np.int64)):
            d_new, s_new = float(delta[j]), float(stall[j])
            if self.pos[j] >= self.delta[j]:  # mid-write: the write goes on, its rest at most a new write long
                left_s = self.delta[j] + self.stall[j] - self.pos[j]
                self.pos[j] = d_new + max(s_new - left_s, 0.0)
            elif self.pos[j] >= d_new:
                self.pos[j] = d_new  # past the new interval mid-work: the checkpoint starts now
            self.delta[j], self.stall[j] = d_new, s_new

    # ---- events ----------------------------------------------------------------------------------
    def _advance(self, dt: float) -> None:
        if dt <= 0:
            return
        held = np.array([len(m) for m in self.members], dtype=float) * self.G
        self.res.held_gpu_s += float(held.sum()) * dt
        run = np.flatnonzero(self.st == RUNNING)
        if run.size == 0:
            return
        rate = self.size[run] / self.M[run]
        d, s, p = self.delta[run], self.stall[run], self.pos[run]
        n, newp, work_wall = advance_cycles(p, d, s, dt)
        self.res.stall_gpu_s += float(((dt - work_wall) * self.size[run] * self.G[run]).sum())
        prog = np.minimum(self.prog[run] + work_wall * rate, self.work[run])
        self.prog[run] = prog
        self.pos[run] = newp
        self.durable[run] = np.where(n >= 1, prog - np.minimum(newp, d) * rate, self.durable[run])

    def _place(self, t: float) -> None:
        """FIFO with backfill (requeued jobs first): each job whole, at its full size or, elastic, at what is
        free down to its minimum."""
        keep: list[int] = []
        head_needs = np.zeros(self.n_nodes, dtype=bool)  # the nodes the first job that cannot start could use
        for j in self.queue:
            found = None
            holders = self._shard_homes(j) if self.holders[j] else None
            free = np.where(head_needs, 0.0, self.free)
            for k in range(int(self.M[j]), int(self.kmin[j]) - 1, -1):
                found = self._find_set(j, k, t, holders, free)
                if found is not None:
                    break
            if found is None:
                keep.append(j)
                if not head_needs.any():  # one reservation, as EASY backfill keeps for the queue's head
                    head_needs = self._fits(j, self.free)
                continue
            nodes, restore_s = found
            self._occupy(j, nodes)
            if holders is None:
                self._run(j, t)
            else:
                self._restore(j, nodes, t, restore_s)
        self.queue = keep

    def _fits(self, j: int, free: np.ndarray) -> np.ndarray:
        """Per node: open and able to hold one of job j's members now."""
        return self._open() & (free >= self.G[j]) & (self.vram >= self.jvram[j]) & (self.cap >= self.jcap[j])

    def _regrow_s(self, j: int, t: float, free: np.ndarray) -> float:
        """shrink_or_move's estimate of when an elastic job gets GPUs back: the next control period if a node is
        free for a member now, else the rest of its run (it may never regrow)."""
        ok = self._fits(j, free)
        if ok.any():
            return self.period_s
        rate = max(len(self.members[j]) - 1, 1) / self.M[j]
        return float(max(self.work[j] - self.prog[j], 0.0)) / rate

    def _leave(self, j: int, n: int, t: float, save_s: float, notice_s: float | None) -> None:
        """Job j loses node n (its shards durable: a final save of ``save_s`` or the last complete checkpoint):
        shrink, move whole, or wait in the queue (design §3 "Gangs", "Elastic")."""
        k = len(self.members[j])
        free = self.free.copy()
        for m in self.members[j]:
            free[m] += self.G[j]  # its own nodes count as free for the set it moves to
        free[n] = 0.0
        homes = self._shard_homes(j) if save_s == 0 else list(self.members[j])
        move = self._find_set(j, k, t, homes, free, notice_s)
        if self.pol.elastic and self.kmin[j] < self.M[j]:
            choice = shrink_or_move(
                gpus_now=int(k * self.G[j]), gpus_reclaimed=int(self.G[j]), min_gpus=int(self.kmin[j] * self.G[j]),
                checkpoint_s=save_s, restart_s=float(self.Tr[j]),
                move_transfer_s=None if move is None else max(move[1] - float(self.Tr[j]), 0.0),
                regrow_s=self._regrow_s(j, t, free))
            self.res.reasons.append(choice.reason)
            if choice.action == "shrink":
                self.res.shrinks += 1
                self.free[n] += self.G[j]
                self.members[j] = [m for m in self.members[j] if m != n]
                # the shards re-partition over the members left (the lost rank's read from where it lies)
                self._restore(j, self.members[j], t, save_s + self._restore_s(j, self.members[j], homes))
                return
        if move is None:
            if save_s > 0:  # the save runs to its end on the members, then the job waits in the queue
                self.st[j] = RESTART
                self.size[j] = 0
                self.token[j] += 1
                self._push(t + save_s, "requeue", j, int(self.token[j]))
            else:
                self._requeue(j)
            return
        nodes, restore_s = move
        if save_s > 0:
            self.res.moves += 1
        else:
            self.res.restores += 1
        self._restore(j, nodes, t, save_s + restore_s)

    def _final_save_s(self, j: int) -> float:
        """The coordinated final save on a notice: every rank writes its shard at the link its node has outside
        research's reserve, (1 − β)·B⁻, shared with the other members on that node (P1's final-checkpoint test,
        design §2; the engine's ``_final_fits``); the save ends with the slowest shard."""
        on_node = np.zeros(self.n_nodes)
        for m in np.flatnonzero(self.st == RUNNING):
            for n in self.members[m]:
                on_node[n] += 1
        shard = float(self.C[j]) / len(self.members[j])
        return max(shard * on_node[n] / ((1.0 - RESERVE_FRACTION) * float(self.available[self.access[n]]))
                   for n in self.members[j])

    def _on_notice(self, k: int, t: float) -> None:
        n, tau = int(self.rc_node[k]), float(self.rc_notice[k])
        if not self.lent[n]:
            return
        self.pending[n] = True
        if tau > 0:
            self.hz.record_scheduled(n, t, tau)
        if tau <= 0 or self.pol.on_reclaim != "move":
            return
        for j in [j for j in range(self.J) if n in self.members[j] and self.st[j] == RUNNING]:
            save_s = self._final_save_s(j)
            if save_s > tau:
                continue  # the coordinated save cannot finish in the notice: the deadline is an emergency
            self.res.interruptions += 1
            self.durable[j] = self.prog[j]
            self.holders[j] = list(self.members[j])
            self._leave(j, n, t, save_s, tau - save_s)

    def _on_deadline(self, k: int, t: float) -> None:
        n = int(self.rc_node[k])
        if not self.lent[n]:
            return
        self.lent[n] = False
        self.pending[n] = True
        if self.rc_notice[k] == 0:
            self.hz.record_departure(n, t)
        for j in [j for j in range(self.J) if n in self.members[j]]:
            if self.st[j] == RUNNING:
                self.res.interruptions += 1
                self._lose(j)
                if self.pol.on_reclaim == "move":
                    self._leave(j, n, t, 0.0, None)
                else:
                    self._requeue(j)
            else:  # restoring onto n (its shards are durable): try again elsewhere
                self._requeue(j)
                self.res.requeues -= 1  # not an interruption of running work

    def _on_return(self, k: int, t: float) -> None:
        n = int(self.rc_node[k])
        self.lent[n] = True
        self.pending[n] = False

    def _grow(self, t: float) -> None:
        """Offer free GPUs to running elastic jobs below their maximum (design §3 "Elastic"), never those the
        first queued job needs: growth takes only nodes beyond what that job could start on."""
        if not self.pol.elastic:
            return
        free = self.free.copy()
        if self.queue:
            free[self._fits(self.queue[0], free)] = 0.0  # the nodes the queue's head could use stay its own
        for j in np.flatnonzero((self.st == RUNNING) & (self.size < self.M)):
            j = int(j)
            k = len(self.members[j])
            others = free.copy()
            others[self.members[j]] = 0.0  # one member per node
            extra, rest = int(self.M[j]) - k, None
            while rest is None and extra >= 1:
                rest = self._find_set(j, extra, t, None, others)
                extra -= 1
            if rest is None:
                continue
            nodes = rest[0]
            remaining_s = float(self.work[j] - self.prog[j]) * self.M[j] / k
            after = k + len(nodes)
            copy_s = self._restore_s(j, [*self.members[j], *nodes], self.members[j]) - float(self.Tr[j])
            if not grow_pays(remaining_s=remaining_s, gpus_now=int(k * self.G[j]), gpus_after=int(after * self.G[j]),
                             checkpoint_s=float(self.stall[j]) + copy_s, restart_s=float(self.Tr[j])):
                continue
            self.res.grows += 1
            self.durable[j] = self.prog[j]  # it saves, then re-rendezvouses at the new size
            for m in nodes:
                free[m] -= self.G[j]
            self._restore(j, [*self.members[j], *nodes], t, float(self.stall[j]) + copy_s + float(self.Tr[j]))

    def _on_epoch(self, t: float) -> None:
        if t > 0:
            self.hz.add_exposure(t - self.period_s, t, self.lent.copy())
        self.profile = None
        self._replan(t)

    # ---- main loop -------------------------------------------------------------------------------
    def run(self) -> GangResult:
        self._init_state()
        horizon = self.tr.horizon_s
        t = 0.0
        while True:
            t_heap = self.heap[0][0] if self.heap else np.inf
            run = np.flatnonzero(self.st == RUNNING)
            t_fin, finishing = np.inf, np.zeros(0, dtype=np.int64)
            if run.size:
                rate = self.size[run] / self.M[run]
                ttf = time_to_finish(self.pos[run], self.delta[run], self.stall[run],
                                     np.maximum(self.work[run] - self.prog[run], 0.0) / rate)
                t_fin = t + float(ttf.min())
                finishing = run[ttf <= ttf.min() + 1e-6]
            t_next = min(t_heap, t_fin, horizon)
            self._advance(t_next - t)
            t = t_next
            if t >= horizon:
                break
            if t_fin <= t_heap:
                for j in finishing.tolist():
                    self._finish(j)
            while self.heap and self.heap[0][0] <= t:  # every event at t before the queue is looked at
                _, _, _, kind, arg, token = heapq.heappop(self.heap)
                self._dispatch(kind, arg, token, t)
            # after everything that happened at t: queued jobs first, then growth into what they leave
            self._place(t)
            self._grow(t)
        self.res.useful_gpu_s = float(np.sum(self.prog * self.M * self.G))
        return self.res

    def _finish(self, j: int) -> None:
        self.st[j] = DONE
        self.prog[j] = self.work[j]
        self._release(j)
        self.size[j] = 0
        self.res.jobs_done += 1

    def _dispatch(self, kind: str, arg: int, token: int, t: float) -> None:
        if kind == "epoch":
            self._on_epoch(t)
        elif kind == "submit":
            self.st[arg] = QUEUED
            self.queue.append(arg)
        elif kind == "notice":
            self._on_notice(arg, t)
        elif kind == "deadline":
            self._on_deadline(arg, t)
        elif kind == "return":
            self._on_return(arg, t)
        elif kind == "restore" and self.st[arg] == RESTART and token == self.token[arg]:
            self._run(arg, t)
        elif kind == "requeue" and self.st[arg] == RESTART and token == self.token[arg]:
            self._requeue(arg)


def simulate_gangs(trace: Trace, policy: str | GangPolicy, period_s: float = 600.0,
                   calibration: Trace | None = None) -> GangResult:
    """Run one policy (a `GANG_POLICIES` name or a GangPolicy) on a trace with gangs and elastic ranges;
    ``calibration``: the trace the estimator's prior is read from (default: the evaluated one)."""
    pol = GANG_POLICIES[policy] if isinstance(policy, str) else policy
    return GangSimulator(trace, pol, period_s=period_s, calibration=calibration).run()


def gang_campus(seed: int = 1, *, days: float = 7.0, hazard_x: float = 4.0, load: float = 0.6,
                gang_share: float = 0.35, elastic_share: float = 0.25) -> Trace:
    """The campus with gangs and elastic jobs (design §21.6): design §6's 54 nodes, links and reclaims over
    ``days`` with lending windows ``hazard_x`` times shorter (`scheduler.sim.tracegen.scaled_config`), and a job
    mix of single-node jobs, rigid gangs of 2-4 members (``gang_share``) and elastic jobs of 1 to 2-4 members
    (``elastic_share``), one GPU per member (two for a fifth of the gangs), sized to ``load`` of the lent
    GPU-time. Deterministic for a seed."""
    from scheduler.sim.tracegen import generate, scaled_config

    cfg = scaled_config(hazard_x, days, seed)
    base = generate(cfg)
    rng = np.random.default_rng([seed, 36])
    lent_share = cfg.lent_mean_h / (cfg.lent_mean_h + cfg.owner_mean_h)
    lent_gpu_h = float(np.sum(base.tables["nodes"]["gpus"])) * days * 24.0 * lent_share
    pool = 4000
    kind = rng.choice(3, size=pool, p=[1.0 - gang_share - elastic_share, gang_share, elastic_share])
    members = np.where(kind == 0, 1, rng.integers(2, 5, size=pool))
    low = np.where(kind == 2, 1, members)
    gpus = np.where((kind == 1) & (rng.random(pool) < 0.2), 2, 1)
    work = np.clip(rng.lognormal(np.log(4 * 3600.0), 0.7, pool), 1800.0, 3 * 86400.0)
    n = max(4, round(load * lent_gpu_h * 3600.0 / float(np.mean(work * members * gpus))))
    horizon = days * 86400.0
    ckpt = np.clip(rng.lognormal(np.log(3.2e9), 0.9, n), 120e6, 48e9)
    jobs = {"id": np.array([f"g{i:03d}" for i in range(n)], dtype=object),
            "submit_s": np.sort(rng.uniform(0.0, 0.85 * horizon, n)), "gpus": gpus[:n].astype(float),
            "vram_gb": np.full(n, 8.0), "min_capability": np.full(n, 7.0), "work_s": work[:n],
            "ckpt_bytes": ckpt, "restart_s": 20.0 + ckpt / 1e9 * 2.0, "loss_budget_s": np.full(n, 1800.0),
            "members": members[:n].astype(float), "min_members": low[:n].astype(float)}
    from dataclasses import replace

    from scheduler.sim.trace import validate

    tr = replace(base, tables={**base.tables, "jobs": jobs}, meta={"campus": "gangs", "seed": seed, "days": days,
                                                                   "hazard_x": hazard_x, "load": load})
    validate(tr)
    return tr
