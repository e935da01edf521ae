"""The JSON decision contract and CLI (design §5): answers, and exit 2 naming the field on bad input."""

import copy
import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.__main__ import main
from scheduler.contract import ContractError, decide
from scheduler.p1 import P1Jobs, P1Plan, plan_checkpoints

ROOT = Path(__file__).resolve().parents[2]
FLAT = [1e-4] * 24


def p1_request() -> dict[str, Any]:
    return {
        "budget_bytes_per_s": 1e8,
        "jobs": [
            {"id": "a", "hazard_per_s": 1 / 3600, "ckpt_bytes": 3.2e9, "notice_s": 120, "loss_budget_s": 600},
            {"id": "b", "hazard_per_s": 3 / 3600, "ckpt_bytes": 1e9, "cap_bytes_per_s": 1e7},
        ],
    }


def p2_request() -> dict[str, Any]:
    links = [
        {"id": "acc-1", "a": "n1", "b": "sw-A", "bytes_per_s": 1.25e8},
        {"id": "acc-2", "a": "n2", "b": "sw-A", "bytes_per_s": 1.25e8},
        {"id": "acc-3", "a": "n3", "b": "sw-A", "bytes_per_s": 1.25e8},
        {"id": "acc-4", "a": "n4", "b": "sw-B", "bytes_per_s": 1.25e8},
        {"id": "up-A", "a": "sw-A", "b": "core", "bytes_per_s": 3e7},
        {"id": "up-B", "a": "sw-B", "b": "core", "bytes_per_s": 3e7},
    ]
    nodes = [
        {"id": f"n{i}", "building": "A" if i < 4 else "B", "free_gpus": 1, "vram_gb": 24.0 * i, "capability": 8.6,
         "hazard_per_s_by_hour": list(FLAT)}
        for i in range(1, 5)
    ]
    return {"source": "n1", "ckpt_bytes": 3.2e9, "restart_s": 20, "notice_s": None, "remaining_s": 7200,
            "vram_gb": 30, "links": links, "nodes": nodes}


def p3_request() -> dict[str, Any]:
    return {
        "capacity_bytes_per_s": 1.25e8,
        "flows": [
            {"id": "x", "bytes": 3e9, "notice_s": 60, "restart_s": 10},
            {"id": "y", "bytes": 1e9, "notice_s": 60},
            {"id": "z", "bytes": 1e9, "notice_s": 5, "restart_s": 10},
        ],
    }


