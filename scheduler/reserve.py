"""The research reserve, calibrated and work-conserving (design §4 "Calibrated reserve", "Work-conserving reserve").

Pure numpy, no Django. Two rules:

- **Calibration**: B_min of a link = max(q-quantile of research's share of the link over the last 7 days × B,
  β·B), β = 0.3, q = 0.95. The reserve never drops below P3's constant β·B; a campus whose research traffic
  peaks higher gets more.
- **Borrowing (HTB ceil)**: checkpoint traffic is guaranteed B − B_res and may borrow the part of the reserve
  research leaves idle: its ceiling is B − min(R, B_res), R the measured research rate. Zero research → the
  whole link; research at (or above) its reserve → B − B_res. Research gets its reserve back at once: in HTB a
  class under its rate is served before any class that borrows, and the agent lowers the ceiling at its next
  sample.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "RESERVE_FRACTION",
    "RESERVE_QUANTILE",
    "RESERVE_WINDOW_S",
    "borrowable_reserve_bytes_per_s",
    "calibrate_reserve_bytes_per_s",
    "checkpoint_ceil_bytes_per_s",
    "research_shares",
]

RESERVE_FRACTION = 0.3  # β of design §4: the floor of every reserve
RESERVE_QUANTILE = 0.95  # the calibrated reserve covers research's p95 share
RESERVE_WINDOW_S = 7 * 86400.0  # over the last 7 days


def research_shares(research_bytes: np.ndarray, interval_s: np.ndarray, capacity_bytes_per_s: float) -> np.ndarray:
    """Research's share of the link per sample: bytes / (interval · B), clipped to [0, 1] (design §4)."""
    b = np.asarray(research_bytes, dtype=float)
    t = np.asarray(interval_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = b / (t * float(capacity_bytes_per_s))
    return np.clip(np.where(np.isfinite(share), share, 0.0), 0.0, 1.0)


def calibrate_reserve_bytes_per_s(
    capacity_bytes_per_s: float,
    share: np.ndarray,
    sampled_at_s: np.ndarray,
    now_s: float,
    *,
    reserve_fraction: float = RESERVE_FRACTION,
    quantile: float = RESERVE_QUANTILE,
    window_s: float = RESERVE_WINDOW_S,
) -> tuple[float, float | None]:
    """B_min = max(quantile of the shares sampled in (now − window, now] × B, β·B) (design §4 "Calibrated
    reserve"). Returns (B_min bytes/s, the quantile share or None when the window holds no sample)."""
    cap = float(capacity_bytes_per_s)
    s = np.asarray(share, dtype=float)
    t = np.asarray(sampled_at_s, dtype=float)
    floor = reserve_fraction * cap
    inside = (t > now_s - window_s) & (t <= now_s) & np.isfinite(s)
    if not inside.any():
        return floor, None
    q = float(np.quantile(np.clip(s[inside], 0.0, 1.0), quantile))
    return max(q * cap, floor), q


def checkpoint_ceil_bytes_per_s(
    capacity_bytes_per_s: float | np.ndarray,
    reserve_bytes_per_s: float | np.ndarray,
    research_bytes_per_s: float | np.ndarray,
) -> float | np.ndarray:
    """HTB ceil of checkpoint traffic: B − min(R, B_res), R the measured research rate (design §4
    "Work-conserving reserve"). Never below the guaranteed B − B_res, never above B."""
    cap = np.asarray(capacity_bytes_per_s, dtype=float)
    res = np.clip(np.asarray(reserve_bytes_per_s, dtype=float), 0.0, cap)
    used = np.asarray(research_bytes_per_s, dtype=float)
    if not np.isfinite(used).all():  # unknown (NaN) research uses the whole reserve
        used = np.nan_to_num(used, nan=np.inf)
    used = np.maximum(used, 0.0)
    out = cap - np.minimum(used, res)
    return float(out) if out.ndim == 0 else out


def borrowable_reserve_bytes_per_s(
    reserve_bytes_per_s: float | np.ndarray, research_bytes_per_s: float | np.ndarray
) -> float | np.ndarray:
    """The idle part of the reserve checkpoints may borrow: max(0, B_res − R) (0 where R is unknown)."""
    res = np.maximum(np.asarray(reserve_bytes_per_s, dtype=float), 0.0)
    used = np.nan_to_num(np.asarray(research_bytes_per_s, dtype=float), nan=np.inf)
    out = np.maximum(0.0, res - np.maximum(used, 0.0))
    return float(out) if out.ndim == 0 else out
