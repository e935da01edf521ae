"""The node agent's enforcement seam (nodeagent.edge.Edge) engages the real kernel backend (design §4).

Pins the contract between the agent and ``nodeagent.enforcement``: with root and BPF, an agent configured
with an interface shapes its transfers in the kernel (not in userspace), arms the kill-switch there, reads
per-flow counters, and removes everything when it closes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from nodeagent.edge import Edge

pytestmark = pytest.mark.net


def _tc(*args: str) -> str:
    return subprocess.run(["tc", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def veth(bpf_ok: None) -> Iterator[str]:
    """A veth pair of our own in the root namespace (no traffic is sent); deleted after the test."""
    name = f"rnedge{os.getpid() % 100000}"
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", f"{name}p"], check=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True)


def test_agent_edge_uses_the_kernel_backend_and_cleans_up(veth: str) -> None:
    edge = Edge(veth, "auto", link_capacity_bytes_per_s=125_000_000)
    try:
        assert edge.kernel_paced and edge.backend_name == "bpf_htb"
        pacer = edge.pacer("10.99.0.2", 7070, "migration", 12_500_000)
        assert pacer.rate_bytes_per_s is None  # the kernel paces; the sender must not pace twice
        counters = edge.counters()
        assert counters is not None and counters["backend"] == "bpf_htb"
        assert any("7070" in key for key in counters["flows"])
        assert "htb" in _tc("qdisc", "show", "dev", veth)
        edge.killswitch(True)
        assert edge.counters()["killswitch"]  # type: ignore[index]
        edge.flow_done("10.99.0.2", 7070)
        assert not any("7070" in key for key in edge.counters()["flows"])  # type: ignore[index]
    finally:
        edge.close()
    qdiscs = _tc("qdisc", "show", "dev", veth)
    assert "htb" not in qdiscs and "clsact" not in qdiscs


def test_agent_edge_off_paces_in_userspace(veth: str) -> None:
    edge = Edge(veth, "off")
    assert not edge.kernel_paced and edge.backend_name == "userspace"
    assert edge.pacer("10.99.0.2", 7070, "migration", 1_000_000).rate_bytes_per_s == 1_000_000
    assert "htb" not in _tc("qdisc", "show", "dev", veth)
