"""design §7 trace format: JSON ↔ CSV round trip, validation naming the field, CLI contract."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scheduler.sim.trace import TraceError, from_rows, load, save, to_json_obj
from scheduler.sim.tracegen import INITIAL_NOTICE_S, GenConfig, _reclaim_rows, generate, statistics

from .helpers import poisson_trace

ROOT = Path(__file__).resolve().parents[2]


def _tiny():
    return generate(GenConfig(days=1.0, seed=5, n_jobs=6, total_gpu_h=30.0, departures=12, node_scale=0.15,
                              drift_start_day=0.5, drift_days=0.2))


def test_json_csv_round_trip(tmp_path: Path) -> None:
    tr = _tiny()
    save(tr, tmp_path / "t.json")
    save(tr, tmp_path / "csv")
    a, b = load(tmp_path / "t.json"), load(tmp_path / "csv")
    assert a.horizon_s == b.horizon_s == tr.horizon_s
    for table, cols in tr.tables.items():
        for c, v in cols.items():
            for x in (a, b):
                got = x.tables[table][c]
                if v.dtype == object:
                    assert list(got) == list(v), (table, c)
                else:
                    np.testing.assert_allclose(got, v, rtol=1e-12, err_msg=f"{table}.{c}")
    assert to_json_obj(a) == to_json_obj(b)


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda r: r["jobs"][0].update(ckpt_bytes=-1), "jobs.ckpt_bytes"),
    (lambda r: r["jobs"][0].update(work_s="x"), "jobs.work_s"),
    (lambda r: r["reclaims"][0].update(node="ghost"), "reclaims.node"),
    (lambda r: r["bandwidth"][0].update(link="ghost"), "bandwidth.link"),
    (lambda r: r["jobs"][0].pop("gpus"), "jobs.gpus"),
    (lambda r: r.pop("links"), "links"),
])
def test_validation_names_the_field(mutate, field: str) -> None:
    rows = to_json_obj(poisson_trace(2, 1, 1e-3, 3600.0, 1e8, 1e8))
    mutate(rows)
    with pytest.raises(TraceError) as e:
        from_rows(rows)
    assert e.value.field == field


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scheduler.sim", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_cli_json_output_and_errors(tmp_path: Path) -> None:
    save(_tiny(), tmp_path / "t.json")
    ok = _cli("--trace", str(tmp_path / "t.json"), "--policy", "reclaimnet", "--json")
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert set(out) == {"work_lost_gpu_h", "downtime_median_s", "downtime_p99_s", "migration_success",
                        "traffic_degradation", "gpu_utilization", "jobs_done"}
    bad = json.loads(tmp_path.joinpath("t.json").read_text())
    bad["jobs"][0]["loss_budget_s"] = 0
    tmp_path.joinpath("bad.json").write_text(json.dumps(bad))
    for args, field in ((("--trace", str(tmp_path / "bad.json"), "--policy", "reclaimnet"), "jobs.loss_budget_s"),
                        (("--trace", str(tmp_path / "t.json"), "--policy", "nope"), "policy"),
                        (("--trace", str(tmp_path / "missing.json"), "--policy", "static"), "trace"),
                        (("--policy", "static"), "arguments")):
        r = _cli(*args, "--json")
        assert r.returncode == 2
        assert r.stderr == ""
        err = json.loads(r.stdout)
        assert field in err["error"]


def test_generator_statistics_near_targets() -> None:
    tr = generate(GenConfig(days=20.0, seed=2, n_jobs=104, total_gpu_h=1630.0, departures=282,
                            drift_start_day=11.0, drift_days=2.0))
    stats = {name: got for name, got, _ in statistics(tr)}
    assert stats["nodes / buildings"] == "54 / 4"
    assert abs(int(stats["departures"]) - 282) <= 30
    assert abs(float(stats["emergency share"].rstrip("%")) - 42) <= 6
    assert float(stats["corr(λ, B_eff)"]) < -0.2
    c = tr.tables["jobs"]["ckpt_bytes"]
    assert c.min() >= 120e6 and c.max() <= 48e9 and abs(np.median(c) / 3.2e9 - 1) < 0.05


def test_external_adapters_map_removals_to_reclaims() -> None:
    from scheduler.sim.adapters import SHARED, load_external

    if not (SHARED / "bamboo" / "g4dn-trace.csv").exists():
        pytest.skip("shared traces not present")
    tr = load_external("bamboo-g4dn")
    removes = sum(1 for line in (SHARED / "bamboo" / "g4dn-trace.csv").read_text().splitlines()
                  if ",remove," in line)
    real = tr.tables["reclaims"]["t_s"] > 0
    assert int(real.sum()) == removes
    notice = tr.tables["reclaims"]["notice_s"][real]
    assert set(np.unique(notice == 0)) == {True, False}  # both emergencies and 30-120 s notices
    assert np.all((notice == 0) | ((notice >= 30) & (notice <= 120)))


def test_reclaim_rows_never_return_before_the_initial_notice_ends() -> None:
    # node 0's first lending window opens 5 s in, inside the 10 s notice of the reclaim at t = 0 that marks
    # it not lent; node 1's opens at 50 s. A return before the deadline is rejected by the trace loader.
    windows = [[[5.0, 900.0, 0.0, 1.0]], [[50.0, np.inf, 0.0, 0.0]]]
    rc = _reclaim_rows(windows, np.array(["n0", "n1"], dtype=object))
    assert rc["node"].tolist() == ["n1", "n0"]  # n0: lent from the start, only its reclaim at 900 s
    assert rc["t_s"].tolist() == [0.0, 900.0] and rc["notice_s"].tolist() == [INITIAL_NOTICE_S, 0.0]
    assert rc["return_s"][0] == 50.0 and np.isnan(rc["return_s"][1])
    ok = ~np.isfinite(rc["return_s"]) | (rc["return_s"] >= rc["t_s"] + rc["notice_s"])
    assert ok.all()


def test_trace_error_survives_pickling_for_worker_processes() -> None:
    pickled = pickle.loads(pickle.dumps(TraceError("reclaims.return_s", "must be >= t_s + notice_s")))
    assert str(pickled) == "reclaims.return_s: must be >= t_s + notice_s" and pickled.field == "reclaims.return_s"
