"""Placement and destinations of the simulator (design §3 P2, §16.5 the fair queue): a mixin of `Simulator`.

`_try_place` places queued jobs FIFO with backfill (first fit, a random node, or the oracle's future-aware pick),
or, under the fair queue, by one pass of `scheduler.queue.schedule`; `_choose_dest` picks a migration's
destination with the production P2 (`scheduler.p2.select_destination`) or the policy's baseline rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scheduler import queue as fairq
from scheduler.p2 import P2Request, select_destination
from scheduler.sim.states import MOVING, RESTART, RUNNING


class PlacementMixin:
    """`_feasible`, `_choose_dest`, `_try_place` (and its fair-queue pass) for `Simulator`."""

    # attributes and methods provided by Simulator
    pol: Any
    rng: np.random.Generator
    queue: list[int]

    def _feasible(self, j: int, exclude: int = -1) -> np.ndarray:
        ok = (self.lent & ~self.pending & (self.free >= self.jg[j]) & (self.vram >= self.jvram[j])
              & (self.cap >= self.jcap[j]))
        if exclude >= 0:
            ok[exclude] = False
        return np.flatnonzero(ok)

    def _next_reclaim(self, n: int, t: float) -> float:
        fut = self.future[n]
        k = np.searchsorted(fut, t, side="right")
        return float(fut[k]) if k < len(fut) else np.inf

    def _oracle_pick(self, j: int, cand: np.ndarray, t: float, src: int) -> int:
        """Future-aware choice: the node reclaimed last (ideally never before the job ends), then fastest."""
        if cand.size == 0:
            return -1
        nxt = np.array([self._next_reclaim(int(c), t) for c in cand])
        finish = t + (self.work[j] - self.prog[j]) + self.Tr[j]
        key = np.minimum(nxt, finish + 1.0)
        best = cand[key == key.max()]
        if src >= 0 and best.size > 1:
            bw = np.array([self._path_bw(src, int(c), self.B) for c in best])
            best = best[bw == bw.max()]
        return int(best[0])

    def _path_bw(self, a: int, b: int, link_bw: np.ndarray) -> float:
        p = self.path(a, b)
        return float(np.min(link_bw[p])) if p.size else np.inf

    def _choose_dest(self, j: int, src: int, holder: int, t: float, notice_s: float | None) -> int:
        pol = self.pol
        cand = self._feasible(j, exclude=src)
        if pol.destination == "oracle":
            return self._oracle_pick(j, cand, t, holder)
        if cand.size == 0:
            return -1
        if pol.destination == "first_fit":
            return int(cand[0])
        if pol.destination == "random":
            return int(self.rng.choice(cand))
        free = np.where(self.lent & ~self.pending, self.free, 0.0)
        req = P2Request(tree=self.tree, link_bytes_per_s=self.Bminus, building=self.building, free_gpus=free,
                        vram_gb=self.vram, capability=self.cap,
                        hazard_per_s_by_hour=self._profile(), compatible=None, source=src,
                        ckpt_holder=holder, ckpt_bytes=float(self.C[j]), restart_s=float(self.Tr[j]),
                        notice_s=notice_s, remaining_s=float(max(self.work[j] - self.prog[j], 1.0)),
                        gpus=int(self.jg[j]), vram_gb_needed=float(self.jvram[j]),
                        min_capability=float(self.jcap[j]), now_hour=float((t / 3600.0) % 24))
        dec = select_destination(req)
        return -1 if dec.destination is None else int(dec.destination)

    def _try_place(self, t: float) -> None:
        """FIFO with backfill over queued jobs (requeued ones first); first fit, or the oracle's pick.
        With the fair queue (``policy.queue == "fair"``) the queue core decides instead (design §16.5)."""
        if not self.queue:
            return
        if self.pol.queue == "fair":
            self._try_place_fair(t)
            return
        keep = []
        changed = False
        for j in self.queue:
            cand = self._feasible(j)
            if cand.size == 0:
                keep.append(j)
                continue
            if self.pol.destination == "oracle":
                n = self._oracle_pick(j, cand, t, int(self.holder[j]))
            elif self.need_xfer[j] and self.pol.destination == "random":
                n = int(self.rng.choice(cand))
            else:
                n = int(cand[0])
            self._occupy(j, n)
            changed = True
            if self.need_xfer[j] and self.pol.interval != "oracle":
                self._start_flow(j, int(self.holder[j]), n, t, "recovery", np.inf)
            elif self.need_xfer[j]:
                self._start_restart(j, n, t)
            else:
                self.first_start[j] = t
                self._start_running(j, n, t)
        self.queue = keep
        if changed:
            self._admit(t)

    def _try_place_fair(self, t: float) -> None:
        """One pass of ``scheduler.queue.schedule`` over the queued jobs: priority from the groups' decayed usage
        and the jobs' age, quotas from the groups table, EASY backfill on whole nodes; over-quota jobs it
        preempts are checkpointed and requeued (no work lost) and the pass runs again (design §16.5)."""
        for _ in range(2):
            open_now = self.lent & ~self.pending
            free = np.where(open_now, self.free, 0.0).astype(np.int64)
            waiting = np.array(self.queue, dtype=np.int64)
            occ = np.flatnonzero((self.node >= 0) & np.isin(self.st, (RUNNING, RESTART, MOVING)))
            if free.max(initial=0) < self.jg[waiting].min() and not self.preemptible[occ].any():
                return  # nothing queued fits anywhere now: no pass needed
            remaining = np.maximum(self.work - self.prog, 0.0)
            ends = remaining[occ] + np.where(self.st[occ] == RUNNING, 0.0, self.Tr[occ])
            run = np.flatnonzero(self.st[occ] == RUNNING)
            if run.size:
                ends[run] = self._time_to_finish(occ[run])
            w = self.pol.queue_weights
            usage_share = fairq.fair_share_factors(self.usage_decayed, self.group_share)
            prio = fairq.priorities(np.full(waiting.size, fairq.CLASS_TERMS["standard"]),
                                    usage_share[self.job_group[waiting]], t - self.submit[waiting], w)
            quotas = None
            if self.has_quotas:
                cum = self.res_t.group_gpu_s
                past = self.res_t.group_gpu_s_at_epoch
                k = int((t - fairq.QUOTA_WINDOW_S) // self.period_s)
                used = cum - past[k] if 0 <= k < len(past) else cum.copy()
                quotas = fairq.Quotas(group_max_gpus=self.group_max_gpus,
                                      group_max_gpu_s_30d=self.group_max_gpu_s_30d, group_used_gpu_s_30d=used)
            d = fairq.schedule(
                fairq.QueueNodes(gpus=self.gpus.astype(np.int64), free_gpus=free,
                                 available_from_s=np.where(open_now, 0.0, np.inf)),
                fairq.QueueRunning(node=self.node[occ], gpus=self.jg[occ].astype(np.int64), ends_in_s=ends,
                                   started_ago_s=t - np.nan_to_num(self.first_start[occ], nan=t),
                                   group=self.job_group[occ], preemptible=self.preemptible[occ]),
                fairq.QueueWaiting(priority=prio.value, gpus=self.jg[waiting].astype(np.int64),
                                   runtime_s=remaining[waiting] + self.Tr[waiting],
                                   feasible=(self.vram[None, :] >= self.jvram[waiting, None])
                                   & (self.cap[None, :] >= self.jcap[waiting, None]),
                                   group=self.job_group[waiting]),
                quotas, estimate=False)
            started = np.flatnonzero(d.start_node >= 0)
            for i in started.tolist():
                j, n = int(waiting[i]), int(d.start_node[i])
                self.preemptible[j] = bool(d.over_quota[i])
                self._occupy(j, n)
                if self.need_xfer[j]:
                    self._start_flow(j, int(self.holder[j]), n, t, "recovery", np.inf)
                else:
                    if np.isnan(self.first_start[j]):
                        self.first_start[j] = t
                    self._start_running(j, n, t)
            taken = set(waiting[started].tolist())
            self.queue = [j for j in self.queue if j not in taken]
            for i in d.preempt.tolist():
                self._preempt(int(occ[i]), t)
            if started.size or d.preempt.size:
                self._admit(t)
            if not d.preempt.size:
                return

