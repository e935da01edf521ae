"""Rates on real TCP (design §4 "Enforcement", P3): BPF classifier + HTB holds each flow at its set wire rate.

Rates are measured at the receiver over a steady-state window (after the first second), converted from TCP
goodput to Ethernet wire bytes with the connection's MSS; retransmits are the sender's count.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from nodeagent.enforcement import FlowClass, FlowSpec, KillSwitchMode, LinkPlan, make_enforcer
from nodeagent.enforcement.netlab import Lab, iperf_results, run_parallel_iperf

pytestmark = pytest.mark.net

MBIT_BYTES_PER_S = 1_000_000 // 8
TOLERANCE = 0.03  # the shaper's claim: never more than 3 % above the set rate
# Below the set rate is the sender, not the shaper: on 2 cores under a busy test run the iperf pairs deliver less
# than they are allowed (measured 0.89–0.99; 0.886 for one of seven flows in a clean-clone `make test`). A flow
# the shaper held back would sit at its old rate or the reserve, far below. `make bench-net` reports the exact
# ratios on a quiet machine.
SHORTFALL = 0.20
MAX_RETRANSMITS = 5  # "no more than a handful"


def held_at(ratio: float) -> bool:
    """The flow ran at its set rate: at most TOLERANCE above it, at most SHORTFALL below."""
    return -SHORTFALL <= ratio - 1 <= TOLERANCE


def mbit(x: float) -> int:
    """Mbit/s -> bytes/s."""
    return int(x * MBIT_BYTES_PER_S)


# 800 Mbit/s is left to `make bench-net`: on 2 busy cores the iperf pair itself retransmits there (45 in one run).
@pytest.mark.parametrize("rate_mbit", [50, 200])
def test_single_flow_is_held_at_its_set_rate(lab: Lab, bpf_ok: None, rate_mbit: int) -> None:
    """One migration flow shaped by its own HTB class: held at its set rate (never 3 % above), ~0 retransmits."""
    plan = LinkPlan.from_spec(mbit(10_000))
    with make_enforcer(lab.dev(0), plan, netns=lab.ns(0), backend="bpf_htb", fallback=False) as enf:
        enf.set_flows([FlowSpec(lab.ip(1), 5201, FlowClass.MIGRATION, mbit(rate_mbit))])
        res = run_parallel_iperf(lab, 0, 1, [5201], seconds=3.5)[5201]
        counters = enf.read_counters()
    ratio = res.wire_bytes_per_s / mbit(rate_mbit)
    print(f"set {rate_mbit} Mbit/s: wire ratio {ratio:.4f}, retransmits {res.retransmits}")
    assert held_at(ratio), f"wire/set = {ratio:.4f}"
    assert res.retransmits <= MAX_RETRANSMITS
    flow = counters["flows"][f"{lab.ip(1)}:5201"]
    # The BPF wire-byte counter and HTB's own class counter see the same bytes (GSO counted per segment).
    assert flow["bytes"] == counters["htb_classes"]["0x10"]["bytes"]


def test_seven_migrations_and_research_share_1gbit(lab: Lab, bpf_ok: None) -> None:
    """Paper Fig. 4/5: 7 migration flows at their P3 rates + 1 research flow on a 1 Gbit/s bottleneck; each
    migration keeps its rate, research keeps at least B_res = 0.3 B."""
    plan = LinkPlan.from_spec(mbit(1000))
    rates_mbit = {5201 + i: r for i, r in enumerate([50, 60, 80, 100, 120, 140, 150])}  # sum 700 = B_mig
    research_port = 5300
    with make_enforcer(lab.dev(0), plan, netns=lab.ns(0), backend="bpf_htb", fallback=False) as enf:
        enf.set_flows([FlowSpec(lab.ip(1), p, FlowClass.MIGRATION, mbit(r)) for p, r in rates_mbit.items()])
        results = run_parallel_iperf(lab, 0, 1, [*rates_mbit, research_port], seconds=4.5, skip_s=1.5)
    for port, rate in rates_mbit.items():
        ratio = results[port].wire_bytes_per_s / mbit(rate)
        print(
            f"migration {port} set {rate} Mbit/s: ratio {ratio:.4f}, retransmits {results[port].retransmits}"
        )
        assert held_at(ratio), f"flow {port}: wire/set = {ratio:.4f}"
    research = results[research_port].wire_bytes_per_s
    print(
        f"research: {research / MBIT_BYTES_PER_S:.1f} Mbit/s, reserve {plan.reserve_bytes_per_s / MBIT_BYTES_PER_S}"
    )
    assert research >= plan.reserve_bytes_per_s * (1 - SHORTFALL)
    total = sum(r.wire_bytes_per_s for r in results.values())
    assert total <= plan.capacity_bytes_per_s * (1 + TOLERANCE)


def test_rate_update_in_place_does_not_disturb_other_flows(lab: Lab, bpf_ok: None) -> None:
    """A rate change is a change-class on one class: the changed flow moves to its new rate, the other flow's
    rate and class are untouched, no retransmits."""
    plan = LinkPlan.from_spec(mbit(1000))
    a, b = 5201, 5202
    with make_enforcer(lab.dev(0), plan, netns=lab.ns(0), backend="bpf_htb", fallback=False) as enf:
        enf.set_flows(
            [
                FlowSpec(lab.ip(1), a, FlowClass.MIGRATION, mbit(100)),
                FlowSpec(lab.ip(1), b, FlowClass.PRESYNC, mbit(150)),
            ]
        )
        classes_before = lab.exec(0, "tc", "class", "show", "dev", lab.dev(0)).stdout
        servers = {p: lab.iperf_server(1, p) for p in (a, b)}
        clients = {p: lab.iperf_client(0, lab.ip(1), p, 5) for p in (a, b)}
        time.sleep(2.0)
        enf.set_flows([FlowSpec(lab.ip(1), a, FlowClass.MIGRATION, mbit(250))])
        res_a_late = iperf_results(servers[a], clients[a], skip_s=3.0)
        res_b = iperf_results(servers[b], clients[b], skip_s=1.0)
        classes_after = lab.exec(0, "tc", "class", "show", "dev", lab.dev(0)).stdout
        drops_b = enf.read_counters()["htb_classes"]["0x11"]["drops"]
    ratio_a = res_a_late.wire_bytes_per_s / mbit(250)
    ratio_b = res_b.wire_bytes_per_s / mbit(150)
    print(f"after update a: {ratio_a:.4f}; untouched b over the whole run: {ratio_b:.4f}, "
          f"{res_b.retransmits} retransmits, {drops_b} dropped by its class")
    assert held_at(ratio_a), f"a: wire/set = {ratio_a:.4f}"
    assert held_at(ratio_b), f"b: wire/set = {ratio_b:.4f}"
    # A class replaced or reset under b would drop what it queued. Retransmits are not the shaper's to answer
    # for: on a quiet machine b has none, but a receiver starved of CPU in its namespace drops on the veth
    # backlog (89 in one clean-clone `make test` at load average ~2), so the shaper's own counter is asserted.
    assert drops_b == 0
    line_b = [ln for ln in classes_before.splitlines() if "524e:11 " in ln]
    assert line_b and line_b[0] in classes_after  # b's class is byte-for-byte the same


def test_htb_u32_fallback_shapes_without_bpf(lab: Lab) -> None:
    """The no-BPF backend (design §4 fallback) shapes with HTB + u32 to the same accuracy (no DSCP marking), and
    its kill-switch blocks new connections."""
    plan = LinkPlan.from_spec(mbit(1000))
    with make_enforcer(lab.dev(0), plan, netns=lab.ns(0), backend="htb_u32", fallback=False) as enf:
        assert enf.backend_name == "htb_u32"
        enf.set_flows([FlowSpec(lab.ip(1), 5201, FlowClass.MIGRATION, mbit(200))])
        res = run_parallel_iperf(lab, 0, 1, [5201], seconds=3)[5201]
        counters = enf.read_counters()
        lab.listener(0, 6000)
        assert lab.can_connect(1, 0, 6000)
        enf.set_killswitch(KillSwitchMode.NO_NEW)  # nftables here: this kernel has no act_gact for u32
        assert not lab.can_connect(1, 0, 6000)
        enf.set_killswitch(KillSwitchMode.OFF)
        assert lab.can_connect(1, 0, 6000)
    ratio = res.wire_bytes_per_s / mbit(200)
    print(f"htb_u32 200 Mbit/s: ratio {ratio:.4f}, retransmits {res.retransmits}")
    assert held_at(ratio), f"wire/set = {ratio:.4f}"
    assert counters["flows"][f"{lab.ip(1)}:5201"]["bytes"] > 0
    assert counters["dscp_marking"] is False
    leftover = subprocess.run(
        ["ip", "netns", "exec", lab.ns(0), "tc", "qdisc", "show", "dev", lab.dev(0)],
        capture_output=True,
        text=True,
    ).stdout
    assert "htb" not in leftover


@pytest.mark.parametrize("backend", ["bpf_htb", "htb_u32"])
def test_remove_flow_returns_traffic_to_research_class(lab: Lab, bpf_ok: None, backend: str) -> None:
    """remove_flow() deletes the flow's class and steering; its traffic then runs in the research class,
    which may borrow up to the link capacity."""
    plan = LinkPlan.from_spec(mbit(1000))
    with make_enforcer(lab.dev(0), plan, netns=lab.ns(0), backend=backend, fallback=False) as enf:
        enf.set_flows(
            [
                FlowSpec(lab.ip(1), 5201, FlowClass.MIGRATION, mbit(50)),
                FlowSpec(lab.ip(1), 5202, FlowClass.MIGRATION, mbit(60)),
            ]
        )
        assert enf.remove_flow(lab.ip(1), 5201) is True
        assert enf.remove_flow(lab.ip(1), 5201) is False
        classes = lab.exec(0, "tc", "class", "show", "dev", lab.dev(0)).stdout
        assert "524e:10 " not in classes and "524e:11 " in classes
        filters = lab.exec(0, "tc", "filter", "show", "dev", lab.dev(0), "parent", "524e:").stdout
        assert "524e:10" not in filters and ("524e:11" in filters) == (backend == "htb_u32")
        res = run_parallel_iperf(lab, 0, 1, [5201], seconds=2.5)[5201]
        enf.set_flows([FlowSpec(lab.ip(1), 5203, FlowClass.PRESYNC, mbit(40))], replace=True)
        assert set(enf.flows()) == {(lab.ip(1), 5203)}
    ratio = res.wire_bytes_per_s / plan.capacity_bytes_per_s
    print(f"{backend}: removed flow now runs at {ratio:.3f} of the link (research class ceil)")
    # Held by its old class it would run at 0.05 of the link; the research class guarantees 0.3 and lends up to
    # the whole link. Above 0.5 it borrowed; how near 1.0 it gets is the sender's CPU (0.85–1.0 measured).
    assert ratio > 0.5
