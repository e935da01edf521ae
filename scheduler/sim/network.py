"""Link-rate model of the simulator: who gets how much of each campus link (SPEC §1, §4).

Two regimes:
- ``p3``: admitted planned migrations (AF41) get their shaped P3 rate first; research (best effort) gets its
  demand from what is left; pre-sync writes and recovery/degraded transfers (CS1) share the remainder
  equally, each capped at its own rate (a BPF token bucket per flow).
- ``tcp``: no shaping; research and every bulk flow share each link in proportion to demand (bulk flows
  demand the 1 Gbit/s access line rate), which is how long TCP flows crowd out interactive traffic.

Research degradation is the research demand not served, weighted by the share of time a link carries
bulk traffic that can degrade research (migrations always; pre-sync writes for their duty cycle, in tcp).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LINE_RATE_BYTES_PER_S = 125e6  # 1 Gbit/s access line rate: the demand of an unshaped bulk flow


@dataclass(frozen=True)
class LinkUse:
    """Rates for one interval between events."""

    flow_rate_bytes_per_s: np.ndarray
    writer_rate_bytes_per_s: np.ndarray
    active: np.ndarray  # per link, in [0, 1]: share of time research competes with bulk traffic
    deficit_bytes_per_s: np.ndarray  # per link, research demand not served while active


def allocate(mode: str, avail_bytes_per_s: np.ndarray, research_bytes_per_s: np.ndarray,
             flow_links: list[np.ndarray], shaped_bytes_per_s: np.ndarray,
             writer_link: np.ndarray, writer_cap_bytes_per_s: np.ndarray, writer_duty: np.ndarray) -> LinkUse:
    """Rates of flows (shaped rate, NaN = scavenger) and pre-sync writers (link index, cap, duty)."""
    n_l = avail_bytes_per_s.shape[0]
    b = avail_bytes_per_s
    r = np.minimum(research_bytes_per_s, b)
    n_f = len(flow_links)
    if n_f:
        f_idx = np.concatenate([np.full(len(x), k) for k, x in enumerate(flow_links)]).astype(np.int64)
        f_lnk = np.concatenate(flow_links).astype(np.int64)
    else:
        f_idx = f_lnk = np.zeros(0, dtype=np.int64)
    flow_rate = np.zeros(n_f)
    on_link = np.bincount(f_lnk, minlength=n_l) > 0
    wl = writer_link.astype(np.int64)
    if mode == "tcp":
        demand = r + np.bincount(f_lnk, minlength=n_l) * LINE_RATE_BYTES_PER_S
        demand = demand + np.bincount(wl, minlength=n_l) * LINE_RATE_BYTES_PER_S
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(demand > b, b / demand, 1.0)
        if n_f:
            per = np.ones(n_f)
            np.minimum.at(per, f_idx, scale[f_lnk])
            flow_rate = LINE_RATE_BYTES_PER_S * per
        w_rate = np.minimum(writer_cap_bytes_per_s, LINE_RATE_BYTES_PER_S * scale[wl])
        duty = np.bincount(wl, weights=writer_duty, minlength=n_l)
        active = np.minimum(1.0, on_link + duty)
        deficit = r * (1.0 - scale)
        return LinkUse(flow_rate, w_rate, active, deficit)
    shaped = np.where(np.isnan(shaped_bytes_per_s), 0.0, shaped_bytes_per_s)
    af = ~np.isnan(shaped_bytes_per_s)
    af_load = np.zeros(n_l)
    if n_f:
        np.add.at(af_load, f_lnk, shaped[f_idx])
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(af_load > b, b / af_load, 1.0)
        per = np.ones(n_f)
        np.minimum.at(per, f_idx, sc[f_lnk])
        flow_rate = np.where(af, shaped * per, 0.0)
        af_load = np.zeros(n_l)
        np.add.at(af_load, f_lnk, flow_rate[f_idx])
    served = np.minimum(r, np.maximum(0.0, b - af_load))
    left = np.maximum(0.0, b - af_load - r)
    scav_f = ~af
    n_scav = np.bincount(f_lnk[scav_f[f_idx]], minlength=n_l).astype(float) if n_f else np.zeros(n_l)
    n_scav += np.bincount(wl, minlength=n_l)
    share = np.where(n_scav > 0, left / np.maximum(n_scav, 1.0), left)
    if n_f and np.any(scav_f):
        per = np.full(n_f, LINE_RATE_BYTES_PER_S)
        np.minimum.at(per, f_idx, share[f_lnk])
        flow_rate = np.where(scav_f, per, flow_rate)
    w_rate = np.minimum(writer_cap_bytes_per_s, share[wl])
    af_on = np.zeros(n_l, dtype=bool)
    if n_f and np.any(af):
        af_on[f_lnk[af[f_idx]]] = True
    return LinkUse(flow_rate, w_rate, af_on.astype(float), r - served)
