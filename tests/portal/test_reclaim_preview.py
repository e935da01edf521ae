"""Reclaim preview (design §1: which notice lets each job leave with no loss) and the design §5 topology."""

from __future__ import annotations

from typing import Any

import pytest

from portal.core.models import HazardEstimate, HazardScope, LinkEstimate
from portal.core.services.reclaim_preview import campus_topology, preview_reclaim
from tests.portal import factories as f
from tests.portal.conftest import World


@pytest.mark.django_db
def test_preview_without_link_estimate_uses_70_percent_of_capacity(world: World) -> None:
    job = f.make_job(world.group, world.users["researcher"], ckpt_bytes_estimate=875_000_000, restart_s=10)
    f.place_job(job, world.node)
    # 1 Gbit/s access link = 125e6 B/s; 70 % = 87.5e6 B/s; 875 MB / 87.5 MB/s = 10 s, + 10 s restart.
    preview = preview_reclaim(world.node, 25)
    assert preview["notice_s"] == 25
    [row] = preview["jobs"]
    assert row["bandwidth_bytes_per_s"] == pytest.approx(87.5e6)
    assert row["leave_s"] == pytest.approx(20.0)
    assert row["loss_free"] is True and row["work_lost_s"] == 0
    assert preview["shortest_loss_free_notice_s"] == pytest.approx(20.0)
    assert set(row) == {"job_id", "name", "ckpt_bytes", "bandwidth_bytes_per_s", "restart_s", "leave_s",
                        "loss_free", "work_lost_s"}


@pytest.mark.django_db
def test_preview_uses_lower_bound_and_last_checkpoint(world: World) -> None:
    LinkEstimate.objects.create(link=world.node.access_link, mean_bytes_per_s=80e6, lower_bytes_per_s=50e6)
    big = f.make_job(world.group, world.users["researcher"], ckpt_bytes_estimate=10**9, restart_s=0)
    small = f.make_job(world.group, world.users["researcher"], ckpt_bytes_estimate=10**9, restart_s=5)
    f.place_job(big, world.node, [0])
    f.place_job(small, world.node, [1])
    f.make_checkpoint(big, world.node, size_bytes=5 * 10**9, completed_ago_s=300)  # last ckpt: 5 GB, 300 s ago
    preview = preview_reclaim(world.node, 40)
    rows = {row["job_id"]: row for row in preview["jobs"]}
    budget = 0.7 * 50e6  # P3's migration budget on B⁻ = 50 MB/s after the 30 % research reserve
    assert rows[big.pk]["ckpt_bytes"] == 5 * 10**9
    assert rows[big.pk]["bandwidth_bytes_per_s"] == pytest.approx(budget)
    assert rows[big.pk]["leave_s"] == pytest.approx(5e9 / budget)
    assert rows[big.pk]["loss_free"] is False
    assert rows[big.pk]["work_lost_s"] == pytest.approx(300, abs=5)
    assert rows[small.pk]["leave_s"] == pytest.approx(1e9 / budget + 5)
    assert rows[small.pk]["loss_free"] is True  # P3 skips the big flow (EDF with skip) and admits the small one
    # Loss-free for both at once: P3 must fit both minimum rates, C/(τ − T_r), into the budget together.
    tau = preview["shortest_loss_free_notice_s"]
    assert 5e9 / tau + 1e9 / (tau - 5) == pytest.approx(budget, rel=1e-4)
    assert all(row["loss_free"] for row in preview_reclaim(world.node, tau)["jobs"])
    assert not all(row["loss_free"] for row in preview_reclaim(world.node, tau * 0.99)["jobs"])


@pytest.mark.django_db
def test_preview_of_idle_node(world: World, client_for: Any) -> None:
    assert preview_reclaim(world.node, 0) == {"notice_s": 0.0, "shortest_loss_free_notice_s": 0.0, "jobs": []}
    response = client_for("provider").get(f"/api/nodes/{world.node.pk}/reclaim-preview/?notice_s=12.5")
    assert response.status_code == 200 and response.json()["notice_s"] == 12.5


@pytest.mark.django_db
def test_campus_topology_is_spec5_shaped(world: World) -> None:
    job = f.make_job(world.group, world.users["researcher"])
    f.place_job(job, world.node, [0])
    HazardEstimate.objects.create(scope=HazardScope.NODE, node=world.node, hour_of_day=12, hazard_per_s=1e-3,
                                  hazard_upper_per_s=2e-3)
    topo = campus_topology()
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
