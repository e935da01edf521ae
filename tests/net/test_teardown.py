"""Everything attached is removed (design §4 "Enforcement"): on close, on error during install, and by the next
agent after a crash. Plus the checks that need no privileges: header/ctypes agreement and the noop backend."""

from __future__ import annotations

import ctypes as ct
import logging
import signal
import subprocess
import sys

import pytest

from nodeagent.enforcement import (
    DSCP_BY_CLASS,
    FlowClass,
    FlowSpec,
    KillSwitchMode,
    LinkPlan,
    bpf_backend,
    choose_backend,
    make_enforcer,
    structs,
)
from nodeagent.enforcement.netlab import Lab
from scheduler.p3 import DSCP

MBIT_BYTES_PER_S = 1_000_000 // 8


def tc_state(lab: Lab, i: int) -> str:
    """All qdiscs, classes and filters on host i's device, as tc prints them."""
    dev = lab.dev(i)
    parts = [
        lab.exec(i, "tc", "qdisc", "show", "dev", dev).stdout,
        lab.exec(i, "tc", "class", "show", "dev", dev).stdout,
        lab.exec(i, "tc", "filter", "show", "dev", dev, "ingress", check=False).stdout,
        lab.exec(i, "tc", "filter", "show", "dev", dev, "egress", check=False).stdout,
    ]
    return "".join(parts)


def assert_clean(lab: Lab, i: int) -> None:
    state = tc_state(lab, i)
    assert "htb" not in state and "clsact" not in state and "bpf" not in state and "class" not in state, state


@pytest.mark.net
@pytest.mark.parametrize("backend", ["bpf_htb", "bpf_tokenbucket"])
def test_close_leaves_no_qdisc_filter_class_or_map(lab: Lab, bpf_ok: None, backend: str) -> None:
    """After close(): the device has only its default qdisc, and every BPF map and program is freed."""
    _bpfsys = pytest.importorskip("_bpfsys")
    before = tc_state(lab, 0)
    enf = make_enforcer(
        lab.dev(0),
        LinkPlan.from_spec(1000 * MBIT_BYTES_PER_S),
        netns=lab.ns(0),
        backend=backend,
        fallback=False,
    )
    enf.set_flows([FlowSpec(lab.ip(1), 5201, FlowClass.MIGRATION, 10 * MBIT_BYTES_PER_S)])
    enf.set_killswitch(KillSwitchMode.NO_NEW, allow_ports=[7000])
    objs = []
    for prog in (enf._egress, enf._ks):
        objs += [("map", _bpfsys.obj_id(t.map_fd)) for t in (prog[n] for n in list(prog.tables))]
        objs += [("prog", _bpfsys.obj_id(fn.fd)) for fn in prog.funcs.values()]
    assert len(objs) >= 6
    assert tc_state(lab, 0) != before
    enf.close()
    enf.close()  # idempotent
    assert_clean(lab, 0)
    assert tc_state(lab, 0) == before
    assert _bpfsys.wait_gone(objs) == [], "BPF maps/programs still alive after close()"


