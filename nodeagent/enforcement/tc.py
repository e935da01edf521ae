"""pyroute2 plumbing for design §4 "Enforcement": the HTB tree, clsact/BPF attachment, stale clean-up.

Handles: everything we create on a device carries the HTB major ``RN_HTB_MAJOR`` (0x524e, "RN") or, for BPF
filters, a program name starting with ``rn_``; that is how a restarted agent recognises what a previous run
left behind. pyroute2 0.9.7 quirks (STACK.md): a root qdisc is deleted with ``handle=<major>:0,
parent=0xffffffff``; a class rate is changed with ``change-class`` (delete + add of a live class fails).
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from .api import LinkPlan
from .structs import header_constants

log = logging.getLogger(__name__)

_C = header_constants()
HTB_MAJOR: int = _C["RN_HTB_MAJOR"]
ROOT_MINOR: int = _C["RN_HTB_ROOT_MINOR"]
DEFAULT_MINOR: int = _C["RN_HTB_DEFAULT_MINOR"]
FIRST_FLOW_MINOR: int = _C["RN_HTB_FIRST_FLOW_MINOR"]

TC_H_ROOT = 0xFFFFFFFF
CLSACT_INGRESS = 0xFFFFFFF2
CLSACT_EGRESS = 0xFFFFFFF3
BPF_PREFIX = "rn_"
# Filter priorities on clsact: measurement probes run first, enforcement after.
PRIO_PROBE = 1
PRIO_ENFORCE = 10
ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800


def classid(minor: int) -> int:
    """HTB class handle RN:minor as the 32-bit value put into skb->priority."""
    return (HTB_MAJOR << 16) | minor


def open_ipr(netns: str | None = None) -> IPRoute:
    """An rtnetlink socket in the given named netns (``ip netns``), or in our own."""
    return IPRoute(netns=netns) if netns else IPRoute()


def link_index(ipr: IPRoute, ifname: str) -> int:
    """Interface index of ``ifname``; raises LookupError if absent."""
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise LookupError(f"no such device: {ifname}")
    return int(found[0])


def htb_burst_bytes(rate_bytes_per_s: int) -> int:
    """Bucket depth for an HTB class: 1 ms at rate + one MTU frame, like tc's default with HZ=1000.

    pyroute2 0.9.7 computes a near-zero default here (it misreads the kernel clock), so we pass it explicitly.
    """
    return rate_bytes_per_s // 1000 + 1600


def htb_quantum_bytes(rate_bytes_per_s: int) -> int:
    """DRR quantum when classes borrow: rate/10 (tc's r2q) clamped to [MTU, 200000] to silence kernel warnings."""
    return max(1514, min(200_000, rate_bytes_per_s // 10))


@dataclass
class ClassStats:
    """Counters of one HTB class (bytes are L2 frame bytes, GSO segments counted whole)."""

    bytes: int
    packets: int
    drops: int


class HtbTree:
    """Root class at link capacity B, a default class keeping B_res, one class per admitted flow (design §4)."""

    def __init__(self, ipr: IPRoute, index: int, plan: LinkPlan) -> None:
        self.ipr = ipr
        self.index = index
        self.plan = plan
        self.installed = False

    def _class(self, cmd: str, minor: int, parent_minor: int, rate: int, ceil: int) -> None:
        self.ipr.tc(
            cmd,
            "htb",
            self.index,
            handle=classid(minor),
            parent=classid(parent_minor) if parent_minor else (HTB_MAJOR << 16),
            rate=rate,
            ceil=ceil,
            burst=htb_burst_bytes(rate),
            cburst=htb_burst_bytes(ceil),
            quantum=htb_quantum_bytes(rate),
        )

    def install(self) -> None:
        """Create the root qdisc (default class RN:2), the root class and the research class."""
        self.ipr.tc("add", "htb", self.index, handle=HTB_MAJOR << 16, default=DEFAULT_MINOR)
        self.installed = True
        cap = self.plan.capacity_bytes_per_s
        self._class("add-class", ROOT_MINOR, 0, cap, cap)
        self._class("add-class", DEFAULT_MINOR, ROOT_MINOR, max(self.plan.reserve_bytes_per_s, 1), cap)

    def set_plan(self, plan: LinkPlan) -> None:
        """Change B and B_res in place (change-class: flows keep flowing)."""
        self.plan = plan
        cap = plan.capacity_bytes_per_s
        self._class("change-class", ROOT_MINOR, 0, cap, cap)
        self._class("change-class", DEFAULT_MINOR, ROOT_MINOR, max(plan.reserve_bytes_per_s, 1), cap)

    def _ceil(self, rate_bytes_per_s: int, ceil_bytes_per_s: int | None) -> int:
        """ceil within [rate, B]; None: rate (the flow never borrows)."""
        if ceil_bytes_per_s is None:
            return rate_bytes_per_s
        return max(rate_bytes_per_s, min(int(ceil_bytes_per_s), self.plan.capacity_bytes_per_s))

    def add_flow(self, minor: int, rate_bytes_per_s: int, ceil_bytes_per_s: int | None = None) -> None:
        """A flow class guaranteed its rate. ceil = rate (the default): it neither starves nor over-runs; a
        checkpoint flow's ceil above its rate lets it borrow what research leaves idle (design §4
        "Work-conserving reserve"), while research, under its own rate, is always served first."""
        self._class("add-class", minor, ROOT_MINOR, rate_bytes_per_s, self._ceil(rate_bytes_per_s, ceil_bytes_per_s))

    def change_flow(self, minor: int, rate_bytes_per_s: int, ceil_bytes_per_s: int | None = None) -> None:
        """Rate (and ceil) update in place; the class's queue and the other classes are untouched."""
        self._class("change-class", minor, ROOT_MINOR, rate_bytes_per_s,
                    self._ceil(rate_bytes_per_s, ceil_bytes_per_s))

    def delete_flow(self, minor: int) -> None:
        """Remove a flow class (after its steering is gone, so nothing is queued into it any more)."""
        try:
            # No kind here: with "htb" pyroute2 0.9.7 tries to encode rate tables and fails.
            self.ipr.tc("del-class", index=self.index, handle=classid(minor), parent=classid(ROOT_MINOR))
        except NetlinkError as exc:
            if exc.code != errno.ENOENT:
                raise

    def stats(self) -> dict[int, ClassStats]:
        """Counters by class minor."""
        out: dict[int, ClassStats] = {}
        for msg in self.ipr.get_classes(self.index):
            handle = msg["handle"]
            if handle >> 16 != HTB_MAJOR:
                continue
            st = msg.get_attr("TCA_STATS") or {}
            out[handle & 0xFFFF] = ClassStats(st.get("bytes", 0), st.get("packets", 0), st.get("drop", 0))
        return out

    def remove(self) -> None:
        """Delete the root qdisc, and with it every class and leaf queue."""
        if self.installed:
            delete_root_qdisc(self.ipr, self.index)
            self.installed = False


def delete_root_qdisc(ipr: IPRoute, index: int) -> None:
    """Delete our HTB root qdisc if present (ENOENT/EINVAL mean it is already gone)."""
    try:
        ipr.tc("del", index=index, handle=HTB_MAJOR << 16, parent=TC_H_ROOT)
    except NetlinkError as exc:
        if exc.code not in (errno.ENOENT, errno.EINVAL):
            raise


def ensure_clsact(ipr: IPRoute, index: int) -> bool:
    """Add the clsact qdisc (hook points for TC BPF). Returns True if we created it."""
    try:
        ipr.tc("add", "clsact", index)
        return True
    except NetlinkError as exc:
        if exc.code != errno.EEXIST:
            raise
        return False


def attach_bpf(ipr: IPRoute, index: int, fd: int, name: str, *, ingress: bool, prio: int) -> None:
    """Attach a loaded SCHED_CLS program in direct-action mode (its return value is the verdict)."""
    ipr.tc(
        "add-filter",
        "bpf",
        index,
        ":1",
        fd=fd,
        name=name,
        parent=CLSACT_INGRESS if ingress else CLSACT_EGRESS,
        classid=1,
        direct_action=True,
        prio=prio,
    )


def list_filters(ipr: IPRoute, index: int, parent: int) -> list[tuple[int, str | None, str]]:
    """(prio, bpf program name, kind) of the filters on a clsact hook; [] if there is no clsact."""
    out = []
    try:
        msgs = ipr.get_filters(index, parent=parent)
    except NetlinkError:
        return []
    for msg in msgs:
        if not msg["handle"]:
            continue  # the per-priority head entry pyroute2 also lists
        prio = msg["info"] >> 16
        name = msg.get_nested("TCA_OPTIONS", "TCA_BPF_NAME") if msg.get_attr("TCA_KIND") == "bpf" else None
        out.append((prio, name, msg.get_attr("TCA_KIND")))
    return out


def detach_bpf(ipr: IPRoute, index: int, *, ingress: bool, prio: int) -> None:
    """Remove the filters at ``prio`` on one clsact hook (ignore if already gone)."""
    try:
        ipr.tc("del-filter", "bpf", index, parent=CLSACT_INGRESS if ingress else CLSACT_EGRESS, prio=prio)
    except NetlinkError as exc:
        if exc.code not in (errno.ENOENT, errno.EINVAL):
            raise


def remove_clsact_if_ours(ipr: IPRoute, index: int) -> bool:
    """Delete clsact when nothing but our own ``rn_*`` filters remain on it (someone else's stay)."""
    found = [f for parent in (CLSACT_INGRESS, CLSACT_EGRESS) for f in list_filters(ipr, index, parent)]
    if any(not (name or "").startswith(BPF_PREFIX) for _, name, _ in found):
        return False
    try:
        ipr.tc("del", "clsact", index)
    except NetlinkError as exc:
        if exc.code not in (errno.ENOENT, errno.EINVAL):
            raise
        return False
    return True


def cleanup_stale(ipr: IPRoute, index: int) -> list[str]:
    """Remove what an earlier agent left on this device (the egress enforcement of design §4 "Enforcement").

    1. our HTB root (major RN) goes, with all its classes;
    2. our ``rn_*`` BPF filters go from both clsact hooks; clsact itself goes if nothing else uses it.
    Returns a description of what was removed (empty if the device was clean).
    """
    removed: list[str] = []
    for q in ipr.get_qdiscs(index):
        if q["parent"] == TC_H_ROOT and q["handle"] >> 16 == HTB_MAJOR:
            delete_root_qdisc(ipr, index)
            removed.append("htb root qdisc")
    for parent, ingress in ((CLSACT_INGRESS, True), (CLSACT_EGRESS, False)):
        for prio, name, _ in list_filters(ipr, index, parent):
            if (name or "").startswith(BPF_PREFIX):
                detach_bpf(ipr, index, ingress=ingress, prio=prio)
                removed.append(f"bpf filter {name}")
    has_clsact = any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index))
    if removed and has_clsact and remove_clsact_if_ours(ipr, index):
        removed.append("clsact")
    if removed:
        log.warning("removed stale enforcement state on ifindex %d: %s", index, ", ".join(removed))
    return removed
