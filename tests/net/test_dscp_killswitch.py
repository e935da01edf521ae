"""DSCP marking and the kill-switch on real TCP (design §4 "Enforcement", design §1 kill-switch).

DSCP is read at the receiver by its own kill-switch program (mode OFF), which counts received bytes per DSCP
code point; the kill-switch is exercised with real connection attempts while a real transfer is running.
"""

from __future__ import annotations

import time

import pytest

from nodeagent.enforcement import FlowClass, FlowSpec, KillSwitchMode, LinkPlan, make_enforcer
from nodeagent.enforcement.netlab import Lab, iperf_results

pytestmark = pytest.mark.net

MBIT_BYTES_PER_S = 1_000_000 // 8


def test_dscp_on_received_packets_matches_class(lab: Lab, bpf_ok: None) -> None:
    """EF / AF41 / CS1 flows and an unlisted research flow arrive with DSCP 46 / 34 / 8 / 0 (with a valid IPv4
    checksum, or the receiver would have dropped them)."""
    plan = LinkPlan.from_spec(1000 * MBIT_BYTES_PER_S)
    classes = {5201: FlowClass.EMERGENCY, 5202: FlowClass.MIGRATION, 5203: FlowClass.PRESYNC}
    research = 5300
    with (
        make_enforcer(lab.dev(0), plan, netns=lab.ns(0), backend="bpf_htb", fallback=False) as tx,
        make_enforcer(lab.dev(1), plan, netns=lab.ns(1), backend="bpf_htb", fallback=False) as rx,
    ):
        tx.set_flows([FlowSpec(lab.ip(1), p, c, 50 * MBIT_BYTES_PER_S) for p, c in classes.items()])
        ports = [*classes, research]
        servers = {p: lab.iperf_server(1, p) for p in ports}
        clients = {p: lab.iperf_client(0, lab.ip(1), p, 1.5, "-b", "50M") for p in ports}
        for p in ports:
            iperf_results(servers[p], clients[p], skip_s=0)
        sent = tx.read_counters()["flows"]
        seen = rx.read_counters()["rx_dscp"]
    print("sent by flow:", {k: v["bytes"] for k, v in sent.items()}, "received by DSCP:", seen)
    assert set(seen) <= {0, 8, 34, 46}, f"unexpected DSCP values {set(seen)}"
    for port, cls in classes.items():
        sent_bytes = sent[f"{lab.ip(1)}:{port}"]["bytes"]
        assert seen.get(cls.dscp, {}).get("bytes", 0) >= 0.95 * sent_bytes, (
            f"{cls.name} not seen as {cls.dscp}"
        )
    assert seen[0]["bytes"] > 1_000_000  # the research flow, unmarked


def test_killswitch_no_new_blocks_new_connections_established_transfer_completes(
    lab: Lab, bpf_ok: None
) -> None:
    """Mode NO_NEW (scheduled reclaim): new connections to the provider fail, an established transfer to the
    provider and one from it both run to completion; OFF restores new connections."""
    plan = LinkPlan.from_spec(1000 * MBIT_BYTES_PER_S)
    provider, peer = 0, 1
    with make_enforcer(
        lab.dev(provider), plan, netns=lab.ns(provider), backend="bpf_htb", fallback=False
    ) as enf:
        lab.listener(provider, 6000)  # something that would accept new work
        inbound_srv = lab.iperf_server(provider, 5201)
        outbound_srv = lab.iperf_server(peer, 5202)
        assert lab.can_connect(peer, provider, 6000)
        inbound = lab.iperf_client(peer, lab.ip(provider), 5201, 3, "-b", "100M")
        outbound = lab.iperf_client(provider, lab.ip(peer), 5202, 3, "-b", "100M")
        time.sleep(0.8)
        enf.set_killswitch(KillSwitchMode.NO_NEW)
        assert not lab.can_connect(peer, provider, 6000), "a new connection got through the kill-switch"
        res_in = iperf_results(inbound_srv, inbound, skip_s=1.0)
        res_out = iperf_results(outbound_srv, outbound, skip_s=1.0)
        counters = enf.read_counters()["killswitch"]
        enf.set_killswitch(KillSwitchMode.OFF)
        assert lab.can_connect(peer, provider, 6000)
    print(
        f"during kill-switch: inbound {res_in.goodput_bytes_per_s * 8e-6:.0f} Mbit/s, outbound "
        f"{res_out.goodput_bytes_per_s * 8e-6:.0f} Mbit/s, counters {counters}"
    )
    assert res_in.goodput_bytes_per_s > 0.9 * 100e6 / 8
    assert res_out.goodput_bytes_per_s > 0.9 * 100e6 / 8
    assert counters["syn_dropped"] >= 1