@pytest.mark.net
def test_install_error_rolls_back(lab: Lab, bpf_ok: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """If attaching fails half-way (HTB and the egress filter already in place), nothing is left behind."""
    real = bpf_backend.attach_bpf

    def fail_on_ingress(*args: object, ingress: bool, prio: int) -> None:
        if ingress:
            raise OSError("injected failure")
        real(*args, ingress=ingress, prio=prio)  # type: ignore[arg-type]

    monkeypatch.setattr(bpf_backend, "attach_bpf", fail_on_ingress)
    with pytest.raises(OSError, match="injected"):
        bpf_backend.BpfHtbEnforcer(lab.dev(0), LinkPlan.from_spec(10**8), netns=lab.ns(0))
    assert_clean(lab, 0)


@pytest.mark.net
def test_restart_cleans_what_a_killed_agent_left(lab: Lab, bpf_ok: None) -> None:
    """An agent killed with SIGKILL (no atexit) leaves HTB + filters; the next one removes them first."""
    script = (
        "import sys,time; from nodeagent.enforcement import *; "
        "e=make_enforcer(sys.argv[1], LinkPlan.from_spec(10**8), netns=sys.argv[2], backend='bpf_htb', "
        "fallback=False); print('ready', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, lab.dev(0), lab.ns(0)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    stale = tc_state(lab, 0)
    assert "524e:" in stale and "rn_classify" in stale and "rn_killswitch" in stale
    with make_enforcer(
        lab.dev(0), LinkPlan.from_spec(10**8), netns=lab.ns(0), backend="bpf_htb", fallback=False
    ) as enf:
        state = tc_state(lab, 0)
        assert state.count("name rn_classify") == 1 and state.count("name rn_killswitch") == 1
        assert enf.read_counters()["backend"] == "bpf_htb"
    assert_clean(lab, 0)


def test_header_constants_match_python() -> None:
    """bpf/reclaimnet.h and the Python side agree on classes, DSCP values, modes and struct sizes."""
    c = structs.header_constants()
    for cls in FlowClass:
        assert c[f"RN_CLASS_{cls.name}"] == cls.value
    # Each class's code point, in C and in Python, is the one design §4 (scheduler.p3.DSCP) gives that class.
    header_name = {"EMERGENCY": "EF", "MIGRATION": "AF41", "PRESYNC": "CS1", "RESEARCH": "BE"}
    for cls in FlowClass:
        assert c[f"RN_DSCP_{header_name[cls.name]}"] == DSCP[cls.name.lower()] == DSCP_BY_CLASS[cls]
    for mode in KillSwitchMode:
        assert c[{"OFF": "RN_KS_OFF", "NO_NEW": "RN_KS_NO_NEW", "STRICT": "RN_KS_STRICT"}[mode.name]] == mode
    assert ct.sizeof(structs.FlowKey) == 20 and ct.sizeof(structs.FlowInfo) == 24
    key = structs.make_key("10.1.2.3", 5201)
    assert structs.key_to_tuple(key) == ("10.1.2.3", 5201)


def test_noop_backend_says_nothing_is_enforced(caplog: pytest.LogCaptureFixture) -> None:
    """Without privileges the agent still runs, and says loudly that nothing is enforced."""
    plan = LinkPlan.from_spec(10**8)
    with caplog.at_level(logging.ERROR), make_enforcer("rnnone0", plan, backend="noop") as enf:
        enf.set_flows([FlowSpec("10.0.0.1", 5201, FlowClass.MIGRATION, 10**6)])
        enf.set_killswitch(KillSwitchMode.NO_NEW)
        counters = enf.read_counters()
    assert counters["backend"] == "noop" and counters["enforced"] is False
    assert "NOTHING IS ENFORCED" in caplog.text and "NOT ENFORCED" in caplog.text


def test_budget_protects_the_research_reserve() -> None:
    """Flow rates above B_mig = B - B_res are refused before anything is changed (design §4, Theorem 4)."""
    plan = LinkPlan.from_spec(1000 * MBIT_BYTES_PER_S)
    with make_enforcer("rnnone0", plan, backend="noop") as enf:
        with pytest.raises(ValueError, match="migration budget"):
            enf.set_flows([FlowSpec("10.0.0.1", 5201, FlowClass.MIGRATION, 800 * MBIT_BYTES_PER_S)])
        assert enf.flows() == {}


@pytest.mark.net
def test_interpreter_exit_removes_unclosed_enforcer(lab: Lab, bpf_ok: None) -> None:
    """An agent that exits without calling close() (normal exit or an uncaught exception) is cleaned by the
    atexit hook."""
    script = (
        "import sys; from nodeagent.enforcement import *; "
        "e=make_enforcer(sys.argv[1], LinkPlan.from_spec(10**8), netns=sys.argv[2], backend='bpf_htb', "
        "fallback=False); e.set_flows([FlowSpec(sys.argv[3], 5201, FlowClass.MIGRATION, 10**6)]); "
        "raise SystemExit(3)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, lab.dev(0), lab.ns(0), lab.ip(1)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr
    assert_clean(lab, 0)


@pytest.mark.net
def test_choice_follows_the_kernel_and_is_reported(lab: Lab, bpf_ok: None) -> None:
    """Where BPF loads (root here), the automatic choice is bpf_htb, and telemetry names it."""
    assert choose_backend()[0] == "bpf_htb"
    with make_enforcer(lab.dev(0), LinkPlan.from_spec(10**8), netns=lab.ns(0)) as enf:
        assert enf.read_counters()["backend"] == "bpf_htb"


def test_unprivileged_process_gets_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without CAP_NET_ADMIN (not root) the choice is noop, with the reason; no kernel call is attempted."""
    from nodeagent.enforcement import choose

    monkeypatch.delenv("RECLAIMNET_ENFORCER", raising=False)
    monkeypatch.setattr(choose, "_has_cap", lambda cap: False)
    name, why = choose_backend()
    assert name == "noop" and "not root" in why
    with make_enforcer("rnnone0", LinkPlan.from_spec(10**8)) as enf:
        assert enf.backend_name == "noop"
