"""Fixtures for the enforcement tests (design §4): a privilege/tool check and a per-test namespace lab.

Every test builds its own namespaces (``rn-<random>-*``) through the ``lab`` fixture, whose finalizer kills
the processes it started and deletes the namespaces, whatever the test did.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from nodeagent.enforcement.netlab import Lab, have_tools


def _why_not_net() -> str | None:
    if os.geteuid() != 0:
        return "not root: network namespaces, qdiscs and BPF need root (CAP_NET_ADMIN, CAP_BPF)"
    missing = have_tools("ip", "tc", "ss", "iperf3", "ping")
    if missing:
        return f"missing tools {missing}: run scripts/install_kernel_deps.sh"
    probe = subprocess.run(["ip", "netns", "add", f"rn-probe-{os.getpid()}"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create network namespaces: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", f"rn-probe-{os.getpid()}"], capture_output=True)
    return None


@pytest.fixture(scope="session")
def net_ok() -> None:
    """Skip (with the reason printed) where namespaces cannot be built."""
    why = _why_not_net()
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def bpf_ok(net_ok: None) -> None:
    """Skip where the kernel (or the missing BCC/headers) refuses BPF programs."""
    from nodeagent.enforcement import probe_bpf

    why = probe_bpf()
    if why:
        pytest.skip(f"BPF refused: {why}")


@pytest.fixture
def lab(net_ok: None) -> Iterator[Lab]:
    """Two hosts on a bridge, each in its own namespace; torn down after the test, pass or fail."""
    network = Lab(2)
    names = list(network.namespaces)
    try:
        yield network
    finally:
        network.close()
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not any(n in left for n in names), f"namespaces left behind: {left}"


@pytest.fixture
def settings() -> SimpleNamespace:
    """Stand-in for pytest-django's ``settings``, which the suite-wide autouse fixture in tests/conftest.py
    asks for: these tests use no Django, so they run the same with or without the django plugin."""
    return SimpleNamespace()
