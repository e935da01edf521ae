"""The node agent's view of edge enforcement (design §4 "Enforcement"): what it asks for, whatever the backend.

The agent hands an :class:`Enforcer` the admitted flows of P3 (destination, class, rate) and flips the
provider's kill-switch; the backend decides how the kernel does it. Units are SI (design §5): bytes per second.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol, runtime_checkable

from scheduler.p3 import DSCP, migration_budget_bytes_per_s


class EnforcementError(RuntimeError):
    """The kernel refused an operation (or the request cannot be enforced)."""


class FlowClass(IntEnum):
    """Traffic classes of design §4; the values equal the RN_CLASS_* constants of bpf/reclaimnet.h."""

    EMERGENCY = 0  # emergency checkpoint metadata
    MIGRATION = 1  # planned migration
    PRESYNC = 2  # checkpoint pre-sync
    RESEARCH = 3  # research / best effort

    @property
    def dscp(self) -> int:
        """DSCP code point stamped on this class's packets (design §4: EF 46, AF41 34, CS1 8, BE 0)."""
        return DSCP_BY_CLASS[self]


DSCP_BY_CLASS: dict[FlowClass, int] = {cls: DSCP[cls.name.lower()] for cls in FlowClass}  # design §4, one table


class KillSwitchMode(IntEnum):
    """Kill-switch modes (design §1, §4); values equal RN_KS_* of bpf/reclaimnet.h."""

    OFF = 0
    NO_NEW = 1  # drop new inbound TCP connections (SYN); established transfers continue (scheduled reclaim)
    STRICT = 2  # drop everything but established migration transfers on allow-listed ports


@dataclass(frozen=True)
class FlowSpec:
    """One admitted egress flow (design §4): traffic to ``dst_ip:dst_port`` gets ``rate_bytes_per_s``.

    ``rate_bytes_per_s`` is a wire rate (Ethernet frames); TCP goodput is about 1448/1514 of it.
    """

    dst_ip: str
    dst_port: int
    flow_class: FlowClass
    rate_bytes_per_s: int

    def __post_init__(self) -> None:
        ipaddress.ip_address(self.dst_ip)  # raises ValueError on a malformed address
        if not 0 < self.dst_port < 65536:
            raise ValueError(f"dst_port out of range: {self.dst_port}")
        if self.rate_bytes_per_s <= 0:
            raise ValueError(f"rate_bytes_per_s must be > 0: {self.rate_bytes_per_s}")
        object.__setattr__(self, "flow_class", FlowClass(self.flow_class))

    @property
    def key(self) -> tuple[str, int]:
        """(normalised address, port): the identity of the flow."""
        return flow_key(self.dst_ip, self.dst_port)


def flow_key(dst_ip: str, dst_port: int) -> tuple[str, int]:
    """Normalise a destination so '10.0.0.1' and '::ffff:10.0.0.1' name the same flow."""
    addr = ipaddress.ip_address(dst_ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return (str(addr), int(dst_port))


def flow_label(key: tuple[str, int]) -> str:
    """Telemetry name of a flow: ``10.0.0.7:7000`` or ``[fd00::7]:7000``."""
    addr, port = key
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


@dataclass(frozen=True)
class LinkPlan:
    """The bottleneck an enforcer shapes (design §4): capacity B and research reserve B_res, bytes/s."""

    capacity_bytes_per_s: int
    reserve_bytes_per_s: int

    def __post_init__(self) -> None:
        if self.capacity_bytes_per_s <= 0:
            raise ValueError("capacity_bytes_per_s must be > 0")
        if not 0 <= self.reserve_bytes_per_s <= self.capacity_bytes_per_s:
            raise ValueError("reserve_bytes_per_s must be within [0, capacity_bytes_per_s]")

    @property
    def migration_budget_bytes_per_s(self) -> int:
        """B_mig = B - B_res (design §4)."""
        return self.capacity_bytes_per_s - self.reserve_bytes_per_s

    @classmethod
    def from_spec(
        cls, capacity_bytes_per_s: int, beta: float = 0.3, reserve_min_bytes_per_s: int = 0
    ) -> LinkPlan:
        """B_res = max(beta * B, B_min) (design §4), i.e. B minus P3's migration budget."""
        budget = int(migration_budget_bytes_per_s(capacity_bytes_per_s, beta, reserve_min_bytes_per_s))
        return cls(capacity_bytes_per_s, capacity_bytes_per_s - budget)


def check_budget(plan: LinkPlan, flows: Iterable[FlowSpec]) -> None:
    """Refuse a flow set that would eat into the research reserve (design §4, Theorem 4: migration <= B - B_res)."""
    total = sum(f.rate_bytes_per_s for f in flows)
    if total > plan.migration_budget_bytes_per_s:
        raise ValueError(
            f"flow rates sum to {total} B/s, above the migration budget "
            f"{plan.migration_budget_bytes_per_s} B/s (B - B_res)"
        )


@runtime_checkable
class Enforcer(Protocol):
    """What the node agent uses (design §4 "Enforcement"). Backends: bpf_htb, bpf_tokenbucket, htb_u32, noop.

    An enforcer owns what it attached to one device and removes it in :meth:`close` (also on ``with`` exit,
    at interpreter exit, and from the next agent's start if this process died).
    """

    backend_name: str
    ifname: str

    def set_flows(self, flows: Sequence[FlowSpec], *, replace: bool = False) -> None:
        """Add flows or change their class/rate in place; with ``replace``, also remove flows not listed."""
        ...

    def remove_flow(self, dst_ip: str, dst_port: int) -> bool:
        """Stop enforcing one flow; its traffic falls back to the research class. False if unknown."""
        ...

    def flows(self) -> dict[tuple[str, int], FlowSpec]:
        """The flows now enforced, by (address, port)."""
        ...

    def set_killswitch(self, mode: KillSwitchMode, allow_ports: Iterable[int] = ()) -> None:
        """Switch the kill-switch; ``allow_ports`` (plus migration flows' ports) survive STRICT mode."""
        ...

    def read_counters(self) -> dict[str, Any]:
        """Telemetry: backend, per-flow wire bytes/packets/drops, kill-switch counters, rx bytes by DSCP."""
        ...

    def close(self) -> None:
        """Remove everything attached. Idempotent."""
        ...

    def __enter__(self) -> Enforcer: ...

    def __exit__(self, *exc: object) -> None: ...
