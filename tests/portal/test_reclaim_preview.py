"""The reclaim preview is the reclaim planner's answer (design §9.2), and the design §5 topology."""

from __future__ import annotations

from typing import Any

import pytest

from portal.control.reclaim.plan import preview
from portal.core.campus import topology
from portal.core.models import HazardEstimate, HazardScope, LinkEstimate
from tests.portal import factories as f
from tests.portal.conftest import World


@pytest.mark.django_db
def test_preview_without_link_estimate_moves_the_job_at_p3s_rate(world: World) -> None:
    job = f.make_job(world.group, world.users["researcher"], ckpt_bytes_estimate=875_000_000, restart_s=10)
    f.place_job(job, world.node)
    # 1 Gbit/s access links = 125e6 B/s; P3 may give migrations 70 % = 87.5e6 B/s: 10 s of copy + 10 s restart.
    result = preview(world.node, 25)
    assert result["notice_s"] == 25
    [row] = result["jobs"]
    assert row["outcome"] == "loss_free" and row["loss_free"] is True and row["work_lost_s"] == 0
    assert row["destination"] == "robotics-01" and row["destination_id"] == world.other_node.pk
    assert row["bandwidth_bytes_per_s"] <= 87.5e6 * (1 + 1e-9)
    assert row["leave_s"] == pytest.approx(875e6 / row["bandwidth_bytes_per_s"] + 10)
    assert row["leave_s"] <= 25
    assert result["shortest_loss_free_notice_s"] == pytest.approx(20.0, abs=0.1)


@pytest.mark.django_db
def test_preview_uses_the_lower_bound_replicas_and_joint_admission(world: World) -> None:
    third, _ = f.make_node(world.lab, world.building, name="vision-02", gpus=2, state="online")
    f.connect_agent(third, 9003)
    LinkEstimate.objects.create(link=world.node.access_link, mean_bytes_per_s=80e6, lower_bytes_per_s=50e6)
    big = f.make_job(world.group, world.users["researcher"], ckpt_bytes_estimate=10**9, restart_s=0)
    small = f.make_job(world.group, world.users["researcher"], ckpt_bytes_estimate=10**9, restart_s=5)
    f.place_job(big, world.node, [0])
    f.place_job(small, world.node, [1])
    ckpt = f.make_checkpoint(big, world.node, size_bytes=5 * 10**9, completed_ago_s=300)  # 5 GB, taken 305 s ago
    ckpt.replica_nodes.add(third)  # pre-synced to vision-02
    result = preview(world.node, 40)
    rows = {row["job_id"]: row for row in result["jobs"]}
    budget = 0.7 * 50e6  # P3's migration budget on B⁻ = 50 MB/s after the 30 % research reserve
    assert rows[big.pk]["ckpt_bytes"] == 5 * 10**9
    assert rows[big.pk]["outcome"] == "from_replica" and rows[big.pk]["loss_free"] is False
    assert rows[big.pk]["destination"] == "vision-02"  # the replica's holder resumes it without a copy
    assert rows[big.pk]["work_lost_s"] == pytest.approx(305, abs=5)
    assert rows[small.pk]["outcome"] == "loss_free"  # P3 skips the big flow (EDF with skip), admits the small one
    # Loss-free for both at once: P3 must fit both minimum rates, C/(τ − T_r), into the budget together.
    tau = result["shortest_loss_free_notice_s"]
    assert 5e9 / tau + 1e9 / (tau - 5) == pytest.approx(budget, rel=1e-2)
    assert all(row["loss_free"] for row in preview(world.node, tau)["jobs"])
    assert not all(row["loss_free"] for row in preview(world.node, tau - 1.0)["jobs"])  # shown to the second


@pytest.mark.django_db
def test_a_notice_too_short_to_leave_costs_what_an_emergency_costs(world: World) -> None:
    job = f.make_job(world.group, world.users["researcher"], ckpt_bytes_estimate=10**9, restart_s=10)
    f.place_job(job, world.node)
    ckpt = f.make_checkpoint(job, world.node, completed_ago_s=120)
    ckpt.replica_nodes.add(world.other_node)
    emergency, one_second = preview(world.node, 0)["jobs"][0], preview(world.node, 1)["jobs"][0]
    assert emergency["outcome"] == one_second["outcome"] == "from_replica"
    assert emergency["destination"] == one_second["destination"] == "robotics-01"
    assert emergency["work_lost_s"] == pytest.approx(one_second["work_lost_s"], abs=1)


@pytest.mark.django_db
def test_no_checkpoint_off_the_node_means_a_restart_from_scratch(world: World) -> None:
    job = f.make_job(world.group, world.users["researcher"])
    f.place_job(job, world.node)
    f.make_checkpoint(job, world.node)  # only on the node being reclaimed
    [row] = preview(world.node, 0)["jobs"]
    assert row["outcome"] == "from_scratch" and row["destination"] is None


@pytest.mark.django_db
def test_no_notice_makes_a_job_loss_free_when_no_node_has_room(world: World) -> None:
    job = f.make_job(world.group, world.users["researcher"], gpu_count=2)  # robotics-01 has one GPU
    f.place_job(job, world.node, [0, 1])
    result = preview(world.node, 3600)
    assert result["jobs"][0]["outcome"] == "from_scratch"
    assert result["shortest_loss_free_notice_s"] is None


@pytest.mark.django_db
def test_preview_of_idle_node(world: World, client_for: Any) -> None:
    assert preview(world.node, 0) == {"notice_s": 0.0, "shortest_loss_free_notice_s": 0.0, "jobs": []}
    response = client_for("provider").get(f"/api/nodes/{world.node.pk}/reclaim-preview/?notice_s=12.5")
    assert response.status_code == 200 and response.json()["notice_s"] == 12.5


@pytest.mark.django_db
def test_campus_topology_is_spec5_shaped(world: World) -> None:
    job = f.make_job(world.group, world.users["researcher"])
    f.place_job(job, world.node, [0])
    HazardEstimate.objects.create(scope=HazardScope.NODE, node=world.node, hour_of_day=12, hazard_per_s=1e-3,
                                  hazard_upper_per_s=2e-3)
    topo = topology()
    links = {link["id"]: link for link in topo["links"]}
    assert links["access-vision-01"] == {"id": "access-vision-01", "a": f"sw-{world.building.pk}",
                                         "b": "vision-01", "bytes_per_s": 125e6}
    assert links[f"uplink-{world.building.pk}"]["a"] == "core"
    nodes = {node["id"]: node for node in topo["nodes"]}
    vision = nodes["vision-01"]
    assert set(vision) == {"id", "building", "free_gpus", "vram_gb", "capability", "hazard_per_s_by_hour"}
    assert vision["free_gpus"] == 1 and vision["vram_gb"] == 24 and vision["capability"] == 8.6
    assert len(vision["hazard_per_s_by_hour"]) == 24 and vision["hazard_per_s_by_hour"][12] == 2e-3
    assert all(h > 0 for h in vision["hazard_per_s_by_hour"])