def test_killswitch_strict_keeps_only_established_migrations(lab: Lab, bpf_ok: None) -> None:
    """Mode STRICT (emergency): an established migration transfer (its port allow-listed as a migration flow)
    completes; new connections fail even on the migration port; other traffic (ping) is dropped."""
    plan = LinkPlan.from_spec(1000 * MBIT_BYTES_PER_S)
    provider, dest = 0, 1
    with make_enforcer(
        lab.dev(provider), plan, netns=lab.ns(provider), backend="bpf_htb", fallback=False
    ) as enf:
        enf.set_flows([FlowSpec(lab.ip(dest), 5201, FlowClass.MIGRATION, 200 * MBIT_BYTES_PER_S)])
        srv = lab.iperf_server(dest, 5201)
        migration = lab.iperf_client(provider, lab.ip(dest), 5201, 3)
        lab.listener(provider, 5201)  # a listener on the migration port on the provider itself
        assert lab.exec(dest, "ping", "-c1", "-W1", lab.ip(provider), check=False).returncode == 0
        time.sleep(0.8)
        enf.set_killswitch(KillSwitchMode.STRICT)
        assert not lab.can_connect(dest, provider, 5201), "new connection on a migration port got through"
        assert lab.exec(dest, "ping", "-c1", "-W1", lab.ip(provider), check=False).returncode != 0
        res = iperf_results(srv, migration, skip_s=1.0)
        counters = enf.read_counters()["killswitch"]
        enf.set_killswitch(KillSwitchMode.OFF)
    ratio = res.wire_bytes_per_s / (200 * MBIT_BYTES_PER_S)
    print(f"migration under STRICT: wire ratio {ratio:.4f}, retransmits {res.retransmits}; {counters}")
    assert -0.10 <= ratio - 1 <= 0.03  # held at its rate (below it is the busy sender, see test_shaping)
    assert counters["passed_established"] > 0
    assert counters["syn_dropped"] >= 1 and counters["other_dropped"] >= 1


def test_ipv6_flow_is_shaped_and_marked(lab: Lab, bpf_ok: None) -> None:
    """The classifier parses IPv6 too: the flow gets its rate and its traffic class (DSCP) AF41."""
    lab.add_ipv6()
    plan = LinkPlan.from_spec(1000 * MBIT_BYTES_PER_S)
    with (
        make_enforcer(lab.dev(0), plan, netns=lab.ns(0), backend="bpf_htb", fallback=False) as tx,
        make_enforcer(lab.dev(1), plan, netns=lab.ns(1), backend="bpf_htb", fallback=False) as rx,
    ):
        tx.set_flows([FlowSpec(lab.ip6(1), 5201, FlowClass.MIGRATION, 100 * MBIT_BYTES_PER_S)])
        server = lab.iperf_server(1, 5201, bind=lab.ip6(1))
        res = iperf_results(server, lab.iperf_client(0, lab.ip6(1), 5201, 3), skip_s=1.0)
        sent = tx.read_counters()["flows"][f"[{lab.ip6(1)}]:5201"]["bytes"]
        seen = rx.read_counters()["rx_dscp"]
    ratio = res.wire_bytes_per_s / (100 * MBIT_BYTES_PER_S)
    print(f"IPv6 100 Mbit/s: wire ratio {ratio:.4f}, retransmits {res.retransmits}; rx by DSCP {seen}")
    assert abs(ratio - 1) <= 0.03
    assert seen.get(34, {}).get("bytes", 0) >= 0.95 * sent
