"""Estimators feeding P1/P2 (design §2 "Estimators") and the adaptivity gap (Theorem 2).

Hazard: the emergency-reclaim process of node i is modelled as a non-homogeneous Poisson process with
intensity λ_i(t) = θ_i · s_g(hour(t)): a per-node level θ_i times an hour-of-day shape s_g of its group
(building or provider; mean 1 over the day). Over a sliding window the maximum-likelihood level is
events / shape-weighted exposure. Sparse nodes are shrunk toward their group and groups toward the
campus (Gamma-Poisson empirical Bayes: `prior_events` pseudo-events at the parent's rate), which also
makes the upper bound λ⁺ (a Gamma posterior quantile) strictly positive. Drift: per group, a
likelihood-ratio test for one change point inside the window; if it fires, only data after the change
is used (a short window), otherwise the long window. The same scan runs on the pooled campus: a
campus-wide shift (the 1.7x step of design §2) shows there with G times the events, and the groups whose
own test has not fired use the campus change point if their pooled data confirm a change at that point
(so one group's change alone does not cut the others' windows). `make bench-drift` measures both sides
of the threshold: minutes to re-converge after a step, and how often a stationary hazard is cut short.
The hour-of-day shape is learned only from buckets that have left the window (exponentially forgotten), so a level step is never mistaken for a diurnal
bump of the current hour.

Bandwidth: an EWMA of the 100 ms samples with an exponentially weighted variance; the lower bound is
mean - z·sd (B⁻ for deadline checks).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaincinv, ndtri

__all__ = ["NOTICE_EDGES_S", "PLAN_HAZARD_QUANTILE", "BandwidthEstimator", "HazardEstimator", "adaptivity_gap",
           "short_notice_rate_per_s", "shrinkage_weight", "shrunk_rate_per_s"]

HOUR_S = 3600.0
DAY_S = 86400.0

# The hazard P1 plans Δ at (design §2 "Estimators", §21.4): None = the posterior mean λ̂; a number q = the Gamma
# posterior's q-quantile (the estimator's `confidence`, 0.95, is λ⁺). P1's cost λΔ/2 + C/(bΔ) is linear in λ, so
# under the posterior its expectation is λ̂Δ/2 + C/(bΔ), minimised at Δ* = sqrt(2C/(λ̂b)): the upper bound only
# shortens Δ (at one event in the window λ⁺ ≈ 2.4 λ̂, Δ 35% shorter) and buys nothing a linear cost rewards. Any
# fixed quantile moves to λ̂ as events accumulate (q-quantile / mean → 1); planning at λ̂ takes the same limit at
# once. λ⁺ stays for P2's survival risk and the dashboard, where a bound, not an expectation, is wanted.
PLAN_HAZARD_QUANTILE: float | None = None

# design §2 "Estimators", §21.4: scheduled reclaims are counted per node by notice; the rate of those whose notice
# was shorter than each edge (seconds) is kept, and a job whose final checkpoint needs C/b + T_r sees the rate at
# that need (interpolated in log notice) as hazard: such a reclaim leaves it no time and loses what an emergency
# loses.
NOTICE_EDGES_S = np.array([15.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 3840.0, 7680.0])
_LOG_EDGES, _EDGE_INDEX = np.log(NOTICE_EDGES_S), np.arange(NOTICE_EDGES_S.size)  # short_notice_rate_per_s's grid


CONFIRM_CHI2_1DF = 3.841  # 95% point of chi-square(1): a change at one given point, not a scan


def _loglik(n: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Maximised Poisson log-likelihood n·log(n/x) - n (0 where n = 0; the caller silences log(0)'s warning)."""
    return np.where(n > 0, n * np.log(n / np.maximum(x, 1e-300)) - n, 0.0)


