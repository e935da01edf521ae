"""Gangs and elastic ranges in the scheduler core (design §3 "Gangs", "Elastic"): a gang's nodes all at once or
none, chosen by the set's survival, its slowest rank's restore and the path between members; the gang's hazard
and its coordinated interval for P1; an elastic job's shrink-or-move."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.gang import (
    GROW_SAFETY,
    GangRequest,
    coordinated_interval_s,
    gang_hazard_per_s,
    grow_pays,
    select_gang_destinations,
    shrink_or_move,
)
from scheduler.p1 import P1Jobs, plan_checkpoints
from scheduler.p2 import survival
from scheduler.topology import BottleneckIndex, CampusTree

ACCESS = 1.25e9  # 10 Gbit/s to each node
UPLINK = 1.25e8  # 1 Gbit/s between a building and the core


def campus(n_buildings: int, per_building: int, uplink: float = UPLINK) -> tuple[CampusTree, np.ndarray, list[str]]:
    lid, a, b, nodes, building, bw = [], [], [], [], [], []
    for k in range(n_buildings):
        lid.append(f"up{k}"), a.append(f"sw{k}"), b.append("core"), bw.append(uplink)
        for j in range(per_building):
            node = f"n{k}-{j}"
            nodes.append(node), building.append(f"B{k}")
            lid.append(f"acc-{node}"), a.append(node), b.append(f"sw{k}"), bw.append(ACCESS)
    return CampusTree.from_links(lid, a, b, nodes), np.array(bw), building


def request(n_buildings: int = 2, per_building: int = 3, **fields: Any) -> GangRequest:
    tree, bw, building = campus(n_buildings, per_building)
    n = tree.n_nodes
    base: dict[str, Any] = dict(
        tree=tree, link_bytes_per_s=bw, building=np.array(building), free_gpus=np.full(n, 2),
        vram_gb=np.full(n, 24.0), capability=np.full(n, 8.6), hazard_per_s_by_hour=np.full((n, 24), 1e-5),
        compatible=None, members=2, gpus_per_member=1, shard_bytes=4e9, restart_s=30.0, remaining_s=7200.0)
    base.update(fields)
    return GangRequest(**base)


def test_a_gang_gets_every_member_or_nothing_and_says_how_many_nodes_could_hold_one() -> None:
    free = np.array([2, 0, 0, 0, 0, 1])  # only node 0 has 2 GPUs free
    d = select_gang_destinations(request(free_gpus=free, members=3, gpus_per_member=2))
    assert d.destinations is None and d.feasible_nodes == 1
    assert d.reason == "1 nodes can hold a member of 2 GPUs; the gang needs 3"
    d = select_gang_destinations(request(free_gpus=free, members=2, gpus_per_member=1))
    assert d.destinations is not None and set(d.destinations) == {0, 5} and d.reason == ""


def test_members_go_to_one_building_when_the_trunk_is_narrow() -> None:
    """Two members split across buildings talk through 1 Gbit/s uplinks; inside one building, 10 Gbit/s."""
    d = select_gang_destinations(request(members=3))
    assert d.destinations is not None
    tree = request().tree
    buildings = {tree.node_ids[i].split("-")[0] for i in d.destinations}
    assert len(buildings) == 1 and d.member_bytes_per_s == ACCESS
    campus_wide = [s for s, _ in d.considered if len({tree.node_ids[i].split("-")[0] for i in s}) > 1]
    assert all(score > d.score for s, score in d.considered if s in campus_wide)


def test_the_set_that_survives_longest_wins_and_its_survival_is_the_product_of_its_members() -> None:
    hazard = np.full((6, 24), 1e-5)
    hazard[:3] = 4e-4  # building 0 is reclaimed often
    d = select_gang_destinations(request(hazard_per_s_by_hour=hazard, members=2))
    assert d.destinations is not None and set(d.destinations) <= {3, 4, 5}
    assert d.survival == pytest.approx(float(np.prod(survival(hazard[list(d.destinations)], 0.0, 7200.0))))


def test_each_rank_is_restored_where_its_shard_arrives_soonest() -> None:
    """Rank 0's shard is on n1-0, rank 1's on n1-1: each rank stays where its shard is, nothing is copied."""
    d = select_gang_destinations(request(members=2, holders=np.array([3, 4])))
    assert d.destinations == (3, 4)
    assert d.restore_s == pytest.approx(30.0)  # the restart alone
    d = select_gang_destinations(request(members=2, holders=np.array([3, 4]), excluded=np.array([0, 0, 0, 1, 0, 0],
                                                                                               dtype=bool)))
    assert d.destinations is not None and 3 not in d.destinations
    assert d.destinations[1] == 4  # rank 1 keeps its node; rank 0 moves inside the building
    assert d.restore_s == pytest.approx(4e9 / ACCESS + 30.0)


def test_on_a_scheduled_reclaim_every_rank_is_restored_before_the_notice_ends_or_none_is_moved() -> None:
    # Shards in building 0, building 0 being reclaimed: across the 1 Gbit/s trunk a shard takes 32 s + 30 s.
    away = np.array([1, 1, 1, 0, 0, 0], dtype=bool)
    holders = np.array([0, 1])
    d = select_gang_destinations(request(members=2, holders=holders, excluded=away, notice_s=100.0))
    assert d.destinations is not None and set(d.destinations) <= {3, 4, 5}
    assert d.restore_s <= 100.0
    d = select_gang_destinations(request(members=2, holders=holders, excluded=away, notice_s=50.0))
    assert d.destinations is None
    assert d.reason == "no set of nodes can receive every rank's shard before the notice ends"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1e-6, 1e-3), min_size=6, max_size=6), st.lists(st.integers(0, 2), min_size=6, max_size=6),
       st.integers(1, 3))
def test_no_other_set_beats_the_chosen_one_on_survival_restore_and_member_bandwidth_at_once(
        hazards: list[float], free: list[int], members: int) -> None:
    """The chosen set is never dominated: no other feasible set survives at least as well, restores at least as
    fast and has at least as wide a path between members, and is strictly better in one."""
    hazard = np.repeat(np.array(hazards)[:, None], 24, axis=1)
    req = request(hazard_per_s_by_hour=hazard, free_gpus=np.array(free), members=members)
    d = select_gang_destinations(req)
    feasible = [i for i in range(6) if free[i] >= 1]
    if len(feasible) < members:
        assert d.destinations is None
        return
    assert d.destinations is not None and len(set(d.destinations)) == members
    index = BottleneckIndex.build(req.tree, req.link_bytes_per_s)

    def narrowest(s: tuple[int, ...]) -> float:
        return min((float(index.bottleneck_from(a, np.array([b]))[0]) for a, b in itertools.combinations(s, 2)),
                   default=np.inf)

    chosen_surv, chosen_bw = d.survival, narrowest(d.destinations)
    for other in itertools.combinations(feasible, members):
        surv = float(np.prod(survival(hazard[list(other)], 0.0, req.remaining_s)))
        bw = narrowest(other)
        assert not (surv >= chosen_surv * (1 + 1e-12) and bw >= chosen_bw and
                    (surv > chosen_surv * (1 + 1e-9) or bw > chosen_bw)), (other, d.destinations)


def test_bad_gang_requests_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="members >= 1"):
        select_gang_destinations(request(members=0))
    with pytest.raises(ValueError, match="holders names 1 ranks, the gang has 2"):
        select_gang_destinations(request(members=2, holders=np.array([0])))


def test_a_gangs_hazard_is_the_sum_of_its_members_and_a_job_alone_keeps_its_own() -> None:
    hazard = np.array([1e-5, 2e-5, 3e-5, 7e-5])
    gang_of = np.array([0, 0, -1, 0])
    assert gang_hazard_per_s(hazard, gang_of).tolist() == pytest.approx([1e-4, 1e-4, 3e-5, 1e-4])
    assert gang_hazard_per_s(hazard, np.full(4, -1)).tolist() == hazard.tolist()


def test_a_gang_checkpoints_at_one_interval_the_one_its_costliest_shard_plans() -> None:
    """P1 for a gang (design §3 "Gangs"): each member planned at the gang's hazard on its own node's budget, then
    every member at the longest plan — the coordinated checkpoint completes when the slowest shard is written."""
    gang_of = np.array([0, 0, 0, -1])
    shard = np.array([2e9, 8e9, 4e9, 4e9])
    hazard = gang_hazard_per_s(np.array([1e-5, 1e-5, 1e-5, 1e-5]), gang_of)
    jobs = P1Jobs.build(ids=("r0", "r1", "r2", "solo"), hazard_per_s=hazard, ckpt_bytes=shard,
                        loss_budget_s=np.full(4, np.inf), restart_s=np.full(4, 30.0))
    plan = plan_checkpoints(jobs, np.full(4, 1e8), group=np.arange(4))  # one member per node
    coordinated = coordinated_interval_s(plan.interval_s, gang_of)
    assert coordinated[:3].tolist() == pytest.approx([plan.interval_s[1]] * 3)  # the 8 GB shard's
    assert coordinated[:3].min() >= plan.interval_s[:3].max()
    assert coordinated[3] == plan.interval_s[3]  # the job alone


def test_an_elastic_job_shrinks_when_what_is_left_is_at_or_above_its_minimum_and_costs_less() -> None:
    c = shrink_or_move(gpus_now=4, gpus_reclaimed=2, min_gpus=1, checkpoint_s=20.0, restart_s=30.0,
                       move_transfer_s=60.0, regrow_s=0.0)
    assert (c.action, c.gpus_after) == ("shrink", 2)
    assert c.shrink_cost_gpu_s == 2 * 50.0 and c.move_cost_gpu_s == 4 * 110.0
    assert c.reason == "keeps running on 2 GPUs: 100 GPU-s against 440 to move"


def test_an_elastic_job_moves_when_it_would_wait_long_to_grow_back_and_a_quick_move_exists() -> None:
    c = shrink_or_move(gpus_now=4, gpus_reclaimed=2, min_gpus=1, checkpoint_s=20.0, restart_s=30.0,
                       move_transfer_s=60.0, regrow_s=3600.0)
    assert c.action == "move" and c.gpus_after == 4
    assert c.shrink_cost_gpu_s == 2 * 50.0 + 2 * 3600.0 and c.move_cost_gpu_s == 440.0
    # the same job with no destination shrinks whatever the wait
    c = shrink_or_move(gpus_now=4, gpus_reclaimed=2, min_gpus=1, checkpoint_s=20.0, restart_s=30.0,
                       move_transfer_s=None, regrow_s=3600.0)
    assert c.action == "shrink" and c.reason.endswith("no destination to move to")


def test_an_elastic_job_at_its_minimum_moves_and_one_that_can_do_neither_stops() -> None:
    c = shrink_or_move(gpus_now=2, gpus_reclaimed=1, min_gpus=2, checkpoint_s=20.0, restart_s=30.0,
                       move_transfer_s=60.0, regrow_s=0.0)
    assert (c.action, c.gpus_after, c.shrink_cost_gpu_s) == ("move", 2, None)
    assert c.reason == "moves whole: 220 GPU-s against 1 GPUs left, below its minimum of 2"
    c = shrink_or_move(gpus_now=2, gpus_reclaimed=1, min_gpus=2, checkpoint_s=20.0, restart_s=30.0,
                       move_transfer_s=None, regrow_s=0.0)
    assert c.action == "stop" and c.gpus_after == 0


def test_a_tie_shrinks_and_work_since_the_last_checkpoint_counts_on_every_gpu_either_way() -> None:
    # shrink: 1 × (0 + 10) + 1 × 10 = 20; move: 2 × (0 + 0 + 10) = 20
    c = shrink_or_move(gpus_now=2, gpus_reclaimed=1, min_gpus=1, checkpoint_s=0.0, restart_s=10.0,
                       move_transfer_s=0.0, regrow_s=10.0)
    assert c.action == "shrink" and c.shrink_cost_gpu_s == c.move_cost_gpu_s == 20.0
    c = shrink_or_move(gpus_now=2, gpus_reclaimed=1, min_gpus=1, checkpoint_s=0.0, restart_s=10.0,
                       move_transfer_s=0.0, regrow_s=10.0, since_checkpoint_s=300.0)
    assert c.shrink_cost_gpu_s == c.move_cost_gpu_s == 20.0 + 600.0


def test_bad_elastic_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="gpus_reclaimed"):
        shrink_or_move(gpus_now=2, gpus_reclaimed=3, min_gpus=1, checkpoint_s=0.0, restart_s=0.0,
                       move_transfer_s=1.0, regrow_s=0.0)
    with pytest.raises(ValueError, match="times must be >= 0"):
        shrink_or_move(gpus_now=2, gpus_reclaimed=1, min_gpus=1, checkpoint_s=0.0, restart_s=0.0,
                       move_transfer_s=-1.0, regrow_s=0.0)


def test_growing_pays_only_when_the_wall_time_saved_is_twice_the_save_and_rendezvous() -> None:
    """design §3 "Elastic": from 2 to 4 GPUs the rest of the job takes half as long; the save and the restart
    (10 s + 30 s) must cost at most 1/GROW_SAFETY of what that saves."""
    cost_s = 40.0
    at_edge = 2 * GROW_SAFETY * cost_s  # saves remaining/2 = GROW_SAFETY * cost
    assert grow_pays(remaining_s=at_edge, gpus_now=2, gpus_after=4, checkpoint_s=10.0, restart_s=30.0)
    assert not grow_pays(remaining_s=at_edge - 1.0, gpus_now=2, gpus_after=4, checkpoint_s=10.0, restart_s=30.0)
    with pytest.raises(ValueError):
        grow_pays(remaining_s=100.0, gpus_now=4, gpus_after=4, checkpoint_s=1.0, restart_s=1.0)
