"""Egress counters for the bandwidth estimator (design §2: egress counters sampled every 100 ms).

Source: the enforcement backend's counters when present, else ``/proc/net/dev`` transmit bytes.
"""

from __future__ import annotations

import time
from pathlib import Path


def read_proc_net_dev(path: Path = Path("/proc/net/dev")) -> dict[str, int]:
    """Transmitted bytes per interface."""
    out: dict[str, int] = {}
    try:
        lines = path.read_text().splitlines()[2:]
    except OSError:
        return out
    for line in lines:
        name, _, rest = line.partition(":")
        cols = rest.split()
        if len(cols) >= 9:
            out[name.strip()] = int(cols[8])
    return out


class EgressSampler:
    """Samples tx counters every ``period_s`` and keeps the rates seen since the last :meth:`drain`."""

    def __init__(self, iface: str | None, period_s: float = 0.1) -> None:
        self.iface = iface
        self.period_s = period_s
        self._last: dict[str, int] = {}
        self._last_t = 0.0
        self._rates: list[float] = []
        self._tx_bytes = 0

    def _total(self) -> dict[str, int]:
        counters = read_proc_net_dev()
        if self.iface:
            return {self.iface: counters.get(self.iface, 0)}
        return {k: v for k, v in counters.items() if k != "lo"}

    def sample(self) -> None:
        now = time.monotonic()
        current = self._total()
        if self._last_t:
            dt = now - self._last_t
            delta = sum(max(0, current.get(k, 0) - self._last.get(k, 0)) for k in current)
            if dt > 0:
                self._rates.append(delta / dt)
        self._tx_bytes = sum(current.values())
        self._last, self._last_t = current, now

    def drain(self) -> dict[str, float | int]:
        """Summary since the last drain: tx bytes, mean and max egress rate (bytes/s), sample count."""
        rates, self._rates = self._rates, []
        return {
            "tx_bytes": self._tx_bytes,
            "mean_bytes_per_s": (sum(rates) / len(rates)) if rates else 0.0,
            "max_bytes_per_s": max(rates) if rates else 0.0,
            "samples": len(rates),
        }


def tx_total_bytes(iface: str | None) -> int:
    """Transmitted bytes of ``iface`` (None: every interface but ``lo``), from ``/proc/net/dev``."""
    counters = read_proc_net_dev()
    if iface:
        return counters.get(iface, 0)
    return sum(v for k, v in counters.items() if k != "lo")
