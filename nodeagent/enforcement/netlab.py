"""A throw-away network of namespaces for the enforcement tests and ``make bench-net`` (design §4).

``Lab`` builds ``n`` hosts, each in its own namespace ``rn-<tag>-h<i>`` with one veth ``rnh<i>`` (address
10.<x>.0.<i+1>/24) plugged into a bridge ``rnbr`` that lives in a namespace of its own (``rn-<tag>-br``), so
nothing touches the machine's own namespace. Every process it starts is tracked by PID and killed, and every
namespace deleted, by :meth:`Lab.close` (also on ``with`` exit). Traffic is real TCP, from iperf3 (Debian) or
Python sockets.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Ethernet + IPv4 + TCP-with-timestamps header bytes per full-size segment: wire = payload * (mss + 66) / mss.
TCP_FRAME_OVERHEAD_BYTES = 66
IPV6_EXTRA_HEADER_BYTES = 20  # an IPv6 header is 40 bytes, IPv4's 20
DEFAULT_MSS_BYTES = 1448


def have_tools(*names: str) -> list[str]:
    """The named executables that are missing from PATH."""
    return [n for n in names if shutil.which(n) is None]


@dataclass
class IperfResult:
    """One iperf3 run, measured at the receiver over the steady-state window.

    ``goodput_bytes_per_s`` is the median of the 0.5 s interval rates in the window: on a shared 2-core machine
    a neighbour's compile can stall the sending process for a moment (the flow is then not backlogged, so the
    shaper is not what limits it), and the median keeps such a stall from being read as a shaping error. The
    plain mean is kept as ``mean_goodput_bytes_per_s``.
    """

    goodput_bytes_per_s: float
    wire_bytes_per_s: float
    retransmits: int
    window_s: float
    mss_bytes: int
    mean_goodput_bytes_per_s: float


class Lab:
    """Namespaces + veths + a bridge; see the module docstring."""

    def __init__(self, n_hosts: int = 2, subnet_octet: int | None = None) -> None:
        self.tag = secrets.token_hex(3)
        self.octet = subnet_octet if subnet_octet is not None else 100 + secrets.randbelow(100)
        self.n_hosts = n_hosts
        self.bridge_ns = f"rn-{self.tag}-br"
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # -- topology -----------------------------------------------------------------------------------------
    def ns(self, i: int) -> str:
        """Namespace of host i."""
        return f"rn-{self.tag}-h{i}"

    def dev(self, i: int) -> str:
        """Host i's interface (inside its namespace)."""
        return f"rnh{i}"

    def ip(self, i: int) -> str:
        """Host i's IPv4 address."""
        return f"10.{self.octet}.0.{i + 1}"

    def ip6(self, i: int) -> str:
        """Host i's IPv6 address (after :meth:`add_ipv6`)."""
        return f"fd00:{self.octet:x}::{i + 1}"

    def add_ipv6(self) -> None:
        """Give every host an IPv6 address too (no duplicate-address detection delay)."""
        for i in range(self.n_hosts):
            self.exec(i, "ip", "-6", "addr", "add", f"{self.ip6(i)}/64", "dev", self.dev(i), "nodad")
        deadline = time.monotonic() + 5
        while self.exec(0, "ping", "-6", "-c1", "-W1", self.ip6(self.n_hosts - 1), check=False).returncode:
            if time.monotonic() > deadline:
                raise RuntimeError("IPv6 did not come up")
            time.sleep(0.1)

    @staticmethod
    def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command in the current namespace."""
        return subprocess.run(cmd, check=check, capture_output=True, text=True)

    def _add_ns(self, name: str) -> None:
        self.sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        self.sh("ip", "-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        self._add_ns(self.bridge_ns)
        self.sh("ip", "-n", self.bridge_ns, "link", "add", "rnbr", "type", "bridge")
        self.sh("ip", "-n", self.bridge_ns, "link", "set", "rnbr", "up")
        for i in range(self.n_hosts):
            self._add_ns(self.ns(i))
            self.sh(
                "ip",
                "link",
                "add",
                "name",
                self.dev(i),
                "netns",
                self.ns(i),
                "type",
                "veth",
                "peer",
                "name",
                f"rnp{i}",
                "netns",
                self.bridge_ns,
            )
            self.sh("ip", "-n", self.bridge_ns, "link", "set", f"rnp{i}", "master", "rnbr", "up")
            self.sh("ip", "-n", self.ns(i), "addr", "add", f"{self.ip(i)}/24", "dev", self.dev(i))
            self.sh("ip", "-n", self.ns(i), "link", "set", self.dev(i), "up")
        # Wait for the bridge ports to forward (no STP, but the ports go through "learning" briefly).
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if self.exec(0, "ping", "-c1", "-W1", self.ip(self.n_hosts - 1), check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError("lab network did not come up")

    # -- processes ----------------------------------------------------------------------------------------
    def exec(
        self, i: int, *cmd: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside host i's namespace and wait for it."""
        return subprocess.run(
            ["ip", "netns", "exec", self.ns(i), *cmd],
            check=check,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def can_connect(self, src: int, dst: int, port: int, timeout_s: float = 0.7) -> bool:
        """Whether a fresh TCP connection (real SYN, real handshake) from host src to host dst:port succeeds."""
        snippet = (
            "import socket,sys; s=socket.socket(); s.settimeout(float(sys.argv[3]));"
            "sys.exit(s.connect_ex((sys.argv[1], int(sys.argv[2]))))"
        )
        proc = self.exec(
            src, sys.executable, "-c", snippet, self.ip(dst), str(port), str(timeout_s), check=False
        )
        return proc.returncode == 0

    def popen(self, i: int, *cmd: str) -> subprocess.Popen[str]:
        """Start a command inside host i's namespace; it is killed by close() if still running."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(i), *cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        """Kill our processes (by PID) and delete our namespaces (which deletes their devices)."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                with contextlib.suppress(Exception):
                    proc.wait(timeout=5)
        self.procs.clear()
        for name in reversed(self.namespaces):
            self.sh("ip", "netns", "del", name, check=False)
        self.namespaces.clear()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- iperf3 -------------------------------------------------------------------------------------------
    def iperf_server(self, i: int, port: int, bind: str | None = None) -> subprocess.Popen[str]:
        """One-shot iperf3 server on host i (on ``bind``, default its IPv4 address), 0.5 s JSON intervals."""
        proc = self.popen(
            i, "iperf3", "-s", "-1", "-J", "-i", "0.5", "-p", str(port), "-B", bind or self.ip(i)
        )
        self._wait_listen(i, port)
        return proc

    def listener(self, i: int, port: int) -> subprocess.Popen[str]:
        """A TCP listener on host i that completes handshakes (kernel backlog) and never reads: "new work"."""
        snippet = (
            "import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
            "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(4096); time.sleep(3600)"
        )
        proc = self.popen(i, sys.executable, "-c", snippet, self.ip(i), str(port))
        self._wait_listen(i, port)
        return proc

    def _wait_listen(self, i: int, port: int, timeout_s: float = 5) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = self.exec(i, "ss", "-Htln", f"sport = :{port}", check=False).stdout
            if out.strip():
                return
            time.sleep(0.05)
        raise RuntimeError(f"nothing listens on port {port} in {self.ns(i)}")

    def iperf_client(self, i: int, dst: str, port: int, seconds: float, *extra: str) -> subprocess.Popen[str]:
        """iperf3 client on host i sending to dst:port for ``seconds`` (JSON to stdout)."""
        return self.popen(i, "iperf3", "-c", dst, "-p", str(port), "-t", str(seconds), "-J", *extra)


def iperf_results(
    server: subprocess.Popen[str], client: subprocess.Popen[str], skip_s: float = 1.0, timeout_s: float = 30
) -> IperfResult:
    """Receiver-side goodput over the intervals starting at or after ``skip_s`` (steady state), converted to a
    wire rate with the segment size the connection used; retransmits from the sender."""
    cout, cerr = client.communicate(timeout=timeout_s)
    sout, _ = server.communicate(timeout=timeout_s)
    if client.returncode != 0:
        raise RuntimeError(f"iperf3 client failed: {cerr or cout[-500:]}")
    cj: dict[str, Any] = json.loads(cout)
    sj: dict[str, Any] = json.loads(sout)
    mss = int(cj.get("start", {}).get("tcp_mss_default") or DEFAULT_MSS_BYTES)
    remote = (cj.get("start", {}).get("connected") or [{}])[0].get("remote_host", "")
    overhead = TCP_FRAME_OVERHEAD_BYTES + (IPV6_EXTRA_HEADER_BYTES if ":" in remote else 0)
    nbytes = 0.0
    secs = 0.0
    rates = []
    for iv in sj["intervals"]:
        s = iv["sum"]
        if s["start"] >= skip_s - 1e-6 and s["seconds"] > 0.2:
            nbytes += s["bytes"]
            secs += s["seconds"]
            rates.append(s["bytes"] / s["seconds"])
    if secs <= 0:
        raise RuntimeError("iperf3 run too short for the steady-state window")
    goodput = statistics.median(rates)
    retrans = int(cj["end"]["sum_sent"].get("retransmits", 0))
    wire = goodput * (mss + overhead) / mss
    return IperfResult(goodput, wire, retrans, secs, mss, nbytes / secs)


def run_parallel_iperf(
    lab: Lab, sender: int, receiver: int, ports: Sequence[int], seconds: float, skip_s: float = 1.0
) -> dict[int, IperfResult]:
    """Start one server per port on ``receiver``, then all clients at once on ``sender``; results by port."""
    servers = {p: lab.iperf_server(receiver, p) for p in ports}
    clients = {p: lab.iperf_client(sender, lab.ip(receiver), p, seconds) for p in ports}
    return {p: iperf_results(servers[p], clients[p], skip_s) for p in ports}
