"""Bytes per traffic class for the research-reserve calibration (design §4 "Calibrated reserve").

Classes (design §4): ``research`` (best effort: everything the agent does not send itself as a checkpoint),
``checkpoint`` (pre-sync, planned migration and emergency metadata: the classes the BPF classifier steers into
their own HTB classes) and ``other`` (bytes the interface sent that no class counter saw: non-IP frames, the
difference between wire and driver byte counts).

Sources, per link:

- **access link, kernel backend** (``bpf_htb``, ``bpf_tokenbucket``, ``htb_u32``): the enforcer's counters — per
  admitted flow with its class, and the ``unclassified`` (research) counter — plus the interface's tx total;
- **access link, no kernel** (``noop`` or enforcement off): the agent's own transfer accounting
  (:data:`TRANSFER_TALLY`, bytes its checkpoint sender wrote) and the interface's tx total: research = total −
  checkpoint;
- **trunk** (a building uplink the node has an interface on: ``trunk_iface``, e.g. the building's gateway or a
  mirror port of the uplink): that interface's tx total, checkpoint = the agent's own checkpoint bytes, research
  = the rest. Other nodes' checkpoint bytes crossing the trunk count as research there: the trunk's reserve is
  over-, never under-estimated.

Reports are deltas since the previous report (never raw counters): a flow removed and re-added, or a counter
that went back, restarts from its new value instead of producing a negative delta.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

CLASSES = ("research", "checkpoint", "other")
MAX_REPORT_INTERVAL_S = 3600.0  # the portal refuses a longer interval (portal/control/link/class_bytes.py)
CHECKPOINT_FLOW_CLASSES = {"EMERGENCY", "MIGRATION", "PRESYNC"}  # FlowClass names (nodeagent.enforcement.api)


class TransferTally:
    """Bytes the agent's checkpoint sender wrote, by flow class (thread-safe, monotone)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[str, int] = {}

    def add(self, flow_class: str, nbytes: int) -> None:
        with self._lock:
            self._bytes[flow_class] = self._bytes.get(flow_class, 0) + int(nbytes)

    def total(self) -> int:
        with self._lock:
            return sum(self._bytes.values())


TRANSFER_TALLY = TransferTally()  # the one the sender (nodeagent/transfer.py) adds to


def _delta(now: int, before: int | None) -> int:
    """A monotone delta: a counter that went back (reset, re-created) restarts from its new value."""
    if before is None:
        return 0
    return now - before if now >= before else now


class ClassBytes:
    """Per-class byte deltas between two heartbeats, for the access link and an optional trunk."""

    def __init__(self, tx_total: Callable[[str | None], int], trunk_iface: str | None = None,
                 tally: TransferTally | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.tx_total = tx_total  # interface (None: all but lo) -> tx bytes
        self.trunk_iface = trunk_iface
        self.tally = tally or TRANSFER_TALLY
        self.clock = clock
        self._last_t: float | None = None
        self._flows: dict[str, int] = {}
        self._last: dict[str, int | None] = {}

    def _step(self, name: str, value: int) -> int:
        d = _delta(value, self._last.get(name))
        self._last[name] = value
        return d

    def report(self, counters: dict[str, Any] | None, iface: str | None) -> dict[str, Any] | None:
        """The heartbeat's ``class_bytes`` (None on the first call: there is no interval yet)."""
        now = self.clock()
        first = self._last_t is None
        interval_s = 0.0 if first else now - self._last_t
        self._last_t = now
        total = self._step("access_total", max(0, int(self.tx_total(iface))))
        own = self._step("own", self.tally.total())
        if counters and isinstance(counters.get("flows"), dict):
            research = self._step("unclassified", int((counters.get("unclassified") or {}).get("bytes", 0)))
            checkpoint = 0
            flows_now: dict[str, int] = {}
            for label, flow in counters["flows"].items():
                if not isinstance(flow, dict) or flow.get("flow_class") not in CHECKPOINT_FLOW_CLASSES:
                    continue
                value = int(flow.get("bytes", 0))
                flows_now[label] = value
                checkpoint += _delta(value, self._flows.get(label, 0 if not first else None))
            self._flows = flows_now
            source = str(counters.get("backend", "kernel"))
        else:
            checkpoint = own
            research = max(0, total - own)
            source = "agent"
        access = {"research": research, "checkpoint": checkpoint, "other": max(0, total - research - checkpoint)}
        out: dict[str, Any] = {"interval_s": interval_s, "source": source, "access": access}
        if self.trunk_iface:
            trunk_total = self._step("trunk_total", max(0, int(self.tx_total(self.trunk_iface))))
            out["trunk"] = {"research": max(0, trunk_total - own), "checkpoint": min(own, trunk_total), "other": 0}
        if first or not 0 < interval_s <= MAX_REPORT_INTERVAL_S:  # after a long gap the delta is no one report's
            return None
        return out