def _change_lr(cum_n: np.ndarray, cum_x: np.ndarray) -> np.ndarray:
    """2 x log-likelihood ratio of one rate change after the newest k+1 buckets against none, for every k
    (row k), from newest-first cumulative events and exposure (per column if 2-D)."""
    tn, tx = cum_n[-1], cum_x[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return 2.0 * (_loglik(cum_n[:-1], cum_x[:-1]) + _loglik(tn - cum_n[:-1], tx - cum_x[:-1]) - _loglik(tn, tx))


class HazardEstimator:
    """Emergency-reclaim hazard per node from the departure log (design §2 estimators).

    Windows are kept as a ring of `bucket_s` buckets (which must divide an hour), so memory is
    (window_s / bucket_s) x n_nodes per array and every query is a few vectorised passes over it.
    """

    def __init__(
        self,
        n_nodes: int,
        group_of: np.ndarray | None = None,
        window_s: float = 6 * 3600.0,
        confidence: float = 0.95,
        prior_per_s: float = 1 / 3600.0,
        *,
        bucket_s: float = 300.0,
        prior_events: float = 2.0,
        profile_half_life_s: float = 7 * DAY_S,
        change_threshold: float = 10.0,
        min_short_s: float = 900.0,
        campus_change_test: bool = True,
    ) -> None:
        if n_nodes < 1:
            raise ValueError("n_nodes must be >= 1")
        if bucket_s <= 0 or HOUR_S % bucket_s:
            raise ValueError("bucket_s must divide 3600")
        if not 0 < confidence < 1 or prior_per_s <= 0 or prior_events <= 0 or window_s < bucket_s:
            raise ValueError("need 0 < confidence < 1, prior_per_s > 0, prior_events > 0, window_s >= bucket_s")
        self.n_nodes = n_nodes
        g = np.zeros(n_nodes, dtype=np.int64) if group_of is None else np.asarray(group_of)
        _, self.group = np.unique(g, return_inverse=True)
        self.n_groups = int(self.group.max()) + 1
        # (bucket, node) → bucket·G + group: one bincount sums events and exposure per bucket and group, node by
        # node in index order (what the one-hot product summed, bit for bit)
        self._group_cell = (np.arange(math.ceil(window_s / bucket_s))[:, None] * self.n_groups
                            + self.group[None, :])
        self.window_s = float(window_s)
        self.bucket_s = float(bucket_s)
        self.confidence = float(confidence)
        self.prior_per_s = float(prior_per_s)
        self.prior_events = float(prior_events)
        self.profile_tau_s = profile_half_life_s / math.log(2.0)
        self.change_threshold = float(change_threshold)
        self.campus_change_test = bool(campus_change_test)
        self.k = math.ceil(window_s / bucket_s)
        self.min_short_buckets = max(1, math.ceil(min_short_s / bucket_s))
        self._ages = np.arange(self.k, dtype=np.int64)
        self._events = np.zeros((self.k, n_nodes))
        self._exposure_s = np.zeros((self.k, n_nodes))
        self._bucket = np.full(self.k, -(2**62), dtype=np.int64)  # absolute bucket id held by each slot
        self._prof_events = np.zeros((self.n_groups, 24))  # exponentially forgotten, per group and hour
        self._prof_exposure_s = np.zeros((self.n_groups, 24))
        self._prof_t_s = -math.inf
        # scheduled reclaims by notice (design §2 "Estimators"): events with notice < NOTICE_EDGES_S[k] and
        # exposure, per node, forgotten exponentially with time constant window_s, as of _sched_t_s
        self._sched_events = np.zeros((NOTICE_EDGES_S.size, n_nodes))
        self._sched_exposure_s = np.zeros(n_nodes)
        self._sched_t = np.array([-math.inf])
        self._sched_cell = (np.arange(NOTICE_EDGES_S.size)[:, None] * self.n_groups + self.group[None, :]).ravel()
        self._cache: tuple[float, int, dict[str, np.ndarray]] | None = None
        self._version = 0

    # ------------------------------------------------------------ input
    def _decay_profile(self, t_s: float) -> None:
        if t_s > self._prof_t_s:
            if math.isfinite(self._prof_t_s):
                f = math.exp(-(t_s - self._prof_t_s) / self.profile_tau_s)
                self._prof_events *= f
                self._prof_exposure_s *= f
            self._prof_t_s = t_s

    def _retire(self, slot: int) -> None:
        """Move a bucket leaving the window into the hour-of-day profile (kept apart from the level)."""
        b = int(self._bucket[slot])
        if b < 0:
            return
        end_s = (b + 1) * self.bucket_s
        self._decay_profile(end_s)
        f = math.exp(-max(self._prof_t_s - end_s, 0.0) / self.profile_tau_s)
        hour = int((b * self.bucket_s) // HOUR_S) % 24
        self._prof_events[:, hour] += f * np.bincount(self.group, self._events[slot], self.n_groups)
        self._prof_exposure_s[:, hour] += f * np.bincount(self.group, self._exposure_s[slot], self.n_groups)

    def _slot(self, bucket: int) -> int | None:
        slot = bucket % self.k
        held = int(self._bucket[slot])
        if held == bucket:
            return slot
        if held > bucket:
            return None  # older than the window (a late record): dropped
        self._retire(slot)
        self._events[slot] = 0.0
        self._exposure_s[slot] = 0.0
        self._bucket[slot] = bucket
        return slot

    def add_exposure(self, t0_s: float, t1_s: float, lent: np.ndarray) -> None:
        """Nodes lent (bool, or a 0..1 fraction) over [t0, t1) accumulate exposure time."""
        if not t1_s > t0_s:
            return
        lent_f = np.asarray(lent, dtype=float)
        b0 = math.floor(t0_s / self.bucket_s)
        b1 = math.ceil(t1_s / self.bucket_s)
        for b in range(max(b0, b1 - self.k), b1):  # loop over time buckets, never over nodes
            lo, hi = max(t0_s, b * self.bucket_s), min(t1_s, (b + 1) * self.bucket_s)
            if hi > lo:
                slot = self._slot(b)
                if slot is not None:
                    self._exposure_s[slot] += lent_f * (hi - lo)
        # the scheduled-reclaim rates' exposure: [t0, t1) weighted by its mean forgetting factor as of t1
        self._decay_sched(t1_s)
        tau = self.window_s
        weight = tau * (1.0 - math.exp(-(t1_s - t0_s) / tau)) * math.exp(-max(self._sched_t[0] - t1_s, 0.0) / tau)
        self._sched_exposure_s += lent_f * weight
        self._version += 1

    def _decay_sched(self, t_s: float) -> None:
        if t_s > self._sched_t[0]:
            if math.isfinite(self._sched_t[0]):
                f = math.exp(-(t_s - self._sched_t[0]) / self.window_s)
                self._sched_events *= f
                self._sched_exposure_s *= f
            self._sched_t[0] = t_s

    def record_scheduled(self, node: int, t_s: float, notice_s: float) -> None:
        """A scheduled reclaim of `node` announced at t_s with `notice_s` of notice (design §2 "Estimators"):
        counted for every notice edge above `notice_s`."""
        self._decay_sched(t_s)
        f = math.exp(-max(self._sched_t[0] - t_s, 0.0) / self.window_s)
        self._sched_events[notice_s < NOTICE_EDGES_S, int(node)] += f
        self._version += 1

    def record_departure(self, node: int, t_s: float) -> None:
        """One emergency reclaim of `node` at t_s."""
        self.record_departures(np.array([node]), t_s)

    def record_departures(self, nodes: np.ndarray, t_s: float) -> None:
        """Several emergency reclaims at the same instant (vectorised)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        slot = self._slot(math.floor(t_s / self.bucket_s))
        if slot is not None:
            np.add.at(self._events[slot], nodes, 1.0)
        self._version += 1

    # ------------------------------------------------------------ state
    STATE_ARRAYS = ("_events", "_exposure_s", "_bucket", "_prof_events", "_prof_exposure_s")
    # added later: a stored state without them loads with none recorded (zero counts, as a fresh estimator)
    OPTIONAL_ARRAYS = ("_sched_events", "_sched_exposure_s", "_sched_t")

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Everything the estimates depend on, as arrays (with :meth:`load_arrays`: a durable copy)."""
        out = {name.lstrip("_"): getattr(self, name).copy() for name in self.STATE_ARRAYS + self.OPTIONAL_ARRAYS}
        out["prof_t_s"] = np.array([self._prof_t_s])
        return out

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`to_arrays` returned (the estimator must have the same nodes, groups and window)."""
        for name in self.STATE_ARRAYS:
            value = np.asarray(arrays[name.lstrip("_")])
            if value.shape != getattr(self, name).shape:
                raise ValueError(f"{name}: shape {value.shape}, expected {getattr(self, name).shape}")
            setattr(self, name, value.astype(getattr(self, name).dtype, copy=True))
        for name in self.OPTIONAL_ARRAYS:
            value = arrays.get(name.lstrip("_"))
            if value is not None and np.asarray(value).shape == getattr(self, name).shape:
                setattr(self, name, np.asarray(value, dtype=float).copy())
        self._prof_t_s = float(np.asarray(arrays["prof_t_s"]).ravel()[0])
        self._cache = None
        self._version += 1

    # ------------------------------------------------------------ estimates
    def _shape(self) -> np.ndarray:
        """Hour-of-day shape per group (G, 24), mean 1, shrunk toward the campus shape and then flat."""
        m = self.prior_events
        ce, cx = self._prof_events.sum(axis=0), self._prof_exposure_s.sum(axis=0)
        flat = (ce.sum() + m) / (cx.sum() + m / self.prior_per_s)
        campus = (ce + m) / (cx + m / flat)
        group = (self._prof_events + m) / (self._prof_exposure_s + m / campus[None, :])
        return group / (group.sum(axis=1, keepdims=True) / group.shape[1])  # the mean, as np.mean computes it

    def _estimate(self, t_s: float) -> dict[str, np.ndarray]:
        if self._cache is not None and self._cache[0] == t_s and self._cache[1] == self._version:
            return self._cache[2]
        m = self.prior_events
        shape_g = self._shape()
        b_now = math.floor(t_s / self.bucket_s)
        # the live buckets newest first: bucket b_now - j sits in slot (b_now - j) % k if it is held at all
        want = b_now - self._ages
        slots = want % self.k
        order = slots[self._bucket[slots] == want]
        hours = ((self._bucket[order] * self.bucket_s) // HOUR_S).astype(np.int64) % 24
        ev = self._events[order]  # (A, n), newest first
        exw = self._exposure_s[order] * shape_g[:, hours].T[:, self.group]  # shape-weighted exposure
        a, n_g_ = ev.shape[0], self.n_groups
        use = np.full(n_g_, a)  # buckets used per group (newest first)
        if a >= 2:
            cell = self._group_cell[:a].ravel()
            ng = np.bincount(cell, weights=ev.ravel(), minlength=a * n_g_).reshape(a, n_g_)  # (A, G)
            xg = np.bincount(cell, weights=exw.ravel(), minlength=a * n_g_).reshape(a, n_g_)
            cn, cx = np.cumsum(ng, axis=0), np.cumsum(xg, axis=0)
            pooled = self.campus_change_test and n_g_ > 1
            if pooled:  # the pooled campus is one more column of the same scan (element by element the same)
                lr = self._change_scan(np.concatenate((cn, cn.sum(axis=1)[:, None]), axis=1),
                                       np.concatenate((cx, cx.sum(axis=1)[:, None]), axis=1))
                lr, lr_c = lr[:, :n_g_], lr[:, n_g_]
            else:
                lr = self._change_scan(cn, cx)
            best = np.argmax(lr, axis=0)
            fired = lr[best, np.arange(n_g_)] > self.change_threshold
            use = np.where(fired, best + 1, a)
            quiet = ~fired
            if pooled and quiet.any():
                # the same scan on the pooled campus: a campus-wide shift shows there with G x the events.
                # The groups whose own test did not fire take its change point only if their pooled data
                # also shows a change there (a 1-df test at that one point), so a group that changed alone
                # cannot cut the others' windows.
                k = int(np.argmax(lr_c))
                if lr_c[k] > self.change_threshold:
                    lr_q = _change_lr(cn[:, quiet].sum(axis=1), cx[:, quiet].sum(axis=1))[k]
                    if lr_q > CONFIRM_CHI2_1DF:
                        use = np.where(quiet, k + 1, use)
        in_window = np.arange(a)[:, None] < use[self.group][None, :]  # (A, n)
        n_i = (ev * in_window).sum(axis=0)
        x_i = (exw * in_window).sum(axis=0)
        n_g = np.bincount(self.group, weights=n_i, minlength=n_g_)
        x_g = np.bincount(self.group, weights=x_i, minlength=n_g_)
        theta_c = shrunk_rate_per_s(n_g.sum(), x_g.sum(), self.prior_per_s, m)
        theta_g = shrunk_rate_per_s(n_g, x_g, theta_c, m)
        rate = x_i + m / theta_g[self.group]
        shape_post = n_i + m
        out = {
            "level": shrunk_rate_per_s(n_i, x_i, theta_g[self.group], m),
            "post_shape": shape_post,
            "post_rate": rate,
            "shape": shape_g[self.group],  # (n, 24)
            "window_s": use[self.group] * self.bucket_s,
            "events": n_i,
            "exposure_s": x_i,
            "group_level": theta_g,
            "group_shape": shape_g,
            "campus_level": np.array([theta_c]),
            # the levels above the nodes, for their own upper bounds (the read model falls back to them)
            "group_rate": x_g + m / theta_c,
            "group_events": n_g,
            "campus_rate": np.array([x_g.sum() + m / self.prior_per_s]),
        }
        self._cache = (t_s, self._version, out)
        return out

    def _upper(self, t_s: float, key: str) -> np.ndarray:
        """The estimate at ``t_s`` with its upper bound ``key`` ("upper", "group_upper" or "campus_upper"): the
        Gamma posterior's `confidence` quantile of the node, group or campus level, computed when first asked."""
        e = self._estimate(t_s)
        if key not in e:
            m, q = self.prior_events, self.confidence
            if key == "upper":
                e[key] = gammaincinv(e["post_shape"], q) / e["post_rate"]
            elif key == "group_upper":
                e[key] = gammaincinv(e["group_events"] + m, q) / e["group_rate"]
            else:
                e[key] = np.array([gammaincinv(e["group_events"].sum() + m, q) / e["campus_rate"][0]])
        return e[key]

    def _change_scan(self, cum_n: np.ndarray, cum_x: np.ndarray) -> np.ndarray:
        """`_change_lr` with change points that leave a newer segment shorter than min_short_s masked out:
        so short a segment is too noisy to act on (false alarms)."""
        lr = _change_lr(cum_n, cum_x)
        lr[: max(self.min_short_buckets - 1, 0)] = -np.inf
        return lr

    def hazard_per_s(self, t_s: float) -> np.ndarray:
        """Point estimate λ̂_i(t) per node (1/s)."""
        e = self._estimate(t_s)
        return e["level"] * e["shape"][:, int(t_s // HOUR_S) % 24]

    def hazard_upper_per_s(self, t_s: float) -> np.ndarray:
        """Upper confidence bound λ⁺_i(t) per node; > 0 always (prior pseudo-events)."""
        e = self._estimate(t_s)
        return self._upper(t_s, "upper") * e["shape"][:, int(t_s // HOUR_S) % 24]

    def hazard_plan_per_s(self, t_s: float, quantile: float | None = PLAN_HAZARD_QUANTILE) -> np.ndarray:
        """The hazard P1 plans Δ at (design §2 "Estimators"): the posterior mean λ̂ (``quantile`` None) or the Gamma
        posterior's ``quantile`` (the estimator's confidence gives λ⁺), at t's hour; see PLAN_HAZARD_QUANTILE."""
        if quantile is None:
            return self.hazard_per_s(t_s)
        if not 0 < quantile < 1:
            raise ValueError("quantile must be in (0, 1) or None")
        e = self._estimate(t_s)
        return gammaincinv(e["post_shape"], quantile) / e["post_rate"] * e["shape"][:, int(t_s // HOUR_S) % 24]

    def short_notice_rates_per_s(self, t_s: float) -> np.ndarray:
        """(n_nodes, len(NOTICE_EDGES_S)): per node, the rate of scheduled reclaims whose notice was shorter than
        each edge (design §2 "Estimators"), posterior means shrunk like the emergency levels — node toward its
        group, group toward the campus — with the prior's pseudo-exposure prior_events/prior_per_s and a campus
        prior of none (a campus that never gave a short notice has rate 0). Forgotten with time constant
        window_s; no hour-of-day shape."""
        f = math.exp(-max(t_s - self._sched_t[0], 0.0) / self.window_s) if math.isfinite(self._sched_t[0]) else 0.0
        n_i, x_i = self._sched_events * f, self._sched_exposure_s * f  # (K, n), (n,)
        e0 = self.prior_events / self.prior_per_s
        n_g = np.bincount(self._sched_cell, weights=n_i.ravel(),
                          minlength=n_i.size // self.n_nodes * self.n_groups).reshape(-1, self.n_groups)  # (K, G)
        x_g = np.bincount(self.group, weights=x_i, minlength=self.n_groups)
        theta_c = n_g.sum(axis=1) / (x_g.sum() + e0)  # (K,)
        theta_g = (n_g + theta_c[:, None] * e0) / (x_g[None, :] + e0)
        theta_i = (n_i + theta_g[:, self.group] * e0) / (x_i[None, :] + e0)
        return theta_i.T.copy()

    def hourly_profile_per_s(self, t_s: float) -> np.ndarray:
        """(n_nodes, 24) hourly hazard profile h_d for P2's survival (design §3)."""
        e = self._estimate(t_s)
        return e["level"][:, None] * e["shape"]

    def hourly_profile_upper_per_s(self, t_s: float) -> np.ndarray:
        """(n_nodes, 24) upper-bound profile (λ⁺ level x shape)."""
        e = self._estimate(t_s)
        return self._upper(t_s, "upper")[:, None] * e["shape"]

    def group_hazard_per_s(self, t_s: float) -> np.ndarray:
        """Point estimate per group (building or provider, as `group_of` was given), at t's hour."""
        e = self._estimate(t_s)
        return e["group_level"] * e["group_shape"][:, int(t_s // HOUR_S) % 24]

    def campus_hazard_per_s(self, t_s: float) -> float:
        """Campus-wide point estimate at t's hour (exposure-weighted hour-of-day shape)."""
        e = self._estimate(t_s)
        weights = np.bincount(self.group, minlength=self.n_groups).astype(float)
        shape = float(np.average(e["group_shape"][:, int(t_s // HOUR_S) % 24], weights=weights))
        return float(e["campus_level"][0]) * shape

    def group_hourly_profile_per_s(self, t_s: float, *, upper: bool = False) -> np.ndarray:
        """(n_groups, 24) hourly profile of each group's level (λ̂, or λ⁺ with ``upper``), in the order of the
        sorted group labels given as ``group_of``."""
        e = self._estimate(t_s)
        return (self._upper(t_s, "group_upper") if upper else e["group_level"])[:, None] * e["group_shape"]

    def campus_hourly_profile_per_s(self, t_s: float, *, upper: bool = False) -> np.ndarray:
        """(24,) hourly profile of the campus level, shaped like its nodes (node-weighted group shapes)."""
        e = self._estimate(t_s)
        weights = np.bincount(self.group, minlength=self.n_groups).astype(float)
        shape = np.average(e["group_shape"], axis=0, weights=weights)
        return float((self._upper(t_s, "campus_upper") if upper else e["campus_level"])[0]) * shape

    def hazard_evidence(self, t_s: float) -> dict[str, np.ndarray]:
        """Per node, what its level λ̂ rests on (design §2 "Estimators", shown in P2's why text): the departures and
        the shape-weighted lent exposure in its window, the group (building or provider) level it is shrunk toward,
        and the weight its own evidence gets (`shrinkage_weight`; 1 − weight goes to the group's rate)."""
        e = self._estimate(t_s)
        prior = e["group_level"][self.group]
        return {"events": e["events"], "exposure_s": e["exposure_s"], "prior_per_s": prior,
                "level_per_s": e["level"], "weight": shrinkage_weight(e["exposure_s"], prior, self.prior_events)}

    def window_used_s(self, t_s: float) -> np.ndarray:
        """Per node, the window the level came from (shorter than window_s after a detected change)."""
        return self._estimate(t_s)["window_s"].copy()


class BandwidthEstimator:
    """Available bandwidth per link from 100 ms samples: EWMA mean and variance, lower bound B⁻."""

    def __init__(self, n_links: int, half_life_s: float = 10.0, confidence: float = 0.95) -> None:
        if n_links < 0 or half_life_s <= 0 or not 0.5 <= confidence < 1:
            raise ValueError("need n_links >= 0, half_life_s > 0, 0.5 <= confidence < 1")
        self.n_links = n_links
        self.half_life_s = float(half_life_s)
        self.z = float(ndtri(confidence))
        self._mean = np.zeros(n_links)
        self._var = np.zeros(n_links)
        self._t_s: float | None = None
        self._t_link = np.full(n_links, np.nan)  # per link, the newest sample's time (observe_samples)

    def observe(self, t_s: float, link_bytes_per_s: np.ndarray) -> None:
        """One sample of every link (bytes/s derived from egress counters over ~100 ms)."""
        x = np.asarray(link_bytes_per_s, dtype=float)
        if self._t_s is None:
            self._mean = x.copy()
            self._var = np.zeros_like(x)
        else:
            dt = max(t_s - self._t_s, 0.0)
            alpha = 1.0 - 2.0 ** (-dt / self.half_life_s)
            diff = x - self._mean
            self._mean = self._mean + alpha * diff
            self._var = (1.0 - alpha) * (self._var + alpha * diff * diff)
        self._t_s = t_s

    def observe_samples(self, link: np.ndarray, t_s: np.ndarray, link_bytes_per_s: np.ndarray) -> None:
        """Samples of single links, each at its own time (``link`` indices, in any order): each link's mean and
        variance advance sample by sample in time order, so the result does not depend on how the samples were
        batched — the same samples give the same estimate whether they came in one call or in many."""
        link = np.asarray(link, dtype=np.int64)
        t_s = np.asarray(t_s, dtype=float)
        x = np.asarray(link_bytes_per_s, dtype=float)
        if link.size == 0:
            return
        order = np.lexsort((t_s, link))
        link, t_s, x = link[order], t_s[order], x[order]
        rank = np.arange(link.size) - np.searchsorted(link, link)  # k-th sample of its link
        for k in range(int(rank.max()) + 1):  # round k: the k-th sample of every link, vectorised
            pick = rank == k
            i, t, v = link[pick], t_s[pick], x[pick]
            first = np.isnan(self._t_link[i])
            dt = np.where(first, 0.0, np.maximum(t - np.nan_to_num(self._t_link[i]), 0.0))
            alpha = np.where(first, 1.0, 1.0 - 2.0 ** (-dt / self.half_life_s))
            diff = v - self._mean[i]
            self._mean[i] = np.where(first, v, self._mean[i] + alpha * diff)
            self._var[i] = np.where(first, 0.0, (1.0 - alpha) * (self._var[i] + alpha * diff * diff))
            self._t_link[i] = np.fmax(self._t_link[i], t)  # fmax: NaN (never seen) gives way to t

    def observed(self) -> np.ndarray:
        """Per link: whether any sample has been seen (``observe_samples``)."""
        return ~np.isnan(self._t_link)

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {"mean": self._mean.copy(), "var": self._var.copy(),
                "t_link": self._t_link.copy()}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        for name in ("mean", "var", "t_link"):
            if np.asarray(arrays[name]).shape != (self.n_links,):
                raise ValueError(f"{name}: shape {np.asarray(arrays[name]).shape}, expected ({self.n_links},)")
        self._mean = np.asarray(arrays["mean"], dtype=float).copy()
        self._var = np.asarray(arrays["var"], dtype=float).copy()
        self._t_link = np.asarray(arrays["t_link"], dtype=float).copy()

    def mean_bytes_per_s(self) -> np.ndarray:
        return self._mean.copy()

    def lower_bytes_per_s(self) -> np.ndarray:
        """B⁻ = max(0, mean - z·sd) (design §2: lower confidence bound for deadline checks)."""
        return np.maximum(0.0, self._mean - self.z * np.sqrt(self._var))


def shrunk_rate_per_s(events: np.ndarray | float, exposure_s: np.ndarray | float, prior_per_s: np.ndarray | float,
                      prior_events: float = 2.0) -> np.ndarray:
    """Gamma–Poisson posterior mean of a reclaim rate (design §2 "Estimators"): (k + a) / (T + a/λ₀), k departures
    over exposure T, shrunk toward the parent's rate λ₀ (provider or building, then campus) with the evidence of a
    pseudo-events. Equal to k/T as T grows (the evidence swamps the prior), to λ₀ with no exposure; a weighted mean
    of the two, the weight on k/T being `shrinkage_weight`."""
    k = np.asarray(events, dtype=float)
    return (k + prior_events) / (np.asarray(exposure_s, dtype=float) + prior_events / np.asarray(prior_per_s,
                                                                                                 dtype=float))


def shrinkage_weight(exposure_s: np.ndarray | float, prior_per_s: np.ndarray | float,
                     prior_events: float = 2.0) -> np.ndarray:
    """The weight w = T / (T + a/λ₀) of a node's own rate k/T in `shrunk_rate_per_s` = w·k/T + (1 − w)·λ₀: 0 with no
    lent exposure, → 1 once the exposure is many times the prior's pseudo-exposure a/λ₀."""
    x = np.asarray(exposure_s, dtype=float)
    return x / (x + prior_events / np.asarray(prior_per_s, dtype=float))


def short_notice_rate_per_s(rates_per_s: np.ndarray, need_s: np.ndarray) -> np.ndarray:
    """Per row, the rate of scheduled reclaims with a notice shorter than ``need_s`` (design §2 "Estimators"):
    ``rates_per_s`` (rows, len(NOTICE_EDGES_S)) as `HazardEstimator.short_notice_rates_per_s` gives them, linear in
    log notice between the edges, proportional to the need below the first edge, the last edge's rate above it.
    P1 adds it to λ for a job whose final checkpoint needs ``need_s`` = C/b + T_r: a reclaim with less notice
    loses what an emergency loses."""
    rates = np.atleast_2d(np.asarray(rates_per_s, dtype=float))
    raw = np.asarray(need_s, dtype=float)
    if raw.shape != rates.shape[:1]:
        raw = np.broadcast_to(raw, rates.shape[:1])
    need = raw if np.isfinite(raw).all() else np.nan_to_num(raw, nan=0.0)
    edges = NOTICE_EDGES_S
    pos = np.clip(np.interp(np.log(np.maximum(need, 1e-9)), _LOG_EDGES, _EDGE_INDEX), 0, edges.size - 1)
    k = np.minimum(np.floor(pos).astype(np.int64), edges.size - 2)
    frac = pos - k
    rows = np.arange(rates.shape[0])
    out = rates[rows, k] * (1.0 - frac) + rates[rows, k + 1] * frac
    below = need < edges[0]
    out = np.where(below, rates[:, 0] * np.clip(need, 0.0, None) / edges[0], out)
    return np.where(np.isnan(raw), 0.0, out)


def adaptivity_gap(hazard_per_s: np.ndarray, bandwidth_bytes_per_s: np.ndarray) -> float:
    """Theorem 2: sqrt(E[λ]·E[1/B_eff]) / E[sqrt(λ/B_eff)] - 1 >= 0; 0 iff λ·B_eff is constant."""
    lam = np.asarray(hazard_per_s, dtype=float)
    b = np.asarray(bandwidth_bytes_per_s, dtype=float)
    w = np.sqrt(lam / b)
    gap = math.sqrt(float(np.mean(lam)) * float(np.mean(1.0 / b))) / float(np.mean(w)) - 1.0
    return max(gap, 0.0)  # Cauchy-Schwarz; clip rounding below zero
