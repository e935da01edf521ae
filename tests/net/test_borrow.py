"""The work-conserving reserve in the kernel (design §4 "Work-conserving reserve"): a checkpoint flow's HTB class
gets ceil = B − min(R, B_res), so it borrows the reserve research leaves idle, and is back at B − B_res when
research uses its reserve; research traffic, under its own rate, is served first either way."""

from __future__ import annotations

import re
import subprocess

import pytest

from nodeagent.enforcement import FlowClass, FlowSpec, LinkPlan, make_enforcer
from nodeagent.enforcement.netlab import Lab, run_parallel_iperf

pytestmark = pytest.mark.net

MBIT_BYTES_PER_S = 1_000_000 // 8


def mbit(x: float) -> int:
    return int(x * MBIT_BYTES_PER_S)


def _ceil_bits(lab: Lab, minor: str) -> int:
    """The ceil of class 524e:<minor> as tc prints it, in bit/s."""
    out = subprocess.run(["ip", "netns", "exec", lab.ns(0), "tc", "class", "show", "dev", lab.dev(0)],
                         capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if f"524e:{minor} " in ln)
    value, unit = re.search(r"ceil (\d+)([KMG]?)bit", line).groups()  # type: ignore[union-attr]
    return int(value) * {"": 1, "K": 1000, "M": 1_000_000, "G": 1_000_000_000}[unit]


@pytest.mark.parametrize("backend", ["htb_u32", "bpf_htb"])
def test_checkpoint_ceil_follows_measured_research(lab: Lab, backend: str, request: pytest.FixtureRequest) -> None:
    """ceil = rate before any measurement, B with no research, B − B_res with research at its reserve; a migration
    added later gets the current ceiling; the research class is never touched."""
    if backend == "bpf_htb":
        request.getfixturevalue("bpf_ok")
    plan = LinkPlan.from_spec(mbit(400))  # B_res = 120 Mbit/s
    with make_enforcer(lab.dev(0), plan, netns=lab.ns(0), backend=backend, fallback=False) as enf:
        enf.set_flows([FlowSpec(lab.ip(1), 5201, FlowClass.PRESYNC, mbit(50))])
        assert _ceil_bits(lab, "10") == 50_000_000
        assert enf.borrow_idle_reserve(0.0) == mbit(400)
        assert _ceil_bits(lab, "10") == 400_000_000
        assert enf.borrow_idle_reserve(mbit(120)) == mbit(280)
        assert _ceil_bits(lab, "10") == 280_000_000
        enf.set_flows([FlowSpec(lab.ip(1), 5202, FlowClass.MIGRATION, mbit(60))])
        assert _ceil_bits(lab, "11") == 280_000_000
        enf.borrow_idle_reserve(None)  # research not measured: no borrowing beyond the guarantee
        assert _ceil_bits(lab, "10") == 280_000_000
        assert _ceil_bits(lab, "2") == 400_000_000  # research's own class: rate B_res, ceil B, unchanged


def test_a_checkpoint_borrows_the_idle_reserve_on_real_tcp(lab: Lab) -> None:
    """With no research traffic a 50 Mbit/s pre-sync flow runs well above its rate once the ceiling is lifted."""
    plan = LinkPlan.from_spec(mbit(300))
    with make_enforcer(lab.dev(0), plan, netns=lab.ns(0), backend="htb_u32", fallback=False) as enf:
        enf.set_flows([FlowSpec(lab.ip(1), 5201, FlowClass.PRESYNC, mbit(50))])
        enf.borrow_idle_reserve(0.0)
        res = run_parallel_iperf(lab, 0, 1, [5201], seconds=3)[5201]
    ratio = res.wire_bytes_per_s / mbit(50)
    print(f"pre-sync at 50 Mbit/s, ceil 300 Mbit/s, no research: {ratio:.2f}× its rate")
    assert ratio > 2.0  # bounded by the link (6×); the sender on 2 busy cores decides how close it gets


def test_the_portals_reserve_becomes_the_research_class_rate(lab: Lab) -> None:
    """set_reserve (the portal's calibrated B_min): research's class is guaranteed it in place, and the checkpoint
    ceiling with research at that reserve is B − B_min."""
    plan = LinkPlan.from_spec(mbit(400))
    with make_enforcer(lab.dev(0), plan, netns=lab.ns(0), backend="htb_u32", fallback=False) as enf:
        enf.set_flows([FlowSpec(lab.ip(1), 5201, FlowClass.PRESYNC, mbit(50))])
        enf.set_reserve(mbit(200))
        out = subprocess.run(["ip", "netns", "exec", lab.ns(0), "tc", "class", "show", "dev", lab.dev(0)],
                             capture_output=True, text=True, check=True).stdout
        research = next(ln for ln in out.splitlines() if "524e:2 " in ln)
        assert "rate 200Mbit" in research, research
        assert enf.borrow_idle_reserve(mbit(200)) == mbit(200)
        assert _ceil_bits(lab, "10") == 200_000_000
