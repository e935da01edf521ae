"""``manage.py export_trace``: the portal's history as a design §7 trace that the simulator's own loader reads
back with the same counts and fields (JSON file and CSV folder)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from scheduler.sim import __main__ as sim_cli
from scheduler.sim.trace import load
from tests.whatif.conftest import History


def _export(history: History, out: Path, *extra: str) -> str:
    stdout = io.StringIO()
    call_command("export_trace", str(out), "--since", history.since.isoformat(), "--until",
                 history.until.isoformat(), *extra, stdout=stdout)
    return stdout.getvalue()


@pytest.mark.parametrize("name", ["trace.json", "trace-csv"])
def test_export_round_trips_through_the_simulators_loader(history: History, tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    said = _export(history, out)
    assert "2 nodes" in said and "4 jobs" in said and "3 reclaims" in said
    trace = load(out)
    nodes = trace.tables["nodes"]
    assert list(nodes["id"]) == ["wi-east-01", "wi-west-01"]  # wi-west-02 lends no GPU: left out
    assert list(nodes["gpus"]) == [2.0, 1.0]
    assert list(nodes["building"]) == ["WI East", "WI West"]
    links = trace.tables["links"]
    assert {"access-wi-east-01", "access-wi-west-01"} <= set(links["id"])
    assert "access-wi-west-02" not in set(links["id"])
    access = dict(zip(links["id"], zip(links["a"], links["b"], strict=True), strict=True))
    assert access["access-wi-east-01"][1] == "wi-east-01"
    jobs = trace.tables["jobs"]
    assert trace.n("jobs") == 4
    assert list(jobs["id"]) == [f"job-{j.pk}" for j in history.jobs]
    np.testing.assert_allclose(jobs["submit_s"], [3600.0, 4 * 3600.0, 7 * 3600.0, 10 * 3600.0])
    np.testing.assert_allclose(jobs["work_s"], [7200.0, 7201.0, 7202.0, 7203.0])
    np.testing.assert_allclose(jobs["ckpt_bytes"], [2e9, 2e9 + 1, 2e9 + 2, 2e9 + 3])
    np.testing.assert_allclose(jobs["restart_s"], [20.0, 21.0, 22.0, 23.0])
    np.testing.assert_allclose(jobs["loss_budget_s"], [600.0, 1e9, 1200.0, 300.0])  # no budget → 1e9 s
    assert list(jobs["gpus"]) == [1.0, 2.0, 1.0, 1.0]
    assert set(jobs["group"]) == {"wi-group"}
    rec = trace.tables["reclaims"]
    assert list(rec["node"]) == ["wi-east-01", "wi-west-01", "wi-east-01"]
    np.testing.assert_allclose(rec["t_s"], [5 * 3600.0, 8 * 3600.0, 30 * 3600.0])
    np.testing.assert_allclose(rec["notice_s"], [300.0, 0.0, 0.0])
    assert rec["return_s"][0] == pytest.approx(7 * 3600.0)  # lent again 2 h later
    assert np.isnan(rec["return_s"][1]) and np.isnan(rec["return_s"][2])
    assert trace.n("bandwidth") == trace.n("links")
    research = trace.tables["research"]
    assert trace.n("research") == 6  # 2 links x 3 buckets, two samples averaged in each
    first = [v for link, t, v in zip(research["link"], research["t_s"], research["bytes_per_s"], strict=True)
             if link == "access-wi-east-01" and t == 0.0]
    assert first == [pytest.approx(1.05e7)]
    assert trace.horizon_s == pytest.approx(2 * 86400.0)


def test_raw_samples_and_the_simulator_cli(history: History, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "raw.json"
    _export(history, out, "--sample-s", "0")
    assert load(out).n("research") == history.samples
    assert sim_cli.main(["--trace", str(out), "--policy", "reclaimnet", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {"work_lost_gpu_h", "migration_success", "jobs_done"} <= set(printed)


def test_an_empty_window_is_refused_naming_the_table(db: Any, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="nodes"):
        call_command("export_trace", str(tmp_path / "t.json"), "--since", "2020-01-01", "--until", "2020-01-02")
    with pytest.raises(CommandError, match="days"):
        call_command("export_trace", str(tmp_path / "t.json"), "--days", "0")
    with pytest.raises(CommandError, match="until"):
        call_command("export_trace", str(tmp_path / "t.json"), "--since", "2020-01-02", "--until", "2020-01-01")


def test_research_comes_from_the_per_class_counters_where_a_link_has_them(history: History, tmp_path: Path) -> None:
    """design §4 classes: the agents' research bytes replace the egress (which holds checkpoint traffic too)."""
    import datetime as dt

    from portal.core.models import LinkClassSample

    west = history.nodes[1]
    for k, research_bytes in enumerate((600_000_000, 1_200_000_000)):
        LinkClassSample.objects.create(link=west.access_link, node=west, interval_s=60.0,
                                       sampled_at=history.since + dt.timedelta(minutes=21 + k),
                                       research_bytes=research_bytes, checkpoint_bytes=5_000_000_000)
    out = tmp_path / "classes.json"
    _export(history, out)
    research = load(out).tables["research"]
    rows = sorted((str(link), t, v) for link, t, v in zip(research["link"], research["t_s"], research["bytes_per_s"],
                                                           strict=True))
    west_rows = [r for r in rows if r[0] == "access-wi-west-01"]
    assert west_rows == [("access-wi-west-01", 1200.0, pytest.approx(1.8e9 / 120.0))]  # bytes / interval
    assert len([r for r in rows if r[0] == "access-wi-east-01"]) == 3  # no counters there: the egress
