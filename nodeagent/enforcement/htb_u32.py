"""``htb_u32``: design §4 enforcement without BPF (when the kernel refuses BPF programs).

Same HTB tree as ``bpf_htb``; flows are steered by u32 filters on the HTB root instead of by BPF. What is lost:
no DSCP marking (needs BPF or act_pedit), per-flow counters come from the HTB class counters, and the u32 match
assumes IPv4 headers without options / IPv6 without extension headers. The kill-switch is an nftables table
(``inet rn_killswitch``): correct, but a rule-set transaction takes milliseconds where a BPF map write takes
microseconds (see ``make bench-net``), and it has no counters here.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import subprocess
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from .api import EnforcementError, FlowSpec, KillSwitchMode, LinkPlan, flow_label
from .base import BaseEnforcer
from .tc import (
    HTB_MAJOR,
    HtbTree,
    classid,
    cleanup_stale,
    link_index,
    open_ipr,
)

log = logging.getLogger(__name__)

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
# This kernel has no act_gact (u32 cannot drop), so the fallback kill-switch is an nftables table.
NFT_TABLE = "rn_killswitch"


def _flow_keys(spec: FlowSpec) -> tuple[int, list[str]]:
    """u32 match keys ("value/mask+offset", offsets from the IP header) for destination address + port."""
    addr = ipaddress.ip_address(spec.key[0])
    if isinstance(addr, ipaddress.IPv4Address):
        return ETH_P_IP, [f"0x{int(addr):08x}/0xffffffff+16", f"0x{spec.dst_port:08x}/0x0000ffff+20"]
    words = [int.from_bytes(addr.packed[i : i + 4], "big") for i in range(0, 16, 4)]
    keys = [f"0x{w:08x}/0xffffffff+{24 + 4 * i}" for i, w in enumerate(words)]
    return ETH_P_IPV6, [*keys, f"0x{spec.dst_port:08x}/0x0000ffff+40"]


class HtbU32Enforcer(BaseEnforcer):
    """HTB classes + u32 steering (design §4), the fallback when BPF is refused."""

    backend_name = "htb_u32"

    def __init__(self, ifname: str, plan: LinkPlan, *, netns: str | None = None) -> None:
        self._ipr: Any = None
        self._index = 0
        self._htb: HtbTree | None = None
        self._nft_active = False
        super().__init__(ifname, plan, netns=netns)

    def _install(self) -> None:
        self._ipr = open_ipr(self.netns)
        self._index = link_index(self._ipr, self.ifname)
        cleanup_stale(self._ipr, self._index)
        self._clear_ks()  # a table a killed agent left behind
        self._htb = HtbTree(self._ipr, self._index, self.plan)
        self._htb.install()
        log.warning(
            "htb_u32 backend: rates enforced; no DSCP marking, kill-switch via nftables (milliseconds, not microseconds)"
        )

    def _teardown(self) -> None:
        if self._ipr is None:
            return
        try:
            if self._nft_active:
                self._clear_ks()
            if self._htb is not None:
                self._htb.remove()
        finally:
            self._ipr.close()
            self._ipr = None

    # -- flows --------------------------------------------------------------------------------------------
    def _add(self, spec: FlowSpec, minor: int) -> None:
        assert self._htb is not None
        self._htb.add_flow(minor, spec.rate_bytes_per_s, self.flow_ceil(spec))
        proto, keys = _flow_keys(spec)
        # One priority per flow (= its class minor) so the filter can be deleted alone.
        self._ipr.tc(
            "add-filter",
            "u32",
            self._index,
            parent=HTB_MAJOR << 16,
            prio=minor,
            protocol=proto,
            target=classid(minor),
            keys=keys,
        )

    def _update(self, old: FlowSpec, new: FlowSpec, minor: int) -> None:
        assert self._htb is not None
        if old.rate_bytes_per_s != new.rate_bytes_per_s or old.flow_class != new.flow_class:
            self._htb.change_flow(minor, new.rate_bytes_per_s, self.flow_ceil(new))

    def _set_ceil(self, spec: FlowSpec, minor: int, ceil_bytes_per_s: int | None) -> None:
        """design §4 "Work-conserving reserve": the flow's class borrows up to the new ceiling (change-class)."""
        assert self._htb is not None
        self._htb.change_flow(minor, spec.rate_bytes_per_s, ceil_bytes_per_s)

    def _remove(self, spec: FlowSpec, minor: int) -> None:
        assert self._htb is not None
        proto, keys = _flow_keys(spec)
        try:
            # pyroute2 0.9.7 wants the full filter (target, keys) even to delete one; without the kind it
            # ignores prio and deletes every filter on the qdisc.
            self._ipr.tc(
                "del-filter",
                "u32",
                self._index,
                parent=HTB_MAJOR << 16,
                prio=minor,
                protocol=proto,
                target=classid(minor),
                keys=keys,
            )
        except NetlinkError as exc:
            if exc.code != errno.ENOENT:
                raise
        self._htb.delete_flow(minor)

    # -- kill-switch --------------------------------------------------------------------------------------
    def _nft(self, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["nft", "-f", "-"]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        proc = subprocess.run(cmd, input=script, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise EnforcementError(f"nft refused the kill-switch rules: {proc.stderr.strip()}")
        return proc

    def _clear_ks(self) -> None:
        # "add" then "delete" succeeds whether or not the table exists.
        self._nft(f"add table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n", check=False)

    def _set_ks(self, mode: KillSwitchMode, ports: set[int]) -> None:
        """Replace the rule set atomically (one nft transaction): SYN drop; in STRICT also drop everything but
        conntrack-established TCP on allow-listed ports (and ICMPv6 neighbour discovery)."""
        if mode == KillSwitchMode.OFF:
            self._clear_ks()
            return
        rules = ["tcp flags & (syn | ack) == syn drop"]
        if mode == KillSwitchMode.STRICT:
            if ports:
                plist = ", ".join(str(p) for p in sorted(ports))
                rules += [
                    f"tcp sport {{ {plist} }} ct state established accept",
                    f"tcp dport {{ {plist} }} ct state established accept",
                ]
            rules += ["meta l4proto ipv6-icmp accept", "drop"]
        body = "\n".join(f"    {r}" for r in rules)
        # Priority -150: after conntrack (-200), so "ct state" is known.
        self._nft(
            f"add table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n"
            f"table inet {NFT_TABLE} {{\n  chain input {{\n"
            f"    type filter hook input priority -150; policy accept;\n{body}\n  }}\n}}\n"
        )
        self._nft_active = True

    def _counters(self) -> dict[str, Any]:
        assert self._htb is not None
        stats = self._htb.stats()
        flows = {}
        for key, spec in self._flows.items():
            st = stats.get(self._minors[key])
            flows[flow_label(key)] = {
                **self._flow_entry(spec),
                "bytes": st.bytes if st else 0,
                "packets": st.packets if st else 0,
                "dropped_bytes": 0,
                "dropped_packets": st.drops if st else 0,
            }
        default = stats.get(2)
        return {
            "flows": flows,
            "unclassified": {
                "bytes": default.bytes if default else 0,
                "packets": default.packets if default else 0,
            },
            "killswitch": {},
            "rx_dscp": {},
            "dscp_marking": False,
            "htb_classes": {f"{m:#x}": vars(s) for m, s in stats.items()},
        }
