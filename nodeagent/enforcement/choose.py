"""Pick the strongest enforcement the kernel allows (design §4 "Enforcement"); the choice is reported in
telemetry as ``read_counters()["backend"]``.

Order: ``bpf_htb`` (BPF classifier + HTB) > ``htb_u32`` (no BPF) > ``noop`` (not privileged). The paper's
``bpf_tokenbucket`` is never chosen automatically; ask for it by name (or ``RECLAIMNET_ENFORCER``).
"""

from __future__ import annotations

import logging
import os
from functools import cache
from pathlib import Path
from typing import Any

from .api import Enforcer, LinkPlan
from .bccshim import BccUnavailableError, load_bcc

log = logging.getLogger(__name__)

BACKENDS = ("bpf_htb", "bpf_tokenbucket", "htb_u32", "noop")
_CAP_NET_ADMIN = 12
_CAP_BPF = 39
_CAP_SYS_ADMIN = 21

_PROBE_SRC = b"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
int rn_probe(struct __sk_buff *skb) { return TC_ACT_OK; }
"""


def _has_cap(cap: int) -> bool:
    """Whether this process holds a capability in its effective set (from /proc/self/status)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> cap & 1)
    except OSError:
        pass
    return os.geteuid() == 0


@cache
def probe_bpf() -> str | None:
    """None if a TC BPF program compiles and loads here, else the reason it does not (cached)."""
    if not (_has_cap(_CAP_BPF) or _has_cap(_CAP_SYS_ADMIN)):
        return "no CAP_BPF/CAP_SYS_ADMIN"
    try:
        bcc = load_bcc()
        prog = bcc.BPF(text=_PROBE_SRC)
        try:
            prog.load_func(b"rn_probe", bcc.BPF.SCHED_CLS)
        finally:
            prog.cleanup()
    except BccUnavailableError as exc:
        return str(exc)
    except Exception as exc:  # BCC raises bare Exception on compile/verifier failures
        return f"BPF refused: {exc}"
    return None


def choose_backend() -> tuple[str, str]:
    """(backend name, why) for this machine: what :func:`make_enforcer` uses when none is named."""
    forced = os.environ.get("RECLAIMNET_ENFORCER")
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"RECLAIMNET_ENFORCER={forced!r}; expected one of {BACKENDS}")
        return forced, "RECLAIMNET_ENFORCER"
    if not _has_cap(_CAP_NET_ADMIN):
        return "noop", "no CAP_NET_ADMIN (not root): cannot change qdiscs"
    why_not = probe_bpf()
    if why_not is None:
        return "bpf_htb", "BPF programs load"
    return "htb_u32", why_not


def link_speed_bytes_per_s(ifname: str) -> int | None:
    """The device's negotiated speed as bytes/s (design §4's B for an access link), None when the driver does
    not report one (veth, many virtual NICs): then B must come from configuration."""
    try:
        mbit = int(Path(f"/sys/class/net/{ifname}/speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return mbit * 1_000_000 // 8 if mbit > 0 else None


def _construct(name: str, ifname: str, plan: LinkPlan, netns: str | None, **kwargs: Any) -> Enforcer:
    if name == "bpf_htb":
        from .bpf_backend import BpfHtbEnforcer

        return BpfHtbEnforcer(ifname, plan, netns=netns, **kwargs)
    if name == "bpf_tokenbucket":
        from .bpf_backend import BpfTokenBucketEnforcer

        return BpfTokenBucketEnforcer(ifname, plan, netns=netns, **kwargs)
    if name == "htb_u32":
        from .htb_u32 import HtbU32Enforcer

        return HtbU32Enforcer(ifname, plan, netns=netns)
    from .noop import NoopEnforcer

    return NoopEnforcer(ifname, plan, netns=netns, **kwargs)


def make_enforcer(
    ifname: str,
    plan: LinkPlan,
    *,
    netns: str | None = None,
    backend: str | None = None,
    fallback: bool = True,
    **kwargs: Any,
) -> Enforcer:
    """Build an enforcer on ``ifname`` (design §4). ``backend=None`` chooses with :func:`choose_backend`.

    If the chosen backend fails to install and ``fallback`` is true, the next weaker one is tried
    (bpf_* -> htb_u32 -> noop), each failure logged; the returned object's ``backend_name`` says which won.
    """
    reason = "requested"
    if backend is None:
        backend, reason = choose_backend()
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    chain = [backend]
    if fallback:
        chain += [
            b for b in ("htb_u32", "noop") if b != backend and BACKENDS.index(b) > BACKENDS.index(backend)
        ]
    last_error: BaseException | None = None
    for name in chain:
        extra = dict(kwargs) if name == backend else {}
        if name == "noop" and last_error is not None:
            extra["reason"] = f"{chain[0]} failed: {last_error}"
        try:
            enforcer = _construct(name, ifname, plan, netns, **extra)
        except Exception as exc:
            if name == chain[-1]:
                raise
            log.error("enforcement backend %s failed on %s (%s); falling back", name, ifname, exc)
            last_error = exc
            continue
        log.info("enforcement on %s: %s (%s)", ifname, name, reason if name == backend else "fallback")
        return enforcer
    raise AssertionError("unreachable")
