"""Closed-form checkpoint-cycle arithmetic (design §2 model behind L(Δ) = λΔ/2 + C/(BΔ)).

A running job's state is its position p in a cycle of Δ seconds of work followed by an s = C/b second
checkpoint stall (p < Δ: working; Δ <= p < Δ + s: writing). Everything is vectorised over jobs;
Δ = inf means "never checkpoints" (the oracle).
"""

from __future__ import annotations

import numpy as np


def advance_cycles(p: np.ndarray, d: np.ndarray, s: np.ndarray, dt: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(completed writes, new position, work done) after dt seconds from position p."""
    cyc = d + s
    tot = p + dt
    with np.errstate(invalid="ignore"):
        n = np.where(np.isfinite(cyc), np.floor(tot / cyc), 0.0)
        newp = tot - np.where(n > 0, n * cyc, 0.0)
        work = np.where(n > 0, n * d, 0.0) + np.minimum(newp, d) - np.minimum(p, d)
    return n, newp, work


def time_to_finish(p: np.ndarray, d: np.ndarray, s: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Seconds until w more seconds of work are done from position p (writes included)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        def from0(x: np.ndarray) -> np.ndarray:
            k = np.maximum(np.ceil(x / d) - 1.0, 0.0)
            k = np.where(np.isfinite(d), k, 0.0)
            return k * (d + s) + (x - np.where(k > 0, k * d, 0.0))
        first = np.where(p < d, d - p, 0.0)
        t_work = np.where(w <= first, w, first + s + from0(np.maximum(w - first, 0.0)))
        t_write = (d + s - p) + from0(w)
    return np.where(p < d, t_work, t_write)


def risk_integral(r0: np.ndarray, p: np.ndarray, d: np.ndarray, s: np.ndarray, dt: float) -> np.ndarray:
    """∫ (work at risk) dt over an advance of dt from cycle position p with risk r0 (closed form)."""
    with np.errstate(invalid="ignore"):
        working = p < d
        t1 = np.where(np.isfinite(d), d + s - p, np.inf)  # time to the next completed write
        first = np.minimum(dt, t1)
        a = np.where(working, np.minimum(first, d - p), 0.0)  # working part of the first stretch
        w = first - a
        part1 = r0 * a + a * a / 2.0 + (r0 + a) * w
        rest = np.maximum(dt - t1, 0.0)
        if not (rest > 0).any():  # no write completes within dt (the usual step between events): part2 is 0
            return part1 + 0.0
        cyc = d + s
        n = np.where(rest > 0, np.floor(rest / cyc), 0.0)
        rem = rest - np.where(n > 0, n * cyc, 0.0)
        fc = d * d / 2.0 + d * s
        f_rem = np.where(rem < d, rem * rem / 2.0, d * d / 2.0 + d * (rem - d))
        part2 = np.where(rest > 0, np.where(n > 0, n * fc, 0.0) + f_rem, 0.0)
    return part1 + part2


def async_durable(prog: np.ndarray, durable: np.ndarray, newp: np.ndarray, d: np.ndarray, xfer: np.ndarray,
                  crossed: np.ndarray) -> np.ndarray:
    """Durable progress with asynchronous snapshots (design §2 "Asynchronous snapshots"): the snapshot taken at
    the end of a cycle's work (progress prog - min(newp, Δ), the "base") is durable only ``xfer`` seconds into
    the next cycle, when its background copy ends (Δ ≥ xfer, so it ends before the next snapshot). Before that,
    the durable one is the snapshot a cycle earlier (base - Δ), never less than what was durable already."""
    base = prog - np.minimum(newp, d)
    with np.errstate(invalid="ignore"):
        copied = newp >= xfer
        previous = np.where(crossed, np.maximum(durable, base - d), durable)
        return np.where(copied, np.maximum(durable, base), previous)
