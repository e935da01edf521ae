"""Bookkeeping every enforcement backend shares (design §4 "Enforcement").

The base class keeps the flow table, hands out HTB class numbers, checks the migration budget, serialises
calls, and guarantees clean-up: ``close()`` from ``with``, from an ``atexit`` hook, and from ``__init__`` when
installing fails half-way. Backends implement the ``_install/_add/_update/_remove/_set_ks/_counters/_teardown``
hooks only.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from scheduler.reserve import checkpoint_ceil_bytes_per_s

from .api import FlowClass, FlowSpec, KillSwitchMode, LinkPlan, check_budget, flow_key
from .tc import FIRST_FLOW_MINOR

log = logging.getLogger(__name__)

MAX_FLOW_MINOR = 0xFFFF


# Strong references: an enforcer nobody closed must still be cleaned up at exit, not lost to the GC.
_LIVE: set[BaseEnforcer] = set()


@atexit.register
def _close_all_at_exit() -> None:
    """Interpreter exit: remove whatever enforcers are still installed."""
    for enforcer in list(_LIVE):
        try:
            enforcer.close()
        except Exception:
            log.exception("clean-up of %r at exit failed", enforcer)


class BaseEnforcer:
    """Common part of all backends; see :class:`nodeagent.enforcement.api.Enforcer` for the contract."""

    backend_name = "base"

    def __init__(self, ifname: str, plan: LinkPlan, *, netns: str | None = None) -> None:
        """Install enforcement on ``ifname`` (in the named netns, if any); undo everything if that fails.

        1. register the atexit hook first, so even a crash in step 2 is cleaned up at exit;
        2. ``_install()`` (backend specific: stale clean-up, then qdiscs/programs);
        3. on any exception, ``close()`` and re-raise.
        """
        self.ifname = ifname
        self.netns = netns
        self.plan = plan
        self._flows: dict[tuple[str, int], FlowSpec] = {}
        self._minors: dict[tuple[str, int], int] = {}
        self._next_minor = FIRST_FLOW_MINOR
        self._free_minors: list[int] = []
        self._ks_mode = KillSwitchMode.OFF
        # design §4 "Work-conserving reserve": the HTB ceil of checkpoint flows (None: ceil = rate, no borrowing)
        self._checkpoint_ceil: int | None = None
        self._ks_ports: set[int] = set()
        self._lock = threading.RLock()
        self._closed = False
        _LIVE.add(self)
        try:
            self._install()
        except BaseException:
            self.close()
            raise
        log.info(
            "enforcement backend %s active on %s%s",
            self.backend_name,
            ifname,
            f" (netns {netns})" if netns else "",
        )

    # -- hooks -------------------------------------------------------------------------------------------
    def _install(self) -> None:
        raise NotImplementedError

    def _add(self, spec: FlowSpec, minor: int) -> None:
        raise NotImplementedError

    def _update(self, old: FlowSpec, new: FlowSpec, minor: int) -> None:
        raise NotImplementedError

    def _remove(self, spec: FlowSpec, minor: int) -> None:
        raise NotImplementedError

    def _set_ks(self, mode: KillSwitchMode, ports: set[int]) -> None:
        raise NotImplementedError

    def _counters(self) -> dict[str, Any]:
        raise NotImplementedError

    def _teardown(self) -> None:
        raise NotImplementedError

    def _set_ceil(self, spec: FlowSpec, minor: int, ceil_bytes_per_s: int | None) -> None:
        """Change one flow's ceil in place (backends without HTB: nothing to do)."""

    def set_reserve(self, reserve_bytes_per_s: int) -> LinkPlan:
        """The portal's research reserve for this link (design §4 "Calibrated reserve"): the research class is
        guaranteed it from now on (HTB change-class in place), and the checkpoint ceiling is recomputed at the
        next measurement. Flows already admitted are left as they are (P3 sized them within the same reserve)."""
        self._check_open()
        cap = self.plan.capacity_bytes_per_s
        plan = LinkPlan(cap, max(0, min(int(reserve_bytes_per_s), cap)))
        with self._lock:
            self.plan = plan
            self._set_plan(plan)
            self._checkpoint_ceil = None
        return plan

    def _set_plan(self, plan: LinkPlan) -> None:
        """Apply a new capacity/reserve to the kernel (backends without HTB: nothing to do)."""
        htb = getattr(self, "_htb", None)
        if htb is not None:
            htb.set_plan(plan)

    def flow_ceil(self, spec: FlowSpec) -> int | None:
        """The ceil a flow's HTB class gets: the checkpoint ceiling for checkpoint classes, None for research."""
        if spec.flow_class == FlowClass.RESEARCH:
            return None
        return self._checkpoint_ceil

    def borrow_idle_reserve(self, research_bytes_per_s: float | None) -> int:
        """design §4 "Work-conserving reserve": checkpoint flows may use B − min(R, B_res), R the measured
        research rate (None: not measured, no borrowing). Applied in place to every checkpoint flow whose
        ceiling changed; returns the ceiling."""
        self._check_open()
        plan = self.plan
        research = float("nan") if research_bytes_per_s is None else float(research_bytes_per_s)
        ceil = int(checkpoint_ceil_bytes_per_s(plan.capacity_bytes_per_s, plan.reserve_bytes_per_s, research))
        with self._lock:
            if ceil == self._checkpoint_ceil:
                return ceil
            self._checkpoint_ceil = ceil
            for key, spec in self._flows.items():
                if spec.flow_class != FlowClass.RESEARCH:
                    self._set_ceil(spec, self._minors[key], ceil)
        return ceil

    # -- public API --------------------------------------------------------------------------------------
    def _alloc_minor(self) -> int:
        if self._free_minors:
            return self._free_minors.pop()
        if self._next_minor > MAX_FLOW_MINOR:
            raise RuntimeError("out of HTB class numbers")
        self._next_minor += 1
        return self._next_minor - 1

    def set_flows(self, flows: Sequence[FlowSpec], *, replace: bool = False) -> None:
        """Add or update flows in place (design §4); ``replace`` also removes flows not listed.

        1. validate the whole resulting set against B_mig before touching the kernel;
        2. removals first (they free budget), then updates (change in place), then additions;
        3. flows that are not mentioned are never touched, so their traffic is not disturbed.
        """
        self._check_open()
        with self._lock:
            wanted = {f.key: f for f in flows}
            result = dict(wanted) if replace else {**self._flows, **wanted}
            check_budget(self.plan, result.values())
            if replace:
                for key in [k for k in self._flows if k not in wanted]:
                    self.remove_flow(*key)
            for key, spec in wanted.items():
                old = self._flows.get(key)
                if old == spec:
                    continue
                if old is not None:
                    self._update(old, spec, self._minors[key])
                else:
                    minor = self._alloc_minor()
                    try:
                        self._add(spec, minor)
                    except BaseException:
                        self._free_minors.append(minor)
                        raise
                    self._minors[key] = minor
                self._flows[key] = spec
            if self._ks_mode != KillSwitchMode.OFF:
                self._set_ks(self._ks_mode, self._allowed_ports())

    def remove_flow(self, dst_ip: str, dst_port: int) -> bool:
        """Stop enforcing one flow (design §4); its later packets fall into the research class."""
        self._check_open()
        key = flow_key(dst_ip, dst_port)
        with self._lock:
            spec = self._flows.get(key)
            if spec is None:
                return False
            minor = self._minors.pop(key)
            del self._flows[key]
            self._remove(spec, minor)
            self._free_minors.append(minor)
            return True

    def flows(self) -> dict[tuple[str, int], FlowSpec]:
        """Flows currently enforced."""
        with self._lock:
            return dict(self._flows)

    def _allowed_ports(self) -> set[int]:
        migration = {f.dst_port for f in self._flows.values() if f.flow_class != FlowClass.RESEARCH}
        return self._ks_ports | migration

    def set_killswitch(self, mode: KillSwitchMode, allow_ports: Iterable[int] = ()) -> None:
        """Switch the provider's kill-switch (design §1, §4). Ports of enforced migration flows are always
        allowed in STRICT mode, so scheduled-reclaim transfers finish."""
        self._check_open()
        with self._lock:
            self._ks_mode = KillSwitchMode(mode)
            self._ks_ports = {int(p) for p in allow_ports}
            self._set_ks(self._ks_mode, self._allowed_ports())
        log.warning("kill-switch on %s set to %s", self.ifname, self._ks_mode.name)

    def read_counters(self) -> dict[str, Any]:
        """Telemetry (design §4): the backend name plus what the backend can count."""
        self._check_open()
        with self._lock:
            out: dict[str, Any] = {
                "backend": self.backend_name,
                "ifname": self.ifname,
                "killswitch_mode": self._ks_mode.name,
            }
            out.update(self._counters())
            return out

    def _flow_entry(self, spec: FlowSpec) -> dict[str, Any]:
        return {
            "dst_ip": spec.dst_ip,
            "dst_port": spec.dst_port,
            "flow_class": spec.flow_class.name,
            "dscp": spec.flow_class.dscp,
            "rate_bytes_per_s": spec.rate_bytes_per_s,
        }

    def close(self) -> None:
        """Remove everything this enforcer attached (idempotent, safe from atexit)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            _LIVE.discard(self)
            try:
                self._teardown()
            finally:
                log.info("enforcement backend %s removed from %s", self.backend_name, self.ifname)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.backend_name} enforcer on {self.ifname} is closed")

    def __enter__(self) -> BaseEnforcer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.backend_name} on {self.ifname} flows={len(self._flows)}>"
