"""Bytes per traffic class (design §4 "Calibrated reserve"): the agent's deltas, the portal's boundary checks
(every refusal names its field) and the per-link, per-class samples the heartbeats leave."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from control_helpers import make_node
from django.utils import timezone

from nodeagent.classbytes import ClassBytes, TransferTally


def _beat(node_id: int, at: dt.datetime, class_bytes: dict[str, Any] | None) -> Any:
    from portal.control.link.handlers import HeartbeatSeen

    msg: dict[str, Any] = {"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {}, "jobs": []}
    if class_bytes is not None:
        msg["class_bytes"] = class_bytes
    return HeartbeatSeen(node_id, None, None, at, msg)


GOOD = {"interval_s": 2.0, "source": "agent", "access": {"research": 1000, "checkpoint": 500, "other": 0}}


@pytest.mark.parametrize(("change", "field"), [
    ({"interval_s": 0}, "class_bytes.interval_s"),
    ({"interval_s": float("nan")}, "class_bytes.interval_s"),
    ({"interval_s": "2"}, "class_bytes.interval_s"),
    ({"access": {"research": -1}}, "class_bytes.access.research"),
    ({"access": {"research": 1.5}}, "class_bytes.access.research"),
    ({"access": {"research": True}}, "class_bytes.access.research"),
    ({"access": {"video": 3}}, "class_bytes.access.video"),
    ({"access": {"research": 10**13}}, "class_bytes.access"),
    ({"trunk": {"checkpoint": -5}}, "class_bytes.trunk.checkpoint"),
    ({"trunk": []}, "class_bytes.trunk"),
    ({"core": {}}, "class_bytes.core"),
    ({"source": "x" * 40}, "class_bytes.source"),
])
def test_a_malformed_report_is_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    from portal.control.link.protocol import ProtocolError, validate

    msg = {"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {}, "jobs": [], "class_bytes": {**GOOD, **change}}
    with pytest.raises(ProtocolError) as err:
        validate(msg)
    assert f"heartbeat.{field}" in str(err.value)


def test_a_missing_access_scope_is_refused() -> None:
    from portal.control.link.protocol import ProtocolError, validate

    msg = {"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {}, "jobs": [],
           "class_bytes": {"interval_s": 2.0}}
    with pytest.raises(ProtocolError, match=r"heartbeat\.class_bytes\.access: missing"):
        validate(msg)


def test_a_good_report_passes() -> None:
    from portal.control.link.protocol import validate

    validate({"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {}, "jobs": [],
              "class_bytes": {**GOOD, "trunk": {"research": 7, "checkpoint": 0, "other": 0}}})


@pytest.mark.django_db
def test_heartbeats_store_access_and_trunk_samples_once_per_period(settings: Any) -> None:
    from portal.control.link.handlers import record_heartbeats
    from portal.core.lifecycle import nodes as node_lifecycle
    from portal.core.models import Link, LinkClassSample

    settings.RECLAIMNET = {**settings.RECLAIMNET, "CLASS_SAMPLE_PERIOD_S": 60.0}
    node, _ = make_node("cb1")
    node_lifecycle.come_online(node)
    t0 = timezone.now()
    report = {**GOOD, "trunk": {"research": 9000, "checkpoint": 500, "other": 0}}
    record_heartbeats([_beat(node.pk, t0, report)])
    record_heartbeats([_beat(node.pk, t0 + dt.timedelta(seconds=2), report)])  # same period: not stored
    record_heartbeats([_beat(node.pk, t0 + dt.timedelta(seconds=61), {**GOOD, "access": {"research": 4}})])
    record_heartbeats([_beat(node.pk, t0 + dt.timedelta(seconds=130), None)])  # an older agent: nothing
    node.refresh_from_db()
    access = LinkClassSample.objects.filter(link_id=node.access_link_id).order_by("sampled_at")
    assert [(s.research_bytes, s.checkpoint_bytes, s.scope) for s in access] == [(1000, 500, "access"),
                                                                                 (4, 0, "access")]
    assert access[0].research_bytes_per_s == pytest.approx(500.0)
    uplink = Link.objects.get(name="up-A")
    trunk = LinkClassSample.objects.get(link=uplink)
    assert (trunk.scope, trunk.research_bytes, trunk.checkpoint_bytes, trunk.node_id) == ("trunk", 9000, 500, node.pk)


# --- the agent's side --------------------------------------------------------------------------------------------

class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_agent_without_kernel_counters_splits_by_its_own_transfers() -> None:
    tx = {"eth0": 1_000}
    tally, clock = TransferTally(), _Clock()
    cb = ClassBytes(lambda iface: tx[iface or "eth0"], tally=tally, clock=clock)
    assert cb.report(None, "eth0") is None  # the first call only sets the baseline
    tx["eth0"] += 10_000
    tally.add("presync", 4_000)
    clock.t += 2.0
    out = cb.report(None, "eth0")
    assert out == {"interval_s": 2.0, "source": "agent",
                   "access": {"research": 6_000, "checkpoint": 4_000, "other": 0}}


def test_agent_with_kernel_counters_uses_flow_classes_and_survives_removed_flows() -> None:
    tx = {"eth0": 0}
    clock = _Clock()
    cb = ClassBytes(lambda iface: tx["eth0"], tally=TransferTally(), clock=clock)

    def counters(research: int, flows: dict[str, tuple[str, int]]) -> dict[str, Any]:
        return {"backend": "bpf_htb", "unclassified": {"bytes": research},
                "flows": {k: {"flow_class": c, "bytes": b} for k, (c, b) in flows.items()}}

    cb.report(counters(100, {"10.0.0.2:7000": ("PRESYNC", 50)}), "eth0")
    tx["eth0"] = 5_000
    clock.t += 2.0
    out = cb.report(counters(2_100, {"10.0.0.2:7000": ("PRESYNC", 1_050), "10.0.0.3:7000": ("MIGRATION", 700)}),
                    "eth0")
    assert out is not None
    assert out["access"] == {"research": 2_000, "checkpoint": 1_700, "other": 1_300}
    assert out["source"] == "bpf_htb"
    # the flow was removed and re-created: its counter restarts, the delta is its new value, never negative
    tx["eth0"] = 5_200
    clock.t += 2.0
    out = cb.report(counters(2_150, {"10.0.0.2:7000": ("PRESYNC", 30)}), "eth0")
    assert out is not None and out["access"]["checkpoint"] == 30 and out["access"]["research"] == 50
    assert min(out["access"].values()) >= 0


def test_agent_reports_a_trunk_it_sees() -> None:
    tx = {"eth0": 0, "uplink0": 0}
    tally, clock = TransferTally(), _Clock()
    cb = ClassBytes(lambda iface: tx[iface or "eth0"], trunk_iface="uplink0", tally=tally, clock=clock)
    cb.report(None, "eth0")
    tx["eth0"], tx["uplink0"] = 3_000, 50_000
    tally.add("migration", 2_000)
    clock.t += 1.0
    out = cb.report(None, "eth0")
    assert out is not None
    assert out["trunk"] == {"research": 48_000, "checkpoint": 2_000, "other": 0}


@pytest.mark.asyncio
async def test_the_real_agents_heartbeats_carry_class_bytes_the_portal_accepts(tmp_path: Any) -> None:
    """The agent's heartbeat loop (no kernel backend: its own transfer accounting and /proc/net/dev) sends
    ``class_bytes`` from its second beat on, and the portal's boundary accepts every beat."""
    import asyncio
    import json

    from nodeagent.agent import Agent
    from nodeagent.config import build_config
    from portal.control.link.protocol import validate

    class Socket:
        def __init__(self) -> None:
            self.sent: list[dict[str, Any]] = []

        async def send(self, text: str) -> None:
            self.sent.append(json.loads(text))

    cfg = build_config({"token": "t", "portal": "ws://127.0.0.1:1", "data_dir": str(tmp_path / "data"),
                        "allow_unconfined_jobs": True,  # under pytest's 0700 tmp_path: no job user reaches it
                        "enforcement": "off"}, {})
    agent = Agent(cfg)
    agent.heartbeat_interval_s = 0.05
    ws = Socket()
    task = asyncio.create_task(agent._heartbeat_loop(ws))  # type: ignore[arg-type]
    while len(ws.sent) < 3:
        await asyncio.sleep(0.02)
    task.cancel()
    beats = [m for m in ws.sent if m["type"] == "heartbeat"]
    for beat in beats:
        assert validate(beat) == "heartbeat"
    assert "class_bytes" not in beats[0]
    later = beats[-1]["class_bytes"]
    assert later["source"] == "agent" and later["interval_s"] > 0
    assert set(later["access"]) == {"research", "checkpoint", "other"}
