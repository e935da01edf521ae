"""The fair queue in the simulator (design §16.5): groups in the trace, old traces as one group, fair vs fifo."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scheduler.sim import queuebench
from scheduler.sim.engine import simulate
from scheduler.sim.policies import get_policy
from scheduler.sim.trace import TraceError, from_rows, load, save, to_json_obj

from .helpers import poisson_trace, star_campus


def _rows(groups=None, job_groups=None, n_nodes=2, jobs=None):
    rows = star_campus(n_nodes, 1e8)
    rows["jobs"] = jobs or [{"id": f"j{k}", "submit_s": 0, "gpus": 1, "vram_gb": 0, "min_capability": 0,
                             "work_s": 3600, "ckpt_bytes": 1e8, "restart_s": 0, "loss_budget_s": 1e9}
                            for k in range(len(job_groups or [None, None]))]
    for row, g in zip(rows["jobs"], job_groups or [], strict=False):
        if g is not None:
            row["group"] = g
    rows["reclaims"] = []
    if groups is not None:
        rows["groups"] = groups
    return rows


def test_an_old_trace_loads_as_one_group(tmp_path: Path):
    tr = poisson_trace(2, 2, 1e-4, 7200.0, 1e8, 1e8)
    assert list(tr.col("jobs", "group")) == ["default", "default"]
    assert "groups" not in tr.tables
    # a CSV folder written before groups existed (no group column) loads the same way
    save(tr, tmp_path / "csv")
    jobs_csv = tmp_path / "csv" / "jobs.csv"
    lines = [line.split(",") for line in jobs_csv.read_text().splitlines()]
    at = lines[0].index("group")
    jobs_csv.write_text("\n".join(",".join(cells[:at] + cells[at + 1:]) for cells in lines) + "\n")
    assert "group" not in jobs_csv.read_text().splitlines()[0].split(",")
    assert list(load(tmp_path / "csv").col("jobs", "group")) == ["default", "default"]
    r = simulate(tr, get_policy("reclaimnet+fair"))
    assert r.group_ids == ("default",)
    assert r.group_gpu_s.shape == (1,) and r.group_gpu_s[0] > 0


def test_groups_with_shares_and_quotas_round_trip(tmp_path: Path):
    groups = [{"id": "nlp", "share": 2, "max_gpus": 4}, {"id": "vision", "share": 1, "max_gpu_h_30d": 100}]
    tr = from_rows(_rows(groups, ["nlp", "vision"]), 7200.0)
    save(tr, tmp_path / "t.json")
    save(tr, tmp_path / "csv")
    a, b = load(tmp_path / "t.json"), load(tmp_path / "csv")
    assert to_json_obj(a) == to_json_obj(b) == to_json_obj(tr)
    assert list(a.col("jobs", "group")) == ["nlp", "vision"]
    assert np.isnan(a.col("groups", "max_gpus")[1]) and a.col("groups", "max_gpu_h_30d")[1] == 100


@pytest.mark.parametrize(("groups", "job_groups", "field"), [
    ([{"id": "a", "share": 1}], ["a", "b"], "jobs.group"),
    ([{"id": "a", "share": 1}, {"id": "a", "share": 2}], ["a", "a"], "groups.id"),
    ([{"id": "a", "share": -1}], ["a", "a"], "groups.share"),
    ([{"id": "a", "share": 1, "max_gpus": -2}], ["a", "a"], "groups.max_gpus"),
])
def test_group_validation_names_the_field(groups, job_groups, field):
    with pytest.raises(TraceError) as e:
        from_rows(_rows(groups, job_groups), 7200.0)
    assert e.value.field == field


def test_fair_is_a_policy_switch():
    assert get_policy("reclaimnet+fair").queue == "fair"
    assert get_policy("slurm-pr+fair").destination == "first_fit"
    assert get_policy("reclaimnet").queue == "fifo"


def test_an_over_quota_job_runs_while_nobody_waits_and_is_preempted_for_an_in_quota_one():
    job = {"submit_s": 0, "gpus": 1, "vram_gb": 0, "min_capability": 0, "work_s": 7200, "ckpt_bytes": 1e8,
           "restart_s": 0, "loss_budget_s": 1e9}
    jobs = [dict(job, id="a0", group="a"), dict(job, id="a1", group="a", submit_s=10),
            dict(job, id="b0", group="b", submit_s=600)]
    tr = from_rows(_rows([{"id": "a", "share": 1, "max_gpus": 1}, {"id": "b", "share": 1}], jobs=jobs),
                   4 * 3600.0)
    fair = simulate(tr, get_policy("reclaimnet+fair"))
    # a1 starts over quota at 10 s (nobody waits), b0 preempts it at 600 s and starts at once
    assert fair.preemptions == 1
    assert fair.job_wait_s.tolist() == pytest.approx([0.0, 0.0, 0.0])
    fifo = simulate(tr, get_policy("reclaimnet"))
    assert fifo.preemptions == 0
    assert fifo.job_wait_s[2] > 3600  # b0 waits for a job to end


def test_the_fair_queue_is_fairer_than_fifo_on_a_busy_campus():
    cfg = queuebench.QueueCampus(nodes_4gpu=2, nodes_1gpu=4, submit_days=1.0, drain_days=2.0, seed=1)
    fair, fifo = queuebench.run(cfg, period_s=3600.0)
    assert fair["jain"] >= 0.85
    assert fair["jain"] > fifo["jain"] + 0.15
    heavy_fair, heavy_fifo = fair["groups"][0], fifo["groups"][0]
    light_fair, light_fifo = fair["groups"][1], fifo["groups"][1]
    # the heavy group got less while everyone was submitting, the light ones waited less
    assert heavy_fair["gpu_h_window"] < heavy_fifo["gpu_h_window"]
    assert light_fair["wait_mean_h"] < light_fifo["wait_mean_h"]
    assert queuebench.bench_line(fair, fifo).startswith(f"queue: jain fair {fair['jain']:.3f} fifo ")
