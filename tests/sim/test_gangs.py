"""The gang simulator (scheduler/sim/gangs.py, design §21.6): whole gangs, coordinated saves, shrink and grow."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scheduler.sim.engine import Simulator
from scheduler.sim.gangs import GANG_POLICIES, GangSimulator, gang_campus, simulate_gangs
from scheduler.sim.policies import RECLAIMNET
from scheduler.sim.trace import TraceError, from_rows

MB_PER_S = 1e6


def campus(jobs: list[dict[str, Any]], reclaims: list[dict[str, Any]], *, nodes: int = 6,
           horizon_s: float = 86400.0) -> Any:
    """``nodes`` one-GPU nodes in two buildings (1 Gbit/s access links, 10 Gbit/s uplinks)."""
    node_rows = [{"id": f"n{i}", "building": f"b{i * 2 // nodes}", "gpus": 1, "vram_gb": 24, "capability": 8.6}
                 for i in range(nodes)]
    links = [{"id": f"acc-n{i}", "a": f"n{i}", "b": f"sw-b{i * 2 // nodes}", "bytes_per_s": 125 * MB_PER_S}
             for i in range(nodes)]
    links += [{"id": f"up-b{b}", "a": f"sw-b{b}", "b": "core", "bytes_per_s": 1250 * MB_PER_S} for b in range(2)]
    base = {"submit_s": 0, "gpus": 1, "vram_gb": 8, "min_capability": 7, "work_s": 7200, "ckpt_bytes": 1e9,
            "restart_s": 30, "loss_budget_s": 1800}
    return from_rows({"nodes": node_rows, "links": links, "jobs": [{**base, **j} for j in jobs],
                      "reclaims": reclaims,
                      "bandwidth": [{"link": lk["id"], "t_s": 0, "bytes_per_s": lk["bytes_per_s"]} for lk in links]},
                     horizon_s=horizon_s)


def away(node: str, t_s: float, notice_s: float, return_s: float) -> dict[str, Any]:
    return {"node": node, "t_s": t_s, "notice_s": notice_s, "return_s": return_s}


def only_open_at_start(n_open: int, nodes: int = 6, back_s: float = 3000.0) -> list[dict[str, Any]]:
    """Every node but the first ``n_open`` is taken at t = 0 and lent again at ``back_s``."""
    return [away(f"n{i}", 0.0, 0.0, back_s) for i in range(n_open, nodes)]


def test_a_gang_whose_member_is_reclaimed_with_notice_saves_every_shard_and_moves_whole_losing_nothing() -> None:
    trace = campus([{"id": "g", "members": 2}], [away("n0", 3600.0, 600.0, 80000.0)])
    sim = GangSimulator(trace, GANG_POLICIES["reclaimnet"])
    r = sim.run()
    assert r.moves == 1 and r.interruptions == 1 and r.restores == 0 and r.requeues == 0
    assert r.lost_gpu_s == 0.0
    assert r.jobs_done == 1
    # the same reclaim under Slurm's kill-and-requeue loses the gang's work since its last checkpoint on both GPUs
    slurm = simulate_gangs(trace, "slurm-gang")
    assert slurm.requeues == 1 and 0.0 < slurm.lost_gpu_s <= 2 * 600.0


def test_an_emergency_on_one_member_restores_the_whole_gang_from_its_last_complete_checkpoint() -> None:
    trace = campus([{"id": "g", "members": 3}], [away("n0", 5000.0, 0.0, 80000.0)])
    r = simulate_gangs(trace, "reclaimnet")
    assert r.restores == 1 and r.moves == 0
    assert r.lost_gpu_s > 0.0  # the work since its last complete checkpoint, on all three GPUs
    assert r.lost_gpu_s <= 3 * 3600.0  # never more than one interval (Δ ≤ 2·L_max) of it
    assert r.jobs_done == 1


def test_a_gang_that_cannot_start_whole_holds_no_gpu_until_it_can() -> None:
    reclaims = only_open_at_start(2, back_s=3000.0)
    early = simulate_gangs(campus([{"id": "g", "members": 3}], reclaims, horizon_s=2900.0), "reclaimnet")
    assert early.held_gpu_s == 0.0 and early.jobs_done == 0
    later = simulate_gangs(campus([{"id": "g", "members": 3}], reclaims, horizon_s=86400.0), "reclaimnet")
    assert later.jobs_done == 1
    assert later.held_gpu_s >= 3 * 7200.0  # three members for the whole run, started at 3000 s at the earliest


def test_an_elastic_job_starts_at_what_is_free_grows_when_nodes_come_back_and_shrinks_on_a_reclaim() -> None:
    """Range 1..4 on four nodes: two open at the start (it starts at 2), the other two back at 3000 s (it grows to
    4), then one of them is reclaimed with notice when no node is free (it shrinks to 3, losing nothing)."""
    reclaims = [*only_open_at_start(2, nodes=4, back_s=3000.0), away("n3", 7200.0, 600.0, 80000.0)]
    trace = campus([{"id": "e", "members": 4, "min_members": 1, "work_s": 20000.0}], reclaims, nodes=4)
    sim = GangSimulator(trace, GANG_POLICIES["reclaimnet"])
    sizes: list[tuple[float, int]] = []
    run = sim._run

    def watch(j: int, t: float) -> None:
        run(j, t)
        sizes.append((t, len(sim.members[j])))

    sim._run = watch  # type: ignore[method-assign]
    r = sim.run()
    assert [k for _, k in sizes] == [2, 4, 3]
    assert sizes[0][0] == 0.0 and 3000.0 <= sizes[1][0] < 7200.0 and 7200.0 <= sizes[2][0] < 7800.0
    assert r.grows == 1 and r.shrinks == 1 and r.moves == 0
    assert r.lost_gpu_s == 0.0 and r.jobs_done == 1
    assert "keeps running on 3 GPUs" in r.reasons[0]
    # a rigid job of the same size (at its minimum) cannot shrink: with no free node it waits in the queue
    rigid = simulate_gangs(trace, "reclaimnet-rigid")
    assert rigid.shrinks == 0 and rigid.grows == 0


def test_progress_is_counted_at_full_size_so_a_half_size_elastic_job_takes_twice_as_long() -> None:
    reclaims = [away(f"n{i}", 0.0, 0.0, 10**6) for i in range(2, 6)]  # four nodes away for good: two open
    trace = campus([{"id": "e", "members": 4, "min_members": 2, "work_s": 7200.0}], reclaims, horizon_s=40000.0)
    r = simulate_gangs(trace, "reclaimnet")
    assert r.jobs_done == 1
    assert r.useful_gpu_s == pytest.approx(4 * 7200.0)  # the work, at full size, whatever size it ran at
    assert r.held_gpu_s >= 2 * 2 * 7200.0  # two GPUs for at least twice the full-size time


def test_the_single_node_engine_refuses_a_trace_with_gangs_and_the_trace_names_bad_ranges() -> None:
    with pytest.raises(TraceError) as err:
        Simulator(campus([{"id": "g", "members": 2}], []), RECLAIMNET)
    assert err.value.field == "jobs.members"
    with pytest.raises(TraceError) as err:
        campus([{"id": "e", "members": 2, "min_members": 3}], [])
    assert err.value.field == "jobs.min_members"
    with pytest.raises(TraceError) as err:
        campus([{"id": "e", "members": 1.5}], [])
    assert err.value.field == "jobs.members"


def test_reclaimnet_loses_less_than_slurms_gang_kill_and_requeue_on_the_gang_campus() -> None:
    trace = gang_campus(1, days=2.0)
    members = trace.tables["jobs"]["members"]
    assert np.any(members > 1) and np.any(trace.tables["jobs"]["min_members"] < members)
    ours = simulate_gangs(trace, "reclaimnet").summary()
    slurm = simulate_gangs(trace, "slurm-gang").summary()
    assert ours["work_lost_gpu_h"] < slurm["work_lost_gpu_h"]  # 8 seeds of 7 days: 61% less (design §21.6)
    assert ours["jobs_done"] >= slurm["jobs_done"]


def test_the_simulator_cli_runs_a_gang_trace_on_the_gang_policies_and_names_a_policy_it_lacks(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from scheduler.sim.__main__ import main
    from scheduler.sim.trace import save

    path = tmp_path / "gangs.json"
    save(campus([{"id": "g", "members": 2}], [away("n0", 3600.0, 600.0, 80000.0)]), path)
    assert main(["--trace", str(path), "--policy", "reclaimnet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "reclaimnet" and out["moves"] == 1 and out["lost_gpu_h"] == 0.0
    assert main(["--trace", str(path), "--policy", "static"]) == 2
    err = json.loads(capsys.readouterr().out)
    assert err["field"] == "policy" and "slurm-gang" in err["error"]


def test_no_job_ever_progresses_faster_than_its_size_allows_even_when_p1_replans_it_mid_write() -> None:
    """A re-plan that shortens Δ or s while a coordinated save is being written must not close the cycle early
    and credit work never done."""
    sim = GangSimulator(gang_campus(1, days=2.0), GANG_POLICIES["reclaimnet"])
    advance = sim._advance
    worst = [0.0]

    def checked(dt: float) -> None:
        before, rate = sim.prog.copy(), sim.size / sim.M
        advance(dt)
        worst[0] = max(worst[0], float(np.max(sim.prog - before - dt * rate)))

    sim._advance = checked  # type: ignore[method-assign]
    sim.run()
    assert worst[0] <= 1e-6


def test_a_save_that_fits_the_notice_ends_before_the_gang_waits_and_it_then_reads_from_the_peers() -> None:
    """20 GB over two ranks: the save (about 114 s) fits a 150 s notice, the copy to another set does not, so the
    gang saves, waits in the queue, and restores from the building peers (the reclaimed node is gone)."""
    trace = campus([{"id": "g", "members": 2, "ckpt_bytes": 20e9}], [away("n0", 3600.0, 150.0, 80000.0)])
    sim = GangSimulator(trace, GANG_POLICIES["reclaimnet"])
    restores: list[tuple[float, list[int]]] = []
    restore = sim._restore

    def watch(j: int, nodes: list[int], t: float, after_s: float) -> None:
        restores.append((t, list(sim._shard_homes(j))))
        restore(j, nodes, t, after_s)

    sim._restore = watch  # type: ignore[method-assign]
    r = sim.run()
    assert r.lost_gpu_s == 0.0 and r.jobs_done == 1 and r.requeues == 1
    t_restore, homes = restores[0]
    assert t_restore >= 3600.0 + 100.0  # after the save, not at the notice
    assert 0 not in homes  # nothing is read from n0
