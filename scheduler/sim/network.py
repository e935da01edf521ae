"""Link-rate model of the simulator: who gets how much of each campus link (design §1, §4).

A pre-sync writer (a running job's checkpoint copy off the node) only transfers during its write, a
fraction `duty` = s/(Δ+s) of the time. Both regimes count the writers it competes with the same way, by
their expected number writing at the same time (the sum of the other writers' duties on that link), and
under both a stall lasts C / (the rate it gets), so every policy's checkpoint is charged by one rule.

- ``p3`` (HTB at the provider egress, design §4): admitted planned migrations (AF41) get their shaped P3
  rate — with the work-conserving reserve (``flow_borrow``, design §4.2) plus an equal share of the part of
  research's reserve research leaves idle, the agent giving them the same ceil as pre-sync; research (best
  effort) keeps its reserve min(R, β·B), β per link (design §4.1); each pre-sync writer (CS1) is guaranteed
  its P1 rate b_i and borrows, work-conservingly, the unused part of its node's checkpoint budget
  B_ckpt (its ceil: capacity − reserve − admitted migrations, as P1 planned it; with the work-conserving
  reserve of design §4.2 the ceil includes the part of the reserve research leaves idle, B − min(R, β·B)),
  never the reserve research uses: CS1 is capped at capacity − admitted − min(R, β·B) whatever the ceil;
  recovery and unadmitted transfers scavenge what research and the writers leave.
- ``tcp``: no shaping; research and every bulk flow share each link in proportion to demand (bulk flows
  demand the 1 Gbit/s access line rate), which is how long TCP flows crowd out interactive traffic.

Research degradation is the research demand not served, over the link-time that carries bulk traffic
able to take research bandwidth (migrations and pre-sync writes in tcp; admitted migrations and pre-sync
writes above the reserve in p3; scavengers never take it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LINE_RATE_BYTES_PER_S = 125e6  # 1 Gbit/s access line rate: the demand of an unshaped bulk flow
RESERVE_FRACTION = 0.3  # design §4 β: research reserve per bottleneck


@dataclass(frozen=True)
class LinkUse:
    """Rates for one interval between events."""

    flow_rate_bytes_per_s: np.ndarray
    writer_rate_bytes_per_s: np.ndarray  # each writer's rate while it writes
    active: np.ndarray  # per link, in [0, 1]: share of time research competes with bulk traffic
    deficit_bytes_per_s: np.ndarray  # per link, research demand not served while active


def _flow_index(flow_links: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    if not flow_links:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    f_idx = np.concatenate([np.full(len(x), k) for k, x in enumerate(flow_links)]).astype(np.int64)
    return f_idx, np.concatenate(flow_links).astype(np.int64)


def allocate(mode: str, avail_bytes_per_s: np.ndarray, research_bytes_per_s: np.ndarray,
             flow_links: list[np.ndarray], shaped_bytes_per_s: np.ndarray,
             writer_link: np.ndarray, writer_cap_bytes_per_s: np.ndarray, writer_duty: np.ndarray,
             writer_ceil_bytes_per_s: np.ndarray | None = None,
             reserve_fraction: float = RESERVE_FRACTION, flow_borrow: bool = False) -> LinkUse:
    """Rates of flows (shaped rate, NaN = unadmitted) and pre-sync writers (link index, guaranteed rate
    b_i (tcp: its line-rate demand), duty, and in p3 the ceil B_ckpt of its node's class); under p3
    research keeps min(R, reserve_fraction·B) (``reserve_fraction`` a number or one per link) and, with
    ``flow_borrow``, admitted migrations borrow the rest of that reserve while research leaves it idle."""
    n_l = avail_bytes_per_s.shape[0]
    b = avail_bytes_per_s
    r = np.minimum(research_bytes_per_s, b)
    n_f = len(flow_links)
    f_idx, f_lnk = _flow_index(flow_links)
    wl = writer_link.astype(np.int64)
    duty = np.clip(writer_duty, 0.0, 1.0)
    dsum = np.bincount(wl, weights=duty, minlength=n_l)
    others = dsum[wl] - duty  # expected number of other writers writing at the same time
    on_link = np.bincount(f_lnk, minlength=n_l) > 0
    if mode == "tcp":
        n_fl = np.bincount(f_lnk, minlength=n_l) * LINE_RATE_BYTES_PER_S
        # a link while bulk traffic is on it: every flow, and the writers expected to be writing (>= 1)
        bulk = n_fl + np.where(dsum > 0, np.maximum(dsum, 1.0), 0.0) * LINE_RATE_BYTES_PER_S
        demand = r + bulk
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(demand > b, b / demand, 1.0)
            w_demand = r[wl] + n_fl[wl] + (1.0 + others) * LINE_RATE_BYTES_PER_S
            w_scale = np.where(w_demand > b[wl], b[wl] / w_demand, 1.0)
        flow_rate = np.zeros(n_f)
        if n_f:
            per = np.ones(n_f)
            np.minimum.at(per, f_idx, scale[f_lnk])
            flow_rate = LINE_RATE_BYTES_PER_S * per
        w_rate = np.minimum(writer_cap_bytes_per_s, LINE_RATE_BYTES_PER_S * w_scale)
        active = np.minimum(1.0, on_link + dsum)
        return LinkUse(flow_rate, w_rate, active, r * (1.0 - scale))
    shaped = np.where(np.isnan(shaped_bytes_per_s), 0.0, shaped_bytes_per_s)
    af = ~np.isnan(shaped_bytes_per_s)
    af_load = np.zeros(n_l)
    flow_rate = np.zeros(n_f)
    if n_f:
        np.add.at(af_load, f_lnk, shaped[f_idx])
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(af_load > b, b / af_load, 1.0)
        per = np.ones(n_f)
        np.minimum.at(per, f_idx, sc[f_lnk])
        flow_rate = np.where(af, shaped * per, 0.0)
        af_load = np.zeros(n_l)
        np.add.at(af_load, f_lnk, flow_rate[f_idx])
        if flow_borrow and np.any(af):
            # HTB ceil: admitted migrations borrow the part of research's reserve research leaves idle
            idle = np.maximum(0.0, np.minimum(reserve_fraction * b, b - af_load) - r)
            n_af = np.bincount(f_lnk[af[f_idx]], minlength=n_l).astype(float)
            extra = np.full(n_f, np.inf)
            np.minimum.at(extra, f_idx, (idle / np.maximum(n_af, 1.0))[f_lnk])
            flow_rate = np.where(af, np.minimum(flow_rate + extra, LINE_RATE_BYTES_PER_S), 0.0)
            af_load = np.zeros(n_l)
            np.add.at(af_load, f_lnk, flow_rate[f_idx])
    # CS1 (pre-sync) may use everything but admitted migrations and research's reserve (HTB ceil)
    reserve = np.minimum(r, reserve_fraction * b)
    cs1 = np.maximum(0.0, b - af_load - reserve)
    ceil = np.full(wl.size, np.inf) if writer_ceil_bytes_per_s is None else writer_ceil_bytes_per_s
    cap = np.minimum(np.minimum(ceil, cs1[wl]), LINE_RATE_BYTES_PER_S)
    guaranteed = np.minimum(writer_cap_bytes_per_s, cap)
    w_rate = np.maximum(guaranteed, cap / (1.0 + others))  # HTB: own rate, plus a share of idle budget
    w_load = np.bincount(wl, weights=duty * w_rate, minlength=n_l)  # time-average pre-sync load
    # unadmitted/recovery transfers scavenge what research and the writers leave
    left = np.maximum(0.0, b - af_load - r - w_load)
    scav_f = ~af
    n_scav = np.bincount(f_lnk[scav_f[f_idx]], minlength=n_l).astype(float) if n_f else np.zeros(n_l)
    if n_f and np.any(scav_f):
        per = np.full(n_f, LINE_RATE_BYTES_PER_S)
        np.minimum.at(per, f_idx, (left / np.maximum(n_scav, 1.0))[f_lnk])
        flow_rate = np.where(scav_f, per, flow_rate)
    af_on = np.zeros(n_l)
    if n_f and np.any(af):
        af_on[f_lnk[af[f_idx]]] = 1.0
    # research while AF41 alone is on the link, and while a pre-sync write is on it too
    def_af = r - np.minimum(r, np.maximum(0.0, b - af_load))
    w_mean = np.bincount(wl, weights=duty * w_rate, minlength=n_l) / np.maximum(dsum, 1e-300)
    w_on = np.where(dsum > 0, np.maximum(dsum, 1.0) * w_mean, 0.0)
    def_w = r - np.minimum(r, np.maximum(0.0, b - af_load - w_on))
    t_w = np.minimum(1.0, dsum)
    active = np.minimum(1.0, af_on + t_w)
    with np.errstate(divide="ignore", invalid="ignore"):
        deficit = np.where(active > 0, (np.maximum(af_on - t_w, 0.0) * def_af + t_w * def_w)
                           / np.where(active > 0, active, 1.0), 0.0)
    return LinkUse(flow_rate, w_rate, active, deficit)