def run(kind: str, payload: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code = main([kind], io.StringIO(payload), out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1  # one JSON document, nothing else
    return code, json.loads(lines[0])


def test_p1_response_fields() -> None:
    code, body = run("p1", json.dumps(p1_request()))
    assert code == 0
    assert set(body) == {"jobs", "expected_cost"}
    a, b = body["jobs"]
    assert set(a) == {"id", "planned_hazard_per_s", "bandwidth_bytes_per_s", "interval_s", "final_checkpoint",
                      "loss_budget_at_risk"}
    assert [j["planned_hazard_per_s"] for j in body["jobs"]] == [1 / 3600, 3 / 3600]  # no short-notice rate: λ̂
    assert b["bandwidth_bytes_per_s"] == pytest.approx(1e7)  # capped
    assert a["bandwidth_bytes_per_s"] == pytest.approx(9e7)  # the rest of the budget
    assert a["final_checkpoint"] is True and b["final_checkpoint"] is False
    cost = sum(
        lam * j["interval_s"] / 2 + c / (j["bandwidth_bytes_per_s"] * j["interval_s"])
        for j, lam, c in zip(body["jobs"], (1 / 3600, 3 / 3600), (3.2e9, 1e9), strict=True)
    )
    assert body["expected_cost"] == pytest.approx(cost)


def test_p2_response_fields() -> None:
    code, body = run("p2", json.dumps(p2_request()))
    assert code == 0
    assert body["destination"] == "n2"  # n2 (48 GB) and n3 (72 GB) are local; equal scores, smaller id
    assert {c["id"] for c in body["candidates"]} == {"n2", "n3"}
    assert all(c["local"] for c in body["candidates"])
    assert body["excluded"] == []
    assert set(body["candidates"][0]) == {"id", "transfer_s", "survival", "score", "local"}
    req = p2_request()
    req["vram_gb"] = 60
    code, body = run("p2", json.dumps(req))
    assert body["excluded"] == [{"id": "n2", "reason": "vram"}]
    assert body["destination"] == "n3"


def test_p2_no_destination_is_a_status() -> None:
    req = p2_request()
    req["notice_s"] = 1.0  # nothing can be reached in time
    code, body = run("p2", json.dumps(req))
    assert code == 0
    assert body["destination"] is None and body["candidates"] == []
    assert {e["reason"] for e in body["excluded"]} == {"deadline"}


def test_p3_response_fields() -> None:
    code, body = run("p3", json.dumps(p3_request()))
    assert code == 0
    assert body["migration_budget_bytes_per_s"] == pytest.approx(0.7 * 1.25e8)
    assert [f["id"] for f in body["admitted"]] == ["x", "y"]
    assert body["degraded"] == [{"id": "z", "reason": "notice"}]
    assert sum(f["rate"] for f in body["admitted"]) == pytest.approx(0.7 * 1.25e8)
    assert all(f["rate"] >= f["min_rate"] for f in body["admitted"])


@pytest.mark.parametrize(
    ("ids", "winner"),
    [((9, 10), 9), ((10, 9), 9), (("b", "a"), "a"), (("10", "9"), "10"), ((2, "1"), 2)],
)
def test_p3_deadline_ties_go_to_the_smallest_id(ids: tuple, winner: Any) -> None:
    """design §3 "ties: smallest id": JSON integers compare as numbers (9 before 10), strings as strings;
    only one of the two equal-deadline flows fits the 70 B/s budget."""
    req = {"capacity_bytes_per_s": 100.0, "flows": [{"id": x, "bytes": 600.0, "notice_s": 10.0} for x in ids]}
    code, body = run("p3", json.dumps(req))
    assert code == 0
    assert [f["id"] for f in body["admitted"]] == [winner]
    assert [f["id"] for f in body["degraded"]] == [x for x in ids if x != winner]
    assert body["degraded"][0]["reason"] == "capacity"


def mutate(req: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    req = copy.deepcopy(req)
    target = req
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return req


BAD = [
    ("p1", p1_request, ["budget_bytes_per_s"], KeyError, "budget_bytes_per_s"),
    ("p1", p1_request, ["jobs", 0, "hazard_per_s"], 0, "jobs[0].hazard_per_s"),
    ("p1", p1_request, ["jobs", 1, "ckpt_bytes"], -5, "jobs[1].ckpt_bytes"),
    ("p1", p1_request, ["jobs", 1, "ckpt_bytes"], "big", "jobs[1].ckpt_bytes"),
    ("p1", p1_request, ["jobs", 1, "ckpt_bytes"], True, "jobs[1].ckpt_bytes"),
    ("p1", p1_request, ["jobs", 1, "id"], "a", "jobs[1].id"),
    ("p1", p1_request, ["jobs", 0, "cap_bytes_per_s"], 0, "jobs[0].cap_bytes_per_s"),
    ("p1", p1_request, ["jobs"], {"a": 1}, "jobs"),
    ("p1", p1_request, ["jobs", 0], 7, "jobs[0]"),
    ("p1", p1_request, ["guaranteed_budget_bytes_per_s"], 0, "guaranteed_budget_bytes_per_s"),
    ("p1", p1_request, ["guaranteed_budget_bytes_per_s"], -1e7, "guaranteed_budget_bytes_per_s"),
    ("p1", p1_request, ["guaranteed_budget_bytes_per_s"], "NaN", "guaranteed_budget_bytes_per_s"),
    ("p1", p1_request, ["guaranteed_budget_bytes_per_s"], [5e7], "guaranteed_budget_bytes_per_s"),
    ("p1", p1_request, ["guaranteed_budget_bytes_per_s"], 2e8, "guaranteed_budget_bytes_per_s"),  # > the budget
    ("p1", p1_request, ["jobs", 1, "short_notice_hazard_per_s"], -1e-5, "jobs[1].short_notice_hazard_per_s"),
    ("p1", p1_request, ["jobs", 1, "short_notice_hazard_per_s"], "NaN", "jobs[1].short_notice_hazard_per_s"),
    ("p1", p1_request, ["jobs", 1, "short_notice_hazard_per_s"], None, "jobs[1].short_notice_hazard_per_s"),
    ("p1", p1_request, ["jobs", 1, "short_notice_hazard_per_s"], True, "jobs[1].short_notice_hazard_per_s"),
    ("p1", p1_request, ["jobs", 1, "short_notice_hazard_per_s"], 1e16, "jobs[1].short_notice_hazard_per_s"),
    ("p2", p2_request, ["source"], "nowhere", "source"),
    ("p2", p2_request, ["ckpt_holder"], "n9", "ckpt_holder"),
    ("p2", p2_request, ["notice_s"], KeyError, "notice_s"),
    ("p2", p2_request, ["links", 0, "a"], "n2", "links"),  # n2-sw-A twice (a cycle), n1 cut off
    ("p2", p2_request, ["links", 5, "b"], "n4", "links"),  # building B no longer reaches the core
    ("p2", p2_request, ["links", 5, "b"], "sw-B", "links"),  # a link from a switch to itself
    ("p2", p2_request, ["links", 2, "bytes_per_s"], 0, "links[2].bytes_per_s"),
    ("p2", p2_request, ["nodes", 3, "hazard_per_s_by_hour"], [1e-4] * 23, "nodes[3].hazard_per_s_by_hour"),
    ("p2", p2_request, ["nodes", 3, "hazard_per_s_by_hour", 5], -1, "nodes[3].hazard_per_s_by_hour[5]"),
    ("p2", p2_request, ["nodes", 0, "free_gpus"], 1.5, "nodes[0].free_gpus"),
    ("p2", p2_request, ["nodes"], [], "nodes"),
    ("p2", p2_request, ["gpus"], 0, "gpus"),
    ("p3", p3_request, ["capacity_bytes_per_s"], -1, "capacity_bytes_per_s"),
    ("p3", p3_request, ["flows", 2, "notice_s"], None, "flows[2].notice_s"),
    ("p3", p3_request, ["flows", 0, "bytes"], KeyError, "flows[0].bytes"),
    ("p3", p3_request, ["flows", 1, "bytes"], -1e9, "flows[1].bytes"),
    ("p3", p3_request, ["flows", 1, "id"], "x", "flows[1].id"),
    ("p3", p3_request, ["reserve_fraction"], 1.5, "reserve_fraction"),
]


@pytest.mark.parametrize(("kind", "make", "path", "value", "field"), BAD, ids=[f"{b[0]}-{b[4]}" for b in BAD])
def test_malformed_requests_exit_2_naming_the_field(kind: str, make: Any, path: list, value: Any, field: str) -> None:
    code, body = run(kind, json.dumps(mutate(make(), path, value)))
    assert code == 2
    assert set(body) == {"error"}
    assert body["error"].startswith(field + ":")
    with pytest.raises(ContractError) as info:
        decide(kind, mutate(make(), path, value))
    assert info.value.field == field


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ('{"budget_bytes_per_s": NaN, "jobs": []}', "NaN"),
        ('{"budget_bytes_per_s": Infinity, "jobs": []}', "Infinity"),
        ('{"budget_bytes_per_s": 1e999, "jobs": []}', "budget_bytes_per_s"),
        ("not json", "invalid JSON"),
        ("[1, 2]", "request"),
        ("", "invalid JSON"),
    ],
)
def test_unparseable_or_non_finite_input(payload: str, needle: str) -> None:
    code, body = run("p1", payload)
    assert code == 2
    assert needle in body["error"]


def test_unknown_kind() -> None:
    code, body = run("p4", "{}")
    assert code == 2 and body["error"].startswith("kind:")


@pytest.mark.parametrize(
    ("kind", "payload", "field"),
    [
        ("p1", json.dumps(p1_request()), None),
        ("p1", json.dumps(p1_request() | {"guaranteed_budget_bytes_per_s": 2e8}), "guaranteed_budget_bytes_per_s"),
        ("p1", json.dumps(mutate(p1_request(), ["jobs", 1, "short_notice_hazard_per_s"], -1.0)),
         "jobs[1].short_notice_hazard_per_s"),
        ("p2", '{"source": "n1"}', "links"),
        ("p3", '{"capacity_bytes_per_s": 1e8, "flows": [{"id": "x", "bytes": NaN, "notice_s": 1}]}', "request"),
    ],
)
def test_cli_process_exit_codes_and_clean_output(kind: str, payload: str, field: str | None) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler", kind], input=payload, capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert proc.stderr == ""  # never a traceback
    body = json.loads(proc.stdout)
    if field is None:
        assert proc.returncode == 0 and "jobs" in body
    else:
        assert proc.returncode == 2 and body["error"].startswith(field + ":")


def bound_request(**extra: Any) -> dict[str, Any]:
    """A `bound` job beside an `expected` one on a 100 MB/s budget (design §2 "Loss budget modes"), no floor."""
    return {
        "budget_bytes_per_s": 100e6, "min_interval_s": 0, **extra,
        "jobs": [
            {"id": "a", "hazard_per_s": 1e-5, "ckpt_bytes": 1e9, "loss_budget_s": 600, "loss_budget_mode": "bound"},
            {"id": "b", "hazard_per_s": 4e-5, "ckpt_bytes": 2e9},
        ],
    }


def direct_plan(hazard_per_s: list[float], guaranteed: float | None = None) -> P1Plan:
    """`bound_request`'s jobs planned by `plan_checkpoints` itself."""
    jobs = P1Jobs.build(("a", "b"), np.array(hazard_per_s), np.array([1e9, 2e9]),
                        loss_budget_s=np.array([600.0, np.inf]),
                        loss_budget_mode=np.array(["bound", "expected"], dtype=object))
    return plan_checkpoints(jobs, 100e6, min_interval_s=0.0, guaranteed_budget_bytes_per_s=guaranteed)


def test_p1_guaranteed_budget_is_passed_to_plan_checkpoints() -> None:
    """design §2 "Loss budget modes" with §4.2: a `bound` job's transfer time T is taken at its share of the
    guaranteed budget. Through the contract the plan is plan_checkpoints' with the same guaranteed budget, and below
    the borrowed budget it shortens the bound job's interval (T larger, Δ ≤ L_max − T smaller)."""
    without = decide("p1", bound_request())
    assert without == decide("p1", bound_request(guaranteed_budget_bytes_per_s=None))  # null = the budget itself
    assert without == decide("p1", bound_request(guaranteed_budget_bytes_per_s=100e6))
    sure = decide("p1", bound_request(guaranteed_budget_bytes_per_s=40e6))
    plan = direct_plan([1e-5, 4e-5], guaranteed=40e6)
    assert [j["interval_s"] for j in sure["jobs"]] == plan.interval_s.tolist()
    assert [j["bandwidth_bytes_per_s"] for j in sure["jobs"]] == plan.bandwidth_bytes_per_s.tolist()
    assert [j["loss_budget_at_risk"] for j in sure["jobs"]] == plan.loss_budget_at_risk.tolist()
    assert sure["expected_cost"] == plan.expected_cost
    a_sure, a_without = sure["jobs"][0], without["jobs"][0]
    assert a_sure["interval_s"] < a_without["interval_s"] - 1.0
    assert a_without["interval_s"] == direct_plan([1e-5, 4e-5]).interval_s[0]
    assert a_sure["bandwidth_bytes_per_s"] == a_without["bandwidth_bytes_per_s"]  # the share uses the whole budget
    assert sure["jobs"][1] == without["jobs"][1]  # an `expected` job ignores it


def test_p1_short_notice_rate_is_added_to_the_hazard_before_planning() -> None:
    """design §2 "Estimators": the portal's tick plans with λ̂ + the rate of scheduled reclaims whose notice is
    shorter than the job's need; through the contract that is hazard_per_s + short_notice_hazard_per_s, echoed as
    planned_hazard_per_s, and the plan equals one with hazard_per_s = λ̂ + rate."""
    req = bound_request()
    req["jobs"][1]["short_notice_hazard_per_s"] = 1.2e-4
    out = decide("p1", req)
    base = decide("p1", bound_request())
    summed = bound_request()
    summed["jobs"][1]["hazard_per_s"] = 4e-5 + 1.2e-4
    assert out == decide("p1", summed)
    assert [j["planned_hazard_per_s"] for j in out["jobs"]] == [1e-5, 4e-5 + 1.2e-4]
    assert [j["planned_hazard_per_s"] for j in base["jobs"]] == [1e-5, 4e-5]
    assert [j["interval_s"] for j in out["jobs"]] == direct_plan([1e-5, 4e-5 + 1.2e-4]).interval_s.tolist()
    assert out["jobs"][1]["interval_s"] < 0.9 * base["jobs"][1]["interval_s"]  # a higher hazard: more often
    zero = bound_request()
    zero["jobs"][1]["short_notice_hazard_per_s"] = 0
    assert decide("p1", zero) == base  # 0 (the default) changes nothing


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["guaranteed_budget_bytes_per_s"], math.nan, "guaranteed_budget_bytes_per_s"),
        (["guaranteed_budget_bytes_per_s"], math.inf, "guaranteed_budget_bytes_per_s"),
        (["guaranteed_budget_bytes_per_s"], 100e6 * (1 + 1e-9), "guaranteed_budget_bytes_per_s"),
        (["jobs", 0, "short_notice_hazard_per_s"], math.nan, "jobs[0].short_notice_hazard_per_s"),
        (["jobs", 1, "short_notice_hazard_per_s"], -math.inf, "jobs[1].short_notice_hazard_per_s"),
        (["jobs", 1, "short_notice_hazard_per_s"], {"rate": 1}, "jobs[1].short_notice_hazard_per_s"),
    ],
)
def test_p1_non_finite_or_out_of_range_new_fields_name_the_field(path: list, value: Any, field: str) -> None:
    with pytest.raises(ContractError) as info:
        decide("p1", mutate(bound_request(), path, value))
    assert info.value.field == field


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4), st.just([]), st.just({}), st.just([1.0] * 24), st.sampled_from(["n1", "sw-A", "core"]),
)


def leaves(obj: Any, path: tuple = ()) -> list[tuple]:
    """Every path to a value inside a request (dict keys and list indices)."""
    out = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += leaves(v, (*path, i))
    return out


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["p1", "p2", "p3"]), st.data())
def test_fuzzed_requests_answer_or_exit_2_never_crash(kind: str, data: st.DataObject) -> None:
    req = {"p1": p1_request, "p2": p2_request, "p3": p3_request}[kind]()
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in leaves(req) if p]
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        req = mutate(req, list(path), data.draw(st.one_of(JUNK, st.just(KeyError))))
    code, body = run(kind, json.dumps(req))
    assert code in (0, 2), body  # 1 would be an internal error: malformed input must never get that far
    if code == 2:
        assert set(body) == {"error"} and ":" in body["error"]
