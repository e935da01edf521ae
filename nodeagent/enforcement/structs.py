"""ctypes mirror of bpf/reclaimnet.h, the layout the kernel programs and the agent share (design §4).

:func:`header_constants` parses the RN_* ``#define`` lines of the header, so the numbers are read from the one
place they are defined; :func:`check_layout` compares these ctypes sizes with the ones BCC compiled from the
header, so a drift between the two sides fails loudly at load time instead of corrupting a map.
"""

from __future__ import annotations

import ctypes as ct
import ipaddress
import re
from functools import cache
from pathlib import Path
from typing import Any

BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"
if not BPF_DIR.is_dir():  # installed as reclaimnet-agent: the same sources ride along as nodeagent/bpf (design §18)
    BPF_DIR = Path(__file__).resolve().parents[1] / "bpf"
HEADER = BPF_DIR / "reclaimnet.h"

_DEFINE = re.compile(r"^#define\s+(RN_[A-Z0-9_]+)\s+(0x[0-9a-fA-F]+|\d+)\b", re.MULTILINE)


@cache
def header_constants() -> dict[str, int]:
    """All numeric ``#define RN_*`` of reclaimnet.h."""
    return {name: int(value, 0) for name, value in _DEFINE.findall(HEADER.read_text())}


class FlowKey(ct.Structure):
    """struct rn_flow_key."""

    _fields_ = [("daddr", ct.c_uint8 * 16), ("dport", ct.c_uint16), ("pad", ct.c_uint16)]


class FlowInfo(ct.Structure):
    """struct rn_flow_info."""

    _fields_ = [
        ("classid", ct.c_uint32),
        ("flow_class", ct.c_uint8),
        ("pad", ct.c_uint8 * 3),
        ("rate_bytes_per_s", ct.c_uint64),
        ("burst_bytes", ct.c_uint64),
    ]


class FlowStats(ct.Structure):
    """struct rn_flow_stats."""

    _fields_ = [
        ("bytes", ct.c_uint64),
        ("packets", ct.c_uint64),
        ("dropped_bytes", ct.c_uint64),
        ("dropped_packets", ct.c_uint64),
    ]


class Bucket(ct.Structure):
    """struct rn_bucket."""

    _fields_ = [("tokens_bytes", ct.c_uint64), ("last_ns", ct.c_uint64)]


class KsStats(ct.Structure):
    """struct rn_ks_stats."""

    _fields_ = [
        ("syn_dropped", ct.c_uint64),
        ("other_dropped", ct.c_uint64),
        ("passed_established", ct.c_uint64),
        ("first_drop_ns", ct.c_uint64),
    ]


def make_key(dst_ip: str, dst_port: int) -> FlowKey:
    """Build a flow key: IPv4 addresses IPv4-mapped, address in network order, port in host order."""
    addr = ipaddress.ip_address(dst_ip)
    if isinstance(addr, ipaddress.IPv4Address):
        addr = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + addr.packed)
    key = FlowKey()
    ct.memmove(key.daddr, addr.packed, 16)
    key.dport = dst_port
    return key


def key_to_tuple(key: Any) -> tuple[str, int]:
    """Inverse of :func:`make_key` (accepts BCC's generated key type too)."""
    raw = bytes(bytearray(key.daddr))
    addr = ipaddress.IPv6Address(raw)
    text = str(addr.ipv4_mapped) if addr.ipv4_mapped is not None else str(addr)
    return (text, int(key.dport))


def check_layout(bcc_type: type, ours: type) -> None:
    """Fail if BCC's view of a struct (compiled from the header) differs in size from our ctypes mirror."""
    if ct.sizeof(bcc_type) != ct.sizeof(ours):
        raise RuntimeError(
            f"{ours.__name__}: ctypes mirror is {ct.sizeof(ours)} bytes, kernel struct is "
            f"{ct.sizeof(bcc_type)} bytes; bpf/reclaimnet.h and structs.py disagree"
        )
