"""Discrete-event campus simulator driving the production P1/P2/P3 code (design §2-§4).

Time advances from event to event (submissions, reclaim notices and deadlines, node returns, transfer and
restart completions, job completions) and at every control period (default 600 s: bandwidth samples,
estimator updates, P1 re-plan, P3 re-admission). Between events everything is analytic: a running job
alternates Δ seconds of work with a C/b checkpoint stall (the job does not compute while writing; the
checkpoint is durable — pre-synced off the node — when the write ends), so progress, durable progress
and stall time over any interval follow in closed form, vectorised over jobs. Loss on a reclaim is the
progress since the last durable checkpoint. Deterministic for a seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from scheduler.estimators import DAY_S
from scheduler.reserve import RESERVE_WINDOW_S, calibrate_reserve_bytes_per_s
from scheduler.sim.control import LOCAL_WRITE_BYTES_PER_S, MIN_RATE_BYTES_PER_S, ControlMixin
from scheduler.sim.cycles import advance_cycles, async_durable, risk_integral, time_to_finish
from scheduler.sim.network import LINE_RATE_BYTES_PER_S, RESERVE_FRACTION
from scheduler.sim.placement import PlacementMixin
from scheduler.sim.policies import Policy
from scheduler.sim.states import (
    DONE,
    FUTURE,
    MOVING,
    QUEUED,
    RESTART,
    RUNNING,
    WAITNODE,
)
from scheduler.sim.trace import Trace, TraceError, gang_columns
from scheduler.topology import CampusTree

BIG_S = 1e18


@dataclass
class Interruption:
    """One reclaim hitting one job: what it lost and when/where it resumed."""

    job: int
    t_stop_s: float
    lost_s: float
    budget_s: float
    source: int
    emergency: bool
    t_resume_s: float = float("nan")
    dest: int = -1


@dataclass
class SimResult:
    """Raw accumulators of one run; `scheduler.sim.metrics.summarise` turns them into design §7 numbers."""

    policy: str
    lost_gpu_s: float = 0.0
    overhead_gpu_s: float = 0.0
    useful_gpu_s: float = 0.0
    resident_gpu_s: float = 0.0
    jobs_done: int = 0
    n_jobs: int = 0
    interruptions: list[Interruption] = field(default_factory=list)
    research_deficit_bytes: float = 0.0
    research_demand_bytes: float = 0.0
    hazard_t_s: list[float] = field(default_factory=list)
    hazard_est_per_s: list[float] = field(default_factory=list)
    hazard_true_per_s: list[float] = field(default_factory=list)
    epoch_lambda_per_s: list[float] = field(default_factory=list)
    epoch_bw_bytes_per_s: list[float] = field(default_factory=list)
    migration_bytes: float = 0.0
    running_gpu_s: float = 0.0
    reserve_fraction: float = 0.3  # P3's research reserve β this run used
    budget_bound_gpu_s: float = 0.0  # running GPU-time with a finite Δ ≥ 2·L_max (Eq. 9's upper bound reached or passed)
    expected_lost_gpu_s: float = 0.0  # ∫ λ_true(t)·(work at risk) dt: the loss's conditional expectation
    # the queue (design §16.5): groups, GPU-seconds each received (running), per-job waits
    group_ids: tuple[str, ...] = ()
    group_share: np.ndarray = field(default_factory=lambda: np.zeros(0))
    group_gpu_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    group_gpu_s_at_epoch: list[np.ndarray] = field(default_factory=list)  # cumulative, at each epoch start
    job_group: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    job_gpus: np.ndarray = field(default_factory=lambda: np.zeros(0))
    job_submit_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    job_wait_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # first start − submit (censored: horizon)
    preemptions: int = 0  # over-quota jobs evicted for in-quota ones


class Simulator(ControlMixin, PlacementMixin):
    """One policy on one trace. `run()` returns a SimResult."""

    def __init__(self, trace: Trace, policy: Policy, seed: int = 0, period_s: float = 600.0,
                 hazard_estimator: object | None = None, calibration: Trace | None = None) -> None:
        self.tr, self.pol, self.period_s = trace, policy, period_s
        self.calibration = calibration  # where the trace-wide hazard means are read from (_trace_means)
        self.rng = np.random.default_rng(seed)
        nd = trace.tables["nodes"]
        self.node_ids = tuple(str(x) for x in nd["id"])
        self.n_nodes = len(self.node_ids)
        nidx = {v: i for i, v in enumerate(self.node_ids)}
        _, self.building = np.unique(nd["building"].astype(str), return_inverse=True)
        self.gpus = nd["gpus"].astype(float)
        self.vram = nd["vram_gb"].astype(float)
        self.cap = nd["capability"].astype(float)
        lk = trace.tables["links"]
        self.link_ids = tuple(str(x) for x in lk["id"])
        self.tree = CampusTree.from_links(self.link_ids, [str(x) for x in lk["a"]],
                                          [str(x) for x in lk["b"]], self.node_ids)
        self.n_links = len(self.link_ids)
        self.access = np.array([int(self.tree.parent_link[i]) for i in range(self.n_nodes)])
        self.buddy = np.arange(self.n_nodes)
        for i in range(self.n_nodes):
            same = np.flatnonzero(self.building == self.building[i])
            self.buddy[i] = same[(np.searchsorted(same, i) + 1) % len(same)]
        # where each node's running jobs keep their durable checkpoint (Policy.checkpoint_store): the buddy, or
        # for "shared" the first node of the next building, so that every restart crosses the campus core
        if policy.checkpoint_store not in ("replica", "shared"):
            raise ValueError(f"checkpoint_store must be 'replica' or 'shared', not {policy.checkpoint_store!r}")
        self.store = self.buddy.copy()
        n_buildings = int(self.building.max()) + 1 if self.n_nodes else 0
        if policy.checkpoint_store == "shared" and n_buildings > 1:
            first = [int(np.flatnonzero(self.building == b)[0]) for b in range(n_buildings)]
            self.store = np.array([first[(int(self.building[i]) + 1) % n_buildings] for i in range(self.n_nodes)])
        self._paths: dict[tuple[int, int], np.ndarray] = {}
        self.n_epochs = int(np.ceil(trace.horizon_s / period_s))
        self.bw = self._sampled("bandwidth", lk["bytes_per_s"])
        self.res = self._sampled("research", np.zeros(self.n_links))
        jb = trace.tables["jobs"]
        members, low = gang_columns(trace)
        if np.any(members > 1) or np.any(low < members):
            raise TraceError("jobs.members", "gang and elastic jobs (members > 1 or min_members < members) are "
                                             "simulated by scheduler.sim.gangs")
        self.J = len(jb["id"])
        self.job_ids = tuple(str(x) for x in jb["id"])
        self.submit, self.jg = jb["submit_s"].astype(float), jb["gpus"].astype(float)
        self.jvram, self.jcap = jb["vram_gb"].astype(float), jb["min_capability"].astype(float)
        self.work, self.C = jb["work_s"].astype(float), jb["ckpt_bytes"].astype(float)
        self.Tr, self.Lmax = jb["restart_s"].astype(float), jb["loss_budget_s"].astype(float)
        self._groups(trace)
        rc = trace.tables["reclaims"]
        self.rc_node = np.array([nidx[str(x)] for x in rc["node"]], dtype=np.int64)
        self.rc_t, self.rc_notice = rc["t_s"].astype(float), rc["notice_s"].astype(float)
        self.rc_ret = rc["return_s"].astype(float)
        self.rc_dead = self.rc_t + self.rc_notice
        self.hz_truth = trace.tables.get("hazard")
        self.lam_true: np.ndarray | None = None
        if self.hz_truth is not None:
            ht, hv = self.hz_truth["t_s"], self.hz_truth["per_s"]
            o = np.argsort(ht, kind="stable")
            k = np.searchsorted(ht[o], np.arange(self.n_epochs) * period_s, side="right") - 1
            self.lam_true = np.where(k >= 0, hv[o][np.maximum(k, 0)], hv[o][0])
        self.lam_now = 0.0
        from scheduler.estimators import BandwidthEstimator, HazardEstimator

        self._trace_means()
        self.hz = hazard_estimator or HazardEstimator(self.n_nodes, group_of=self.building.astype(np.int64),
                                                      prior_per_s=self.prior_hazard_per_s)
        self.bwe = BandwidthEstimator(self.n_links)
        self.bwc = BandwidthEstimator(self.n_links)

    # ---- trace preprocessing -------------------------------------------------------------------
    def _groups(self, trace: Trace) -> None:
        """design §16.5: the jobs' groups, shares and quotas (a trace without groups is one group)."""
        jb = trace.tables["jobs"]
        names = jb.get("group")
        names = np.full(self.J, "default", dtype=object) if names is None else names.astype(str)
        gt = trace.tables.get("groups")
        if gt is not None and len(gt["id"]):
            ids = tuple(str(x) for x in gt["id"])
            share, max_gpus, max_h = (gt[c].astype(float) for c in ("share", "max_gpus", "max_gpu_h_30d"))
        else:
            ids = tuple(sorted(set(names.tolist()))) or ("default",)
            share, max_gpus, max_h = np.ones(len(ids)), np.full(len(ids), np.nan), np.full(len(ids), np.nan)
        gidx = {g: i for i, g in enumerate(ids)}
        self.group_ids = ids
        self.job_group = np.array([gidx[str(x)] for x in names], dtype=np.int64)
        self.group_share = share
        self.group_max_gpus = np.where(np.isnan(max_gpus), np.inf, max_gpus)
        self.group_max_gpu_s_30d = np.where(np.isnan(max_h), np.inf, max_h * 3600.0)
        self.has_quotas = bool(np.isfinite(self.group_max_gpus).any() or np.isfinite(self.group_max_gpu_s_30d).any())

    def _sampled(self, table: str, default: np.ndarray) -> np.ndarray:
        """(n_links, n_epochs) piecewise-constant samples at each control period start (design §7)."""
        out = np.repeat(np.asarray(default, dtype=float)[:, None], self.n_epochs, axis=1)
        if table not in self.tr.tables:
            return out
        tb = self.tr.tables[table]
        lidx = {v: i for i, v in enumerate(self.link_ids)}
        li = np.array([lidx[str(x)] for x in tb["link"]], dtype=np.int64)
        starts = np.arange(self.n_epochs) * self.period_s
        for link in np.unique(li):
            m = li == link
            t, v = tb["t_s"][m], tb["bytes_per_s"][m]
            o = np.argsort(t, kind="stable")
            t, v = t[o], v[o]
            k = np.searchsorted(t, starts, side="right") - 1
            out[link] = np.where(k >= 0, v[np.maximum(k, 0)], out[link])
        return out

    def _profile(self) -> np.ndarray:
        """The hourly hazard profile for P2, refreshed once per control period (lazily)."""
        if self.profile is None:
            self.profile = self.hz.hourly_profile_per_s(self.t_epoch)
        return self.profile

    def _hazard_means(self, trace: Trace) -> tuple[float, float, np.ndarray]:
        """From `trace`'s reclaims: the trace-wide emergency hazard per lent node (`static`), the estimator's
        prior (the first week's rate) and the hour-of-day hazard (`tv`), per second."""
        rc = trace.tables["reclaims"]
        rc_t, notice = rc["t_s"].astype(float), rc["notice_s"].astype(float)
        horizon_s, n_nodes = trace.horizon_s, len(trace.tables["nodes"]["id"])
        em = notice == 0
        away = np.minimum(np.nan_to_num(rc["return_s"].astype(float), nan=horizon_s), horizon_s)
        away = away - np.minimum(rc_t + notice, horizon_s)
        lent_s = max(n_nodes * horizon_s - float(np.sum(away)), 1.0)
        mean_hazard_per_s = max(float(np.sum(em)) / lent_s, 1e-9)
        # The estimator's prior: the emergency rate of a first "calibration week" (what a campus knows
        # from its logs before switching ReclaimNet on); the default 1/h is far above this campus.
        week = min(7 * 86400.0, horizon_s)
        n_week = float(np.sum(em & (rc_t < week)))
        prior_hazard_per_s = max((n_week + 1.0) / (lent_s * week / horizon_s), 1e-8)
        n_epochs = int(np.ceil(horizon_s / self.period_s))
        hours = ((np.arange(n_epochs) * self.period_s / 3600.0) % 24).astype(int)
        ev_h = ((rc_t[em] / 3600.0) % 24).astype(int)
        exp_h = np.bincount(hours, minlength=24) * self.period_s * n_nodes * lent_s / (n_nodes * horizon_s)
        cnt_h = np.bincount(ev_h, minlength=24)
        tv_hazard = np.maximum((cnt_h + 0.5) / np.maximum(exp_h, 1.0), 1e-9)
        return mean_hazard_per_s, prior_hazard_per_s, tv_hazard

    def _trace_means(self) -> None:
        """Trace-wide means for `static` and hour-of-day means for `tv` (the evaluated policies). The hazard's come
        from the calibration trace where one is given (design §21.5: the campus's previous period, so no policy
        reads the evaluated trace's future), else from the evaluated trace itself (hindsight)."""
        self.mean_hazard_per_s, self.prior_hazard_per_s, self.tv_hazard = self._hazard_means(
            self.calibration if self.calibration is not None else self.tr)
        self.hazard_means_from = "calibration" if self.calibration is not None else "evaluated trace"
        week = min(7 * 86400.0, self.tr.horizon_s)
        resid = np.maximum(self.bw - self.res, MIN_RATE_BYTES_PER_S)[self.access]
        self.mean_bw_bytes_per_s = float(np.mean(resid))
        # P3's research reserve per link, as a share of the link (design §4.1): β everywhere, or sized once from the
        # calibration week's research share (`reserve_quantile`: one quantile over all links and epochs of that week),
        # or calibrated per link every day as the portal does (`_calibrate_reserve`)
        beta = RESERVE_FRACTION
        if self.pol.reserve_quantile is not None:
            week_epochs = max(1, min(self.n_epochs, int(week // self.period_s)))
            share = self.res[:, :week_epochs] / np.maximum(self.bw[:, :week_epochs], MIN_RATE_BYTES_PER_S)
            beta = float(np.clip(np.quantile(share, self.pol.reserve_quantile), RESERVE_FRACTION, 0.9))
        self.reserve_fraction = np.full(self.n_links, beta)
        self.research_share = None
        if self.pol.reserve == "calibrated" and self.pol.reserve_quantile is None and self.pol.traffic == "p3":
            self.research_share = np.clip(self.res / np.maximum(self.bw, MIN_RATE_BYTES_PER_S), 0.0, 1.0)
        self.reserve_fraction_sum, self.epoch_count = 0.0, 0
        hours = ((np.arange(self.n_epochs) * self.period_s / 3600.0) % 24).astype(int)
        self.tv_bw = np.array([float(np.mean(resid[:, hours == h])) if np.any(hours == h)
                               else self.mean_bw_bytes_per_s for h in range(24)])

    def path(self, a: int, b: int) -> np.ndarray:
        key = (a, b)
        p = self._paths.get(key)
        if p is None:
            p = self.tree.path_links(a, b) if a != b else np.zeros(0, dtype=np.int64)
            self._paths[key] = p
        return p

    # ---- state -----------------------------------------------------------------------------------
    def _init_state(self) -> None:
        J = self.J
        self.st = np.full(J, FUTURE)
        self.node = np.full(J, -1)
        self.prog, self.durable, self.pos = np.zeros(J), np.zeros(J), np.zeros(J)
        self.delta = np.full(J, 600.0)
        self.s = np.ones(J)
        self.xfer = np.ones(J)  # async checkpoints (design §2): the background copy's time C/b (sync: unused)
        self.bplan = np.full(J, LINE_RATE_BYTES_PER_S)  # guaranteed pre-sync rate b_i (tcp: line rate)
        self.wceil = np.full(J, LINE_RATE_BYTES_PER_S)  # its pre-sync's HTB ceil
        self.ckpt_budget = np.full(J, np.nan)  # B_ckpt of its node when P1 last planned it (P3 policies)
        self.holder = np.full(J, -1)
        self.first_start = np.full(J, np.nan)
        self.t_done = np.full(J, np.nan)
        self.restart_due = np.full(J, np.inf)
        self.need_xfer = np.zeros(J, dtype=bool)
        self.open_int: dict[int, Interruption] = {}
        self.pre_drain: dict[int, float] = {}
        self.free = self.gpus.copy()
        self.lent = np.ones(self.n_nodes, dtype=bool)
        self.pending = np.zeros(self.n_nodes, dtype=bool)
        self.flows: list[dict] = []
        self.heap: list[tuple[float, int, str, int]] = []
        self.seq = 0
        self.queue: list[int] = []
        self.epoch = 0
        self.res_t = SimResult(self.pol.name, n_jobs=J, reserve_fraction=float(np.mean(self.reserve_fraction)))
        n_groups = len(self.group_ids)
        self.res_t.group_ids, self.res_t.group_share = self.group_ids, self.group_share
        self.res_t.group_gpu_s = np.zeros(n_groups)
        self.usage_decayed = np.zeros(n_groups)  # the fair share's GPU-seconds, decayed (design §16.1)
        self.preemptible = np.zeros(J, dtype=bool)
        self.B = self.bw[:, 0].copy()
        self.R = self.res[:, 0].copy()
        self.Bminus = np.maximum(self.B - self.R, MIN_RATE_BYTES_PER_S)
        self.Bcap = np.maximum(self.B, MIN_RATE_BYTES_PER_S)
        self.use = None
        self._rates_key: tuple | None = None  # the inputs `use` was computed from (`_rates`)
        self.research_rates = (0.0, 0.0)
        self.t_epoch, self.profile = 0.0, None
        self._refresh_hazard(0.0)
        for j in range(J):
            self._push(self.submit[j], "submit", j)
        for k in range(len(self.rc_t)):
            self._push(self.rc_t[k], "notice", k)
            self._push(self.rc_dead[k], "deadline", k)
            if np.isfinite(self.rc_ret[k]):
                self._push(self.rc_ret[k], "return", k)
        # per-node sorted reclaim notice times (the oracle's future knowledge)
        self.future = [np.sort(self.rc_t[self.rc_node == i]) for i in range(self.n_nodes)]

    def _refresh_hazard(self, t: float) -> None:
        """The estimates P1 plans with this control period (design §2 "Estimators"): λ at the policy's planning
        quantile and, per node and notice edge, the rate of short-notice scheduled reclaims (only where the policy's
        plan reads λ)."""
        self.lam_up = self.hz.hazard_plan_per_s(t, self.pol.plan_hazard_quantile)
        self.sched_rates = (self.hz.short_notice_rates_per_s(t)
                            if self.pol.short_notice_hazard and self._plans_at_hazard() else None)

    def _push(self, t: float, kind: str, arg: int) -> None:
        order = {"epoch": 0, "return": 1, "deadline": 2, "notice": 3, "xfer": 4, "restart": 5,
                 "requeue": 6, "submit": 7}[kind]
        self.seq += 1
        heapq.heappush(self.heap, (t, order * 10**9 + self.seq, kind, arg))

    # ---- analytic advance ------------------------------------------------------------------------
    def _time_to_finish(self, idx: np.ndarray) -> np.ndarray:
        return time_to_finish(self.pos[idx], self.delta[idx], self.s[idx],
                              np.maximum(self.work[idx] - self.prog[idx], 0.0))

    def _advance(self, dt: float, run: np.ndarray | None = None) -> None:
        """Move every running job, transfer and the accumulators ``dt`` seconds on (``run``: the running jobs, if
        the caller has them)."""
        if dt <= 0:
            return
        if run is None:
            run = np.flatnonzero(self.st == RUNNING)
        jg = self.jg[run]
        self._accrue_group_use(run, dt, jg)
        if run.size:
            d, s, p = self.delta[run], self.s[run], self.pos[run]
            self.res_t.running_gpu_s += float(jg.sum()) * dt
            at_bound = np.isfinite(d) & (d >= 2.0 * self.Lmax[run] * self.pol.loss_budget_scale * (1.0 - 1e-9))
            self.res_t.budget_bound_gpu_s += float(jg[at_bound].sum()) * dt
            prog, durable = self.prog[run], self.durable[run]
            if self.lam_true is not None and self.pol.interval != "oracle":  # the oracle saves just in time
                risk = risk_integral(prog - durable, p, d, s, dt)
                if self.pol.ckpt_mode == "async":  # approximation: a snapshot is at risk while it is copied,
                    risk = risk + dt * d * np.minimum(self.xfer[run], d) / (d + s)  # ≈ Δ more for that share
                self.res_t.expected_lost_gpu_s += self.lam_now * float((risk * jg).sum())
            n, newp, work = advance_cycles(p, d, s, dt)
            work = np.minimum(work, self.work[run] - prog)
            self.res_t.overhead_gpu_s += float(((dt - work) * jg).sum())
            prog = prog + work
            self.prog[run] = prog
            self.pos[run] = newp
            crossed = n >= 1
            if self.pol.ckpt_mode == "async":
                self.durable[run] = async_durable(prog, durable, newp, d, self.xfer[run], crossed)
            else:
                self.durable[run] = np.where(crossed, prog - np.minimum(newp, d), durable)
        if self.flows and self.use is not None:
            for k, f in enumerate(self.flows):
                f["left"] = max(0.0, f["left"] - self.use.flow_rate_bytes_per_s[k] * dt)
        if self.use is not None:
            deficit, demand = self.research_rates
            self.res_t.research_deficit_bytes += deficit * dt
            self.res_t.research_demand_bytes += demand * dt

    def _accrue_group_use(self, run: np.ndarray, dt: float, jg: np.ndarray) -> None:
        """GPU-seconds each group receives (running jobs, ``jg`` their GPUs), and the fair queue's decayed usage
        (design §16.1)."""
        by_group = np.bincount(self.job_group[run], weights=jg, minlength=len(self.group_ids))
        self.res_t.group_gpu_s += by_group * dt
        if self.pol.queue == "fair":
            h = self.pol.queue_weights.half_life_s
            keep = 2.0 ** (-dt / h)
            self.usage_decayed = self.usage_decayed * keep + by_group * h / np.log(2.0) * (1.0 - keep)

    def _preempt(self, j: int, t: float) -> None:
        """Evict an over-quota job for an in-quota one: it checkpoints (nothing lost) and waits in the queue."""
        n = int(self.node[j])
        if self.st[j] == RUNNING:
            self.durable[j] = self.prog[j]
        else:
            self.prog[j] = self.durable[j]
        self.flows = [f for f in self.flows if f["job"] != j]
        self._release(j)
        self.preemptible[j] = False
        self.st[j] = QUEUED
        self.node[j] = -1
        self.need_xfer[j] = True
        self.holder[j] = n
        self.queue.append(j)
        self.res_t.preemptions += 1

    def _occupy(self, j: int, n: int) -> None:
        self.node[j] = n
        self.free[n] -= self.jg[j]

    def _release(self, j: int) -> None:
        n = int(self.node[j])
        if n >= 0:
            self.free[n] += self.jg[j]

    def _start_running(self, j: int, n: int, t: float) -> None:
        self.st[j] = RUNNING
        self.node[j] = n
        self.durable[j] = self.prog[j]
        self.pos[j] = 0.0
        self.s[j] = self.C[j] / max(self.bplan[j], MIN_RATE_BYTES_PER_S)
        if self.pol.ckpt_mode == "async":  # design §2 "Asynchronous snapshots": the job stalls for the copy only
            self.xfer[j] = self.s[j]
            self.s[j] *= self.pol.stall_fraction
        self.holder[j] = self.store[n] if self.pol.migrate else n
        self._replan(t, np.array([j]))

    def _start_restart(self, j: int, n: int, t: float) -> None:
        self.st[j] = RESTART
        self.node[j] = n
        self.restart_due[j] = t + self.Tr[j]
        self._push(t + self.Tr[j], "restart", j)

    def _start_flow(self, j: int, src: int, dst: int, t: float, kind: str, deadline: float) -> None:
        self.st[j] = MOVING
        self.node[j] = dst
        links = self.path(src, dst)
        self.seq += 1
        f = {"id": self.seq, "job": j, "src": src, "dst": dst, "links": links, "left": float(self.C[j]),
             "kind": kind, "deadline": deadline, "shaped": np.nan}
        self.res_t.migration_bytes += float(self.C[j])
        if links.size == 0:
            self._start_restart(j, dst, t)
            return
        self.flows.append(f)

    # ---- reclaim handling ------------------------------------------------------------------------
    def _interrupt(self, j: int, t: float, lost: float, emergency: bool) -> None:
        self.res_t.lost_gpu_s += lost * self.jg[j]
        if j in self.open_int:  # hit again before it resumed (e.g. while restarting): same interruption
            self.open_int[j].lost_s += lost
            return
        src = int(self.node[j])
        rec = Interruption(job=j, t_stop_s=t, lost_s=lost, budget_s=float(self.Lmax[j]), source=src,
                           emergency=emergency)
        self.res_t.interruptions.append(rec)
        self.open_int[j] = rec

    def _on_notice(self, k: int, t: float) -> None:
        n = int(self.rc_node[k])
        if not self.lent[n]:
            return
        self.pending[n] = True
        tau = float(self.rc_notice[k])
        if tau > 0:
            self.hz.record_scheduled(n, t, tau)
        if tau <= 0 or not self.pol.final_checkpoint or self.pol.interval == "oracle":
            return
        for j in np.flatnonzero((self.node == n) & (self.st == RUNNING)):
            j = int(j)
            final = self._final_fits(j, n, tau, self.Tr[j])
            dst = self._choose_dest(j, n, n, t, tau) if final else -1
            if dst >= 0:  # drain: stop now, the final checkpoint goes straight to the destination
                self._drain(j, t)
                self._occupy(j, dst)
                self._start_flow(j, n, dst, t, "planned", t + tau)
            elif self.buddy[n] != n and self._final_fits(j, n, tau, 0.0):
                # warn → drain → force (design §1) with no destination yet: the final checkpoint goes to the
                # pre-sync replica and the job waits in the queue without losing work. A node alone in its
                # building has no replica off itself (buddy[n] == n): it keeps running to the deadline.
                self._drain(j, t)
                self._start_flow(j, n, int(self.buddy[n]), t, "drain", t + tau)
                self.node[j] = -1
        self._admit(t)

    def _drain(self, j: int, t: float) -> None:
        self.pre_drain[j] = float(self.durable[j])
        self.durable[j] = self.prog[j]
        self._interrupt(j, t, 0.0, emergency=False)
        self._release(j)

    def _on_deadline(self, k: int, t: float) -> None:
        n = int(self.rc_node[k])
        if not self.lent[n]:
            return
        self.lent[n] = False
        self.pending[n] = True
        emergency = self.rc_notice[k] == 0
        if emergency:
            self.hz.record_departure(n, t)
        # planned flows out of n that missed the deadline fall back to the pre-synced checkpoint
        for f in list(self.flows):
            if f["src"] == n and f["kind"] in ("planned", "drain"):
                j = f["job"]
                self.flows.remove(f)
                lost = self.prog[j] - self.pre_drain.pop(j, self.prog[j])
                self.open_int[j].lost_s = lost
                self.res_t.lost_gpu_s += lost * self.jg[j]
                self.prog[j] -= lost
                self.durable[j] = self.prog[j]
                if f["kind"] == "drain":
                    self._requeue(j, int(self.buddy[n]), t, 0.0)
                else:
                    self._start_flow(j, int(self.buddy[n]), f["dst"], t, "recovery", np.inf)
        for j in np.flatnonzero((self.node == n) & ((self.st == RUNNING) | (self.st == RESTART))):
            self._evict(int(j), n, t, bool(emergency))
        # transfers heading to n lose their destination: back to the queue
        for f in list(self.flows):
            if f["dst"] == n and f["kind"] != "drain":
                j = f["job"]
                self.flows.remove(f)
                self.free[n] += self.jg[j]
                self.node[j] = -1
                self.st[j] = QUEUED
                self.need_xfer[j] = True
                self.holder[j] = f["src"]
                self.queue.insert(0, j)
        self._admit(t)
        self._try_place(t)

    def _evict(self, j: int, n: int, t: float, emergency: bool) -> None:
        pol = self.pol
        was_running = self.st[j] == RUNNING
        if pol.interval == "oracle" and was_running:
            dst = self._choose_dest(j, n, n, t, None)
            since = self.prog[j] - self.durable[j]
            # Bound, not a mechanism: the checkpoint costs only a local-disk write just before the
            # reclaim (its copy off the node is assumed done in the background with foresight).
            x = self.C[j] / LOCAL_WRITE_BYTES_PER_S
            cost = min(x, since)
            self.prog[j] -= cost
            lost = since if since < x else 0.0
            self.res_t.overhead_gpu_s += (cost - lost) * self.jg[j]
            self._interrupt(j, t, lost, emergency)
            self.durable[j] = self.prog[j]
            self._release(j)
            if dst >= 0:
                self._occupy(j, dst)
                self._start_restart(j, dst, t)
            else:
                self._requeue(j, n, t, 0.0)
            return
        lost = self.prog[j] - self.durable[j] if was_running else 0.0
        self.prog[j] = self.durable[j]
        self._interrupt(j, t, lost, emergency)
        self._release(j)
        if not pol.migrate:
            self.st[j] = WAITNODE
            self.node[j] = n
            self.free[n] -= self.jg[j]
            return
        holder = int(self.holder[j]) if self.holder[j] >= 0 else int(self.store[n])
        if pol.requeue_delay_s > 0:
            self._requeue(j, holder, t, pol.requeue_delay_s)
            return
        dst = self._choose_dest(j, n, holder, t, None)
        if dst < 0:
            self._requeue(j, holder, t, 0.0)
            return
        self._occupy(j, dst)
        self._start_flow(j, holder, dst, t, "recovery", np.inf)

    def _requeue(self, j: int, holder: int, t: float, delay_s: float) -> None:
        self.st[j] = QUEUED
        self.node[j] = -1
        self.need_xfer[j] = True
        self.holder[j] = holder
        if delay_s > 0:
            self.st[j] = FUTURE
            self._push(t + delay_s, "requeue", j)
        else:
            self.queue.insert(0, j)

    def _on_return(self, k: int, t: float) -> None:
        n = int(self.rc_node[k])
        self.lent[n] = True
        self.pending[n] = False
        for j in np.flatnonzero((self.st == WAITNODE) & (self.node == n)):
            self._start_restart(int(j), n, t)
        self._try_place(t)

    def _on_restart_done(self, j: int, t: float) -> None:
        if self.st[j] != RESTART or t < self.restart_due[j] - 1e-6:
            return  # a stale event: the job was evicted while restarting and restarts elsewhere later
        rec = self.open_int.pop(j, None)
        if rec is not None:
            rec.t_resume_s = t
            rec.dest = int(self.node[j])
        self.need_xfer[j] = False
        if np.isnan(self.first_start[j]):
            self.first_start[j] = t
        self._start_running(j, int(self.node[j]), t)

    def _finish_job(self, j: int, t: float) -> None:
        self.st[j] = DONE
        self.t_done[j] = t
        self.prog[j] = self.work[j]
        self._release(j)
        self.node[j] = -1
        self.res_t.jobs_done += 1

    # ---- epoch -----------------------------------------------------------------------------------
    def _on_epoch(self, t: float) -> None:
        e = min(round(t / self.period_s), self.n_epochs - 1)
        if e > 0:
            self.hz.add_exposure(t - self.period_s, t, self.lent.copy())
        self.B, self.R = self.bw[:, e], self.res[:, e]
        if self.research_share is not None and (e * self.period_s) % DAY_S == 0:
            self._calibrate_reserve(e)
        self.reserve_fraction_sum += float(np.mean(self.reserve_fraction))
        self.epoch_count += 1
        if self.lam_true is not None:
            self.lam_now = float(self.lam_true[e])
        resid = np.maximum(self.B - self.R, MIN_RATE_BYTES_PER_S)
        # a handful of noisy 100 ms egress-counter samples of the available bandwidth (design §2)
        for i in range(3):
            noise = self.rng.lognormal(0.0, 0.1, self.n_links)
            self.bwe.observe(t + 0.1 * i, resid * noise)
            self.bwc.observe(t + 0.1 * i, self.B * noise)
        # B⁻ of what research leaves (P2's transfer times) and of each link (P3's capacity, P1's budget)
        self.Bminus = np.maximum(self.bwe.lower_bytes_per_s(), MIN_RATE_BYTES_PER_S)
        self.Bcap = np.maximum(self.bwc.lower_bytes_per_s(), MIN_RATE_BYTES_PER_S)
        # estimates refresh once per control period (departures recorded since count from the next one)
        self.t_epoch, self.profile = t, None
        self._refresh_hazard(t)
        est = self.hz.hazard_per_s(t)
        r = self.res_t
        r.hazard_t_s.append(t)
        r.hazard_est_per_s.append(float(np.mean(est)))
        if self.hz_truth is not None:
            r.hazard_true_per_s.append(float(np.interp(t, self.hz_truth["t_s"], self.hz_truth["per_s"])))
            r.epoch_lambda_per_s.append(r.hazard_true_per_s[-1])
        else:
            r.epoch_lambda_per_s.append(float(np.mean(est)))
        r.epoch_bw_bytes_per_s.append(float(np.mean(resid[self.access])))
        r.group_gpu_s_at_epoch.append(r.group_gpu_s.copy())
        self._admit(t)
        self._replan(t)

    def _calibrate_reserve(self, e: int) -> None:
        """The portal's daily calibration (design §4.1, `scheduler.reserve.calibrate_reserve_bytes_per_s`): per link,
        max(p95 of research's share over the last 7 days, β). Before the first day is over the campus's logs from
        before ReclaimNet stand in for the week: the trace's first day, as the hazard prior uses its first week."""
        per_day = max(1, round(DAY_S / self.period_s))
        lo, hi = max(0, e - round(RESERVE_WINDOW_S / self.period_s)), e
        if hi <= lo:
            lo, hi = 0, min(per_day, self.n_epochs)
        sampled_at = (np.arange(lo, hi) + 1.0) * self.period_s
        now = float(sampled_at[-1])
        self.reserve_fraction = np.array([calibrate_reserve_bytes_per_s(1.0, self.research_share[k, lo:hi], sampled_at,
                                                                        now)[0] for k in range(self.n_links)])

    # ---- main loop -------------------------------------------------------------------------------
    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        """Simulate to the horizon. ``progress`` (optional) is called with the fraction of the horizon done
        after each control period; it only observes (the result is the same with or without it)."""
        self._init_state()
        horizon = self.tr.horizon_s
        t = 0.0
        for e in range(self.n_epochs):
            self._push(e * self.period_s, "epoch", e)
        while True:
            t_heap = self.heap[0][0] if self.heap else np.inf
            run = np.flatnonzero(self.st == RUNNING)
            t_fin = np.inf
            if run.size:
                ttf = self._time_to_finish(run)
                k = int(np.argmin(ttf))
                t_fin = t + float(ttf[k])
            t_flow, kf = np.inf, -1
            if self.flows and self.use is not None:
                rates = self.use.flow_rate_bytes_per_s
                with np.errstate(divide="ignore"):
                    tt = np.array([f["left"] for f in self.flows]) / rates
                kf = int(np.argmin(tt))
                t_flow = t + float(tt[kf])
            t_next = min(t_heap, t_fin, t_flow, horizon)
            self._advance(t_next - t, run)
            t = t_next
            if t >= horizon:
                break
            if t_next == t_fin and t_fin < t_heap:
                for j in run[ttf <= ttf[k] + 1e-6]:
                    if self.work[j] - self.prog[j] <= 1e-3:
                        self._finish_job(int(j), t)
                self._try_place(t)
            elif t_next == t_flow and t_flow < t_heap:
                f = self.flows.pop(kf)
                j = f["job"]
                self.pre_drain.pop(j, None)
                if f["kind"] == "drain":
                    self._requeue(j, f["dst"], t, 0.0)
                    self._try_place(t)
                else:
                    if f["kind"] == "planned":
                        self.holder[j] = f["dst"]
                    self._start_restart(j, f["dst"], t)
                self._admit(t)
            else:
                while self.heap and self.heap[0][0] <= t:
                    _, _, kind, arg = heapq.heappop(self.heap)
                    self._dispatch(kind, arg, t)
                    if progress is not None and kind == "epoch":
                        progress(t / horizon)
            self._rates()
        return self._finalise(horizon)

    def _dispatch(self, kind: str, arg: int, t: float) -> None:
        if kind == "epoch":
            self._on_epoch(t)
        elif kind == "submit":
            self.st[arg] = QUEUED
            self.queue.append(arg)
            self._try_place(t)
        elif kind == "notice":
            self._on_notice(arg, t)
        elif kind == "deadline":
            self._on_deadline(arg, t)
        elif kind == "return":
            self._on_return(arg, t)
        elif kind == "restart":
            self._on_restart_done(arg, t)
        elif kind == "requeue" and self.st[arg] == FUTURE:
            self.st[arg] = QUEUED
            self.queue.insert(0, arg)
            self._try_place(t)

    def _finalise(self, horizon: float) -> SimResult:
        r = self.res_t
        if self.epoch_count:
            r.reserve_fraction = self.reserve_fraction_sum / self.epoch_count  # mean over links and periods
        started = ~np.isnan(self.first_start)
        end = np.where(np.isnan(self.t_done), horizon, self.t_done)
        r.resident_gpu_s = float(np.sum(((end - self.first_start) * self.jg)[started]))
        r.job_group, r.job_gpus, r.job_submit_s = self.job_group, self.jg, self.submit
        r.job_wait_s = np.where(started, self.first_start, horizon) - self.submit
        r.useful_gpu_s = float(np.sum(self.prog * self.jg))
        return r


def simulate(trace: Trace, policy: Policy, seed: int = 0, period_s: float = 600.0,
             progress: Callable[[float], None] | None = None) -> SimResult:
    """Run one policy on one trace (deterministic for `seed`); ``progress`` as in `Simulator.run`."""
    return Simulator(trace, policy, seed=seed, period_s=period_s).run(progress)
