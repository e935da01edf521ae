"""``make e2e``'s last line (scripts/bench_e2e.py) carries the multiportal scenario's verdict (design §18) beside
the others, from the outcomes tests/e2e writes to reports/e2e_results.json."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import harness


def _bench() -> ModuleType:
    if "bench_e2e" in sys.modules:
        return sys.modules["bench_e2e"]
    spec = importlib.util.spec_from_file_location("bench_e2e", harness.REPO / "scripts" / "bench_e2e.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_e2e"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _line(tmp_path: Path, outcomes: dict[str, str]) -> tuple[str, bool]:
    path = tmp_path / "e2e_results.json"
    path.write_text(json.dumps(outcomes))
    downtime = {"scheduled": [{}], "emergency": [{}]}
    return _bench().summary_line(path, downtime, 42.0, 1)


PASSING = {"test_scheduled_reclaim_is_lossless": "PASS", "test_emergency_resumes_from_presynced_replica": "PASS",
           "test_sigkilled_agent_is_detected_and_job_recovered": "PASS",
           "test_multiportal_reclaim_through_one_daphne_reaches_an_agent_on_the_other": "PASS",
           "test_multiportal_a_killed_daphne_moves_its_agents_and_loses_no_node": "PASS"}


def test_the_last_line_ends_with_the_multiportal_verdict(tmp_path: Path) -> None:
    line, ok = _line(tmp_path, PASSING)
    assert line == ("e2e: scheduled PASS, emergency PASS, sigkill PASS, control p99 42.0 ms, multiportal PASS")
    assert ok


def test_a_failed_multiportal_scenario_fails_the_line(tmp_path: Path) -> None:
    line, ok = _line(tmp_path, {**PASSING, "test_multiportal_a_killed_daphne_moves_its_agents_and_loses_no_node":
                                "FAIL"})
    assert line.endswith("multiportal FAIL") and not ok
    assert "sigkill PASS" in line  # the killed daphne's test is not counted as the agent SIGKILL scenario


def test_a_run_without_the_scenario_is_not_a_pass(tmp_path: Path) -> None:
    outcomes = {k: v for k, v in PASSING.items() if "multiportal" not in k}
    line, ok = _line(tmp_path, outcomes)
    assert line.endswith("multiportal FAIL") and not ok
