"""The one seam between the agent and edge enforcement (design §4 "Enforcement").

If ``nodeagent.enforcement`` offers a real kernel backend, admitted flows are shaped by it and the kill-switch
is a BPF flag; otherwise (no-op backend, no privileges, module missing) the agent paces its own transfers with a
userspace :class:`TokenBucket` and the kill-switch only stops jobs and refuses new transfers. DSCP marking by
class is always done on the socket (``IP_TOS``), whatever the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from typing import Any

from scheduler.p3 import DSCP

log = logging.getLogger(__name__)

DSCP_BY_CLASS = DSCP  # design §4: the class → DSCP table lives with P3


class TokenBucket:
    """Userspace pacing at ``rate_bytes_per_s`` with a ``burst_bytes`` bucket (design §4, P3 rate).

    ``rate_bytes_per_s`` <= 0 or None means unpaced.
    """

    def __init__(self, rate_bytes_per_s: float | None, burst_bytes: int = 128 * 1024) -> None:
        self.rate_bytes_per_s = rate_bytes_per_s if rate_bytes_per_s and rate_bytes_per_s > 0 else None
        self.burst_bytes = burst_bytes
        self._tokens = float(burst_bytes)
        self._last = time.monotonic()

    def set_rate(self, rate_bytes_per_s: float | None) -> None:
        """Change the rate of a running flow (design §4 joint re-planning): tokens earned so far are credited at
        the old rate, everything after at the new one; a sender asleep on a debt wakes at most one chunk late."""
        now = time.monotonic()
        if self.rate_bytes_per_s is not None:
            self._tokens = min(self.burst_bytes, self._tokens + (now - self._last) * self.rate_bytes_per_s)
        else:
            self._tokens = min(self._tokens, float(self.burst_bytes))
        self._last = now
        self.rate_bytes_per_s = rate_bytes_per_s if rate_bytes_per_s and rate_bytes_per_s > 0 else None

    async def consume(self, n_bytes: int) -> None:
        """Wait until ``n_bytes`` may be sent (tokens may go negative by one chunk; the debt is slept off)."""
        if self.rate_bytes_per_s is None:
            return
        now = time.monotonic()
        self._tokens = min(self.burst_bytes, self._tokens + (now - self._last) * self.rate_bytes_per_s)
        self._last = now
        self._tokens -= n_bytes
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.rate_bytes_per_s)


def mark_socket(sock: socket.socket, dscp: int) -> None:
    """Set the DSCP code point on a socket (IP_TOS carries DSCP in its upper 6 bits)."""
    tos = (dscp & 0x3F) << 2
    with contextlib.suppress(OSError):
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
        else:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)


class Edge:
    """The agent's egress control: kernel backend when available, userspace pacing otherwise."""

    def __init__(
        self, ifname: str | None, mode: str = "auto", link_capacity_bytes_per_s: float | None = None
    ) -> None:
        """``mode``: ``auto`` (strongest backend the kernel allows), ``off``, or a backend name."""
        self.ifname = ifname
        self._enforcer: Any = None
        self.backend_name = "userspace"
        if mode == "off" or not ifname:
            return
        try:
            from nodeagent import enforcement

            capacity = link_capacity_bytes_per_s or enforcement.link_speed_bytes_per_s(ifname) or 125e6
            plan = enforcement.LinkPlan.from_spec(capacity_bytes_per_s=int(capacity))
            enforcer = enforcement.make_enforcer(ifname, plan, backend=None if mode == "auto" else mode)
        except Exception as exc:  # no privileges, no BCC, no such device: fall back, but say why
            log.warning("kernel enforcement unavailable on %s (%s); pacing in userspace", ifname, exc)
            return
        if enforcer.backend_name == "noop":
            enforcer.close()
            return
        self._enforcer = enforcer
        self.backend_name = enforcer.backend_name

    @property
    def kernel_paced(self) -> bool:
        return self._enforcer is not None

    def pacer(self, dst_ip: str, dst_port: int, flow_class: str, rate_bytes_per_s: float | None) -> TokenBucket:
        """Register a flow with the kernel (if any) and return the pacer the sender should use."""
        if self._enforcer is not None and rate_bytes_per_s:
            try:
                from nodeagent.enforcement.api import FlowClass, FlowSpec

                cls = {"emergency": FlowClass.EMERGENCY, "migration": FlowClass.MIGRATION}.get(
                    flow_class, FlowClass.PRESYNC
                )
                self._enforcer.set_flows([FlowSpec(dst_ip, dst_port, cls, int(rate_bytes_per_s))])
                return TokenBucket(None)
            except Exception as exc:
                log.warning("kernel flow setup failed (%s); pacing in userspace", exc)
        return TokenBucket(rate_bytes_per_s)

    def update_rate(self, dst_ip: str, dst_port: int, flow_class: str, rate_bytes_per_s: float,
                    pacer: TokenBucket | None) -> None:
        """Apply a new P3 rate to a flow already sending: the kernel flow is updated in place when the kernel
        shapes it (its userspace pacer is unpaced), else the userspace pacer changes rate."""
        if self._enforcer is not None and (pacer is None or pacer.rate_bytes_per_s is None):
            try:
                from nodeagent.enforcement.api import FlowClass, FlowSpec

                cls = {"emergency": FlowClass.EMERGENCY, "migration": FlowClass.MIGRATION}.get(
                    flow_class, FlowClass.PRESYNC
                )
                self._enforcer.set_flows([FlowSpec(dst_ip, dst_port, cls, int(rate_bytes_per_s))])
                return
            except Exception as exc:
                log.warning("kernel rate update failed (%s); pacing in userspace", exc)
        if pacer is not None:
            pacer.set_rate(rate_bytes_per_s)

    def borrow_idle_reserve(self, research_bytes_per_s: float | None) -> None:
        """design §4 "Work-conserving reserve": checkpoint flows may borrow the part of research's reserve that
        research leaves idle (the kernel backend's HTB ceil); a no-op without a kernel backend."""
        if self._enforcer is None or not hasattr(self._enforcer, "borrow_idle_reserve"):
            return
        try:
            self._enforcer.borrow_idle_reserve(research_bytes_per_s)
        except Exception as exc:
            log.warning("checkpoint ceiling not set in the kernel: %s", exc)

    def set_reserve_share(self, share: float) -> None:
        """The portal's research reserve as a share of the link (design §4 "Calibrated reserve"): the kernel
        backend's research class keeps share × B; a no-op without a kernel backend."""
        if self._enforcer is None or not hasattr(self._enforcer, "set_reserve"):
            return
        try:
            self._enforcer.set_reserve(int(share * self._enforcer.plan.capacity_bytes_per_s))
        except Exception as exc:
            log.warning("research reserve not set in the kernel: %s", exc)

    def flow_done(self, dst_ip: str, dst_port: int) -> None:
        if self._enforcer is not None:
            with contextlib.suppress(Exception):
                self._enforcer.remove_flow(dst_ip, dst_port)

    def killswitch(self, engaged: bool, allow_ports: tuple[int, ...] = ()) -> None:
        """Engage/disengage the kernel kill-switch (design §4); a no-op without a kernel backend."""
        if self._enforcer is None:
            return
        try:
            from nodeagent.enforcement.api import KillSwitchMode

            mode = KillSwitchMode.NO_NEW if engaged else KillSwitchMode.OFF
            self._enforcer.set_killswitch(mode, allow_ports=allow_ports)
        except Exception as exc:
            log.warning("kill-switch not set in the kernel: %s", exc)

    def counters(self) -> dict[str, Any] | None:
        """Per-flow counters from the kernel backend, or None (the caller falls back to /proc/net/dev)."""
        if self._enforcer is None:
            return None
        try:
            return dict(self._enforcer.read_counters())
        except Exception:
            return None

    def close(self) -> None:
        if self._enforcer is not None:
            with contextlib.suppress(Exception):
                self._enforcer.close()
