"""Control-period planning and link shares of the simulator (design §2 P1, §4 P3): a mixin of `Simulator`.

P1 plans every running job's checkpoint interval Δ_i and guaranteed pre-sync rate b_i against the node's
checkpoint budget B_ckpt = (1 - β)·B⁻ - admitted planned migrations (design §4: the link capacity less the
research reserve less AF41; β per link, calibrated daily: design §4.1) — with the work-conserving reserve (design
§4.2, `Policy.reserve_borrow`, the default under P3) B⁻ − min(R, β·B⁻) − AF41 by
`scheduler.reserve.checkpoint_ceil_bytes_per_s`, R the research rate of the current control period: the idle part
of the reserve is lent to checkpoints and handed back at the next period research uses it. P1 plans at that bound;
the writers' HTB ceil is the agent's (the line, less the reserve research uses), so on the true link a write may
run faster than planned, never into research's used reserve or admitted migrations. P3 admits planned migrations,
and `_rates` turns both into actual rates
(`scheduler.sim.network.allocate`): a checkpoint stall lasts C / (its actual rate) under every policy — or,
with asynchronous snapshots (`Policy.ckpt_mode == "async"`, design §2 "Asynchronous snapshots"), only
stall_fraction of it: the copy of C at that rate (`xfer`) then runs in the background while the job works,
P1 plans with the stall and the copy time, and no interval is shorter than the copy (a snapshot waits for the
previous copy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scheduler.estimators import short_notice_rate_per_s
from scheduler.p1 import MIN_INTERVAL_S, P1Jobs, optimal_interval_s, plan_checkpoints
from scheduler.p3 import P3Flows, admit_flows_on_paths
from scheduler.reserve import checkpoint_ceil_bytes_per_s
from scheduler.sim.network import LINE_RATE_BYTES_PER_S, allocate
from scheduler.sim.states import RUNNING

LOCAL_WRITE_BYTES_PER_S = 1e9  # local NVMe write speed W (no-migration checkpoints never leave the node)
MIN_RATE_BYTES_PER_S = 1e5
P1_BETA = 0.2  # design §2 Eq. 9 β
P1_MIN_INTERVAL_S = MIN_INTERVAL_S  # design §2 Δ_min: the portal's default floor
# static-budget is "Lemma 1 at trace-wide means, clipped by Eq. 9" (design §21.1): the paper's floor as printed,
# not ReclaimNet's hazard-aware one (design §2 Eq. 9), so the rival stays what its name says
P1_RIVAL_OVERHEAD_FLOOR = "eq9"


class ControlMixin:
    """`_replan` (P1), `_remap`, `_rates` (link shares), `_admit` (P3), `_final_fits` for `Simulator`."""

    # attributes provided by Simulator
    pol: Any
    st: np.ndarray
    reserve_fraction: np.ndarray  # per link: research's reserve as a share of the link (design §4.1)

    # ---- interval / bandwidth planning (P1) ------------------------------------------------------
    def _replan(self, t: float, idx: np.ndarray | None = None) -> None:
        """Per-control-period P1 plan for running jobs (design §2), then remap their cycle positions."""
        if idx is None:
            idx = np.flatnonzero(self.st == RUNNING)
        if idx.size == 0:
            return
        pol = self.pol
        nodes = self.node[idx]
        if pol.interval == "oracle":
            self._remap(idx, np.full(idx.size, np.inf), np.zeros(idx.size))
            return
        if pol.interval == "local":
            b = np.full(idx.size, LOCAL_WRITE_BYTES_PER_S)
            lam = np.maximum(self.lam_up[nodes], 1e-12)
            jobs = P1Jobs.build(tuple(self.job_ids[j] for j in idx), lam, self.C[idx], cap_bytes_per_s=b,
                                loss_budget_s=self.Lmax[idx] * pol.loss_budget_scale, restart_s=self.Tr[idx],
                                **self._async_inputs(idx, self.C[idx] / b))
            plan = plan_checkpoints(jobs, float(np.sum(b)) + 1.0, beta=P1_BETA, min_interval_s=P1_MIN_INTERVAL_S)
            self.bplan[idx] = b
            self._remap_write(idx, plan.interval_s, self.C[idx] / b)
            return
        # node budget B_ckpt: the access link's capacity (lower bound B⁻) less the research reserve less
        # admitted planned migrations (design §4 "Pre-sync uses what planned migrations leave")
        af = np.zeros(self.n_links)
        for f in self.flows:
            if not np.isnan(f["shaped"]):
                af[f["links"]] += f["shaped"]
        informed = pol.interval == "informed"  # P1 fed the true λ(t) and link bandwidth
        cap = self.B if informed else self.Bcap
        budget_node = np.maximum(self._ckpt_ceil(cap) - af, MIN_RATE_BYTES_PER_S)[self.access]
        sure_node = np.maximum((1 - self.reserve_fraction) * cap - af, MIN_RATE_BYTES_PER_S)[self.access]
        lam = None  # P1's hazard, where this policy's plan reads it
        if self._plans_at_hazard():
            lam = np.maximum(self.lam_up[nodes], 1e-12)
            if self.sched_rates is not None and not informed:
                lam = lam + self._short_notice_hazard(idx)
            if informed and self.lam_true is not None:
                lam = np.full(idx.size, max(self.lam_now, 1e-12))
        if pol.bandwidth_split == "p1":
            jobs = P1Jobs.build(tuple(self.job_ids[j] for j in idx), lam, self.C[idx],
                                loss_budget_s=self.Lmax[idx] * pol.loss_budget_scale, restart_s=self.Tr[idx],
                                **self._async_inputs(idx, self.xfer[idx]))
            plan = plan_checkpoints(jobs, budget_node, beta=P1_BETA, group=nodes, min_interval_s=P1_MIN_INTERVAL_S,
                                    guaranteed_budget_bytes_per_s=np.minimum(sure_node, budget_node))
            b, interval = plan.bandwidth_bytes_per_s, plan.interval_s
        else:
            cnt = np.bincount(nodes, minlength=self.n_nodes)
            b = budget_node[nodes] / cnt[nodes]
            interval = np.full(idx.size, np.nan)
        b = np.maximum(b, MIN_RATE_BYTES_PER_S)
        if lam is not None:
            interval = np.where(np.isnan(interval), optimal_interval_s(lam, self.C[idx], b), interval)
        if pol.interval == "fixed":
            interval = np.full(idx.size, pol.fixed_interval_s)
        elif pol.interval == "static":
            interval = optimal_interval_s(np.full(idx.size, self.mean_hazard_per_s), self.C[idx],
                                          np.full(idx.size, self.mean_bw_bytes_per_s))
        elif pol.interval == "static-budget":  # Lemma 1 at trace-wide means, clipped by Eq. 9
            jobs = P1Jobs.build(tuple(self.job_ids[j] for j in idx), np.full(idx.size, self.mean_hazard_per_s),
                                self.C[idx], loss_budget_s=self.Lmax[idx] * pol.loss_budget_scale,
                                restart_s=self.Tr[idx])
            interval = plan_checkpoints(jobs, np.full(idx.size, self.mean_bw_bytes_per_s), beta=P1_BETA,
                                        group=np.arange(idx.size), min_interval_s=P1_MIN_INTERVAL_S,
                                        overhead_floor=P1_RIVAL_OVERHEAD_FLOOR).interval_s
        elif pol.interval == "truth":  # Lemma 1 at the true λ(t) and the true available bandwidth
            lam_t = self.lam_now if self.lam_true is not None else self.mean_hazard_per_s
            b_true = np.maximum(self.B - self.R, MIN_RATE_BYTES_PER_S)[self.access[nodes]]
            interval = optimal_interval_s(np.full(idx.size, max(lam_t, 1e-12)), self.C[idx],
                                          np.minimum(b_true, LINE_RATE_BYTES_PER_S))
        elif pol.interval == "tv":
            h = int((t / 3600.0) % 24)
            interval = optimal_interval_s(np.full(idx.size, self.tv_hazard[h]), self.C[idx],
                                          np.full(idx.size, self.tv_bw[h]))
        p3 = pol.traffic == "p3"
        self.bplan[idx] = b if p3 else LINE_RATE_BYTES_PER_S
        # the writers' HTB ceil: with the work-conserving reserve the agent's (§4.2: the line less the reserve research
        # uses, which `allocate` takes off the true link with admitted migrations), else P1's budget (ceil = rate)
        self.wceil[idx] = budget_node[nodes] if p3 and not pol.reserve_borrow else LINE_RATE_BYTES_PER_S
        self.ckpt_budget[idx] = budget_node[nodes] if p3 else np.nan
        if pol.ckpt_mode == "async":
            self._remap_write(idx, interval, self.xfer[idx])
        else:
            self._remap(idx, interval, self.s[idx])

    def _plans_at_hazard(self) -> bool:
        """Whether `_replan`'s network rule reads P1's hazard λ (and so the short-notice rates): the p1 split or an
        interval rule that reads it. The oracle and local rules have their own; the fixed, static, static-budget,
        truth and tv intervals with an equal split replace whatever λ would give."""
        pol = self.pol
        if pol.interval in ("oracle", "local"):
            return False
        return pol.bandwidth_split == "p1" or pol.interval not in ("fixed", "static", "static-budget", "truth", "tv")

    def _short_notice_hazard(self, idx: np.ndarray) -> np.ndarray:
        """design §2 "Estimators": per job, the rate of scheduled reclaims on its node whose notice is shorter than
        its final checkpoint needs, C/b + T_r at the rate `_final_fits` tests with ((1 − β)·B⁻ of the access
        link): such a reclaim loses what an emergency loses, so P1 adds it to λ."""
        nodes = self.node[idx]
        b = np.maximum(self.Bcap[self.access[nodes]] * (1 - self.reserve_fraction[self.access[nodes]]),
                       MIN_RATE_BYTES_PER_S)
        return short_notice_rate_per_s(self.sched_rates[nodes], self.C[idx] / b + self.Tr[idx])

    def _ckpt_ceil(self, cap: np.ndarray) -> np.ndarray:
        """Per link, the checkpoint class's ceiling before admitted migrations: (1 − β)·cap with a fixed reserve;
        with the work-conserving reserve (design §4.2, `Policy.reserve_borrow`, P3 traffic only) the rule of
        `scheduler.reserve`: cap − min(R, β·cap), R the research rate measured this control period."""
        if not (self.pol.reserve_borrow and self.pol.traffic == "p3"):
            return (1 - self.reserve_fraction) * cap
        return np.asarray(checkpoint_ceil_bytes_per_s(cap, self.reserve_fraction * cap, self.R), dtype=float)

    # ---- asynchronous snapshots (design §2 "Asynchronous snapshots") -----------------------------------------
    def _async_inputs(self, idx: np.ndarray, write_s: np.ndarray) -> dict[str, np.ndarray]:
        """P1's optional inputs for these jobs: their stall and the measured copy time (none when synchronous)."""
        if self.pol.ckpt_mode != "async":
            return {}
        return {"stall_s": self.pol.stall_fraction * write_s, "transfer_s": write_s}

    def _remap_write(self, idx: np.ndarray, new_delta: np.ndarray, write_s: np.ndarray) -> None:
        """`_remap` with a checkpoint whose copy takes ``write_s``: synchronous, the stall is the copy; async, the
        stall is stall_fraction of it, the copy runs in the background (``xfer``) and Δ ≥ the copy."""
        if self.pol.ckpt_mode != "async":
            self._remap(idx, new_delta, write_s)
            return
        self.xfer[idx] = write_s
        self._remap(idx, np.maximum(new_delta, write_s), self.pol.stall_fraction * write_s)

    def _remap(self, idx: np.ndarray, new_delta: np.ndarray, new_s: np.ndarray) -> None:
        """Carry a job's cycle position across a change of Δ or write time (see module docstring)."""
        d, s, p = self.delta[idx], self.s[idx], self.pos[idx]
        writing = p >= d
        with np.errstate(invalid="ignore", divide="ignore"):
            frac_done = np.where(writing & (s > 0), (p - d) / np.where(s > 0, s, 1.0), 0.0)
            p_write = new_delta + np.clip(frac_done, 0.0, 1.0) * new_s
            p_work = np.where(p >= new_delta, new_delta, p)
        self.pos[idx] = np.where(writing, p_write, p_work)
        self.delta[idx] = new_delta
        self.s[idx] = new_s

    # ---- network ---------------------------------------------------------------------------------
    def _rates(self) -> None:
        """Recompute link shares after any change; writers' stall times follow their actual rate. The shares are
        a function of their inputs only, so an event that changed none of them (most reclaims of idle nodes)
        reuses the last ones."""
        run = np.flatnonzero(self.st == RUNNING)
        net_writers = run if self.pol.interval not in ("oracle", "local") else run[:0]
        flows = self.flows
        shaped = np.array([f["shaped"] for f in flows]) if flows else np.zeros(0)
        duty = np.zeros(net_writers.size)
        is_async = self.pol.ckpt_mode == "async"
        if net_writers.size:
            dd, ss = self.delta[net_writers], self.s[net_writers]
            on_link = self.xfer[net_writers] if is_async else ss  # async: the copy, not the stall, uses the link
            duty = np.where(np.isfinite(dd), on_link / (dd + ss), 0.0)
        w_link, w_plan, w_ceil = self.access[self.node[net_writers]], self.bplan[net_writers], self.wceil[net_writers]
        # a flow's links never change: its id stands for them
        key = (self.B.tobytes(), self.R.tobytes(), tuple(f["id"] for f in flows), shaped.tobytes(), w_link.tobytes(),
               w_plan.tobytes(), duty.tobytes(), w_ceil.tobytes(), self.reserve_fraction.tobytes())
        if key != self._rates_key:
            use = allocate(self.pol.traffic, self.B, self.R, [f["links"] for f in flows], shaped, w_link, w_plan,
                           duty, w_ceil, self.reserve_fraction, flow_borrow=self.pol.reserve_borrow)
            self.use, self._rates_key = use, key
            # research not served and research demand per second while these shares hold (`_advance` accrues them)
            self.research_rates = (float((use.active * use.deficit_bytes_per_s).sum()),
                                   float((use.active * np.minimum(self.R, self.B)).sum()))
        if net_writers.size:
            b = np.maximum(self.use.writer_rate_bytes_per_s, MIN_RATE_BYTES_PER_S)
            new_s = self.C[net_writers] / b
            ch = np.abs(new_s - (self.xfer if is_async else self.s)[net_writers]) > 1e-9 * np.maximum(new_s, 1.0)
            if ch.any():
                w = net_writers[ch]
                self._remap_write(w, self.delta[w], new_s[ch])

    def _admit(self, t: float) -> None:
        """P3 (design §4) over all planned flows still inside their notice window; others ride CS1."""
        planned = [k for k, f in enumerate(self.flows) if f["kind"] in ("planned", "drain") and f["deadline"] > t]
        for f in self.flows:
            f["shaped"] = np.nan
        if self.pol.traffic != "p3" or not planned:
            return
        fl = [self.flows[k] for k in planned]
        flows = P3Flows(ids=tuple(f"f{f['id']}" for f in fl), bytes=np.array([f["left"] for f in fl]),
                        notice_s=np.array([f["deadline"] - t for f in fl]),
                        restart_s=np.array([self.Tr[f["job"]] for f in fl]),
                        cap_bytes_per_s=np.full(len(fl), LINE_RATE_BYTES_PER_S))
        dec = admit_flows_on_paths(flows, self.Bcap, [f["links"] for f in fl],
                                   reserve_fraction=self.reserve_fraction)
        for k, f in enumerate(fl):
            if dec.admitted[k]:
                f["shaped"] = float(dec.rate_bytes_per_s[k])

    def _final_fits(self, j: int, n: int, tau: float, restart_s: float) -> bool:
        """P1's final-checkpoint test C/b + T_r <= τ at P3's migration budget (1 - β)·B⁻ of the access link
        (static: at the trace-mean available bandwidth)."""
        if self.pol.interval in ("p1", "fixed", "tv", "truth", "informed"):
            link = self.access[n]
            b = self.Bcap[link] * (1 - self.reserve_fraction[link])
            jobs = P1Jobs.build((self.job_ids[j],), np.array([1e-6]), self.C[j:j + 1],
                                notice_s=np.array([tau]), restart_s=np.array([restart_s]))
            return bool(plan_checkpoints(jobs, b, beta=P1_BETA, min_interval_s=P1_MIN_INTERVAL_S).final_checkpoint[0])
        return bool(self.C[j] / max(self.mean_bw_bytes_per_s, 1.0) + restart_s <= tau)
