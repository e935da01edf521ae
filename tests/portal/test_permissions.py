"""The permission matrix: each role x each write endpoint (design §1 roles).

A refused call must change nothing in the database and hand nothing to the control plane.
"""

from __future__ import annotations

from typing import Any

import pytest

from portal.core.models import Job, Node
from tests.portal.api_helpers import Endpoint, role_cases, snapshot
from tests.portal.conftest import ROLES, World

NODE_ADMINS = ("admin", "provider")


def _node_url(suffix: str = "") -> Any:
    return lambda w: f"/api/nodes/{w.node.pk}/{suffix}"


def _reclaimed(w: World) -> None:
    Node.objects.filter(pk=w.node.pk).update(state="reclaimed", killswitch_engaged=True)


def _running(w: World) -> None:
    Job.objects.filter(pk=w.job.pk).update(state="running")


def _ok(status: int, roles: tuple[str, ...] = NODE_ADMINS) -> dict[str, int]:
    return dict.fromkeys(roles, status)


WRITE_ENDPOINTS = [
    Endpoint("node-register", "POST", lambda w: "/api/nodes/", _ok(201),
             body=lambda w: {"name": "new-node", "provider": w.lab.pk, "building": w.building.pk,
                             "gpus": [{"model": "RTX 4090"}]}),
    Endpoint("node-update", "PATCH", _node_url(), _ok(200), body=lambda w: {"gpu_floor": 1}),
    Endpoint("node-lending-windows", "PUT", _node_url("lending-windows/"), _ok(200),
             body=lambda w: {"windows": [{"weekday": 5, "start_time": "00:00", "end_time": "23:59"}]}),
    Endpoint("node-reclaim", "POST", _node_url("reclaim/"), _ok(201), body=lambda w: {"notice_s": 120}),
    Endpoint("node-emergency-reclaim", "POST", _node_url("emergency-reclaim/"), _ok(201)),
    Endpoint("node-killswitch", "POST", _node_url("killswitch/"), _ok(201)),
    Endpoint("node-lend-again", "POST", _node_url("lend-again/"), _ok(200), setup=_reclaimed),
    Endpoint("node-rotate-token", "POST", _node_url("rotate-token/"), _ok(200)),
    Endpoint("node-revoke-token", "POST", _node_url("revoke-token/"), _ok(204)),
    Endpoint("node-reclaim-preview", "GET", _node_url("reclaim-preview/?notice_s=30"), _ok(200)),
    Endpoint("job-submit", "POST", lambda w: "/api/jobs/", _ok(201, ("admin", "researcher")),
             body=lambda w: {"name": "llama", "group": w.group.pk, "command": "python train.py", "gpu_count": 1,
                             "expected_runtime_s": 3600, "ckpt_bytes_estimate": 10**9}),
    # A job of another group is invisible: 404, never a hint that it exists.
    Endpoint("job-cancel", "POST", lambda w: f"/api/jobs/{w.job.pk}/cancel/", _ok(200, ("admin", "researcher")),
             denied=404, setup=_running),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("endpoint", "role"), role_cases(WRITE_ENDPOINTS))
def test_permission_matrix(endpoint: Endpoint, role: str, world: World, client_for: Any, dispatch_spy: Any,
                           django_capture_on_commit_callbacks: Any) -> None:
    if endpoint.setup:
        endpoint.setup(world)
    before = snapshot()
    with django_capture_on_commit_callbacks(execute=True):
        response = endpoint.call(client_for(role), world)
    assert response.status_code == endpoint.expected(role), response.content
    if response.status_code >= 400:
        assert snapshot() == before, "a refused call changed the database"
        assert dispatch_spy.calls == []
    elif endpoint.method != "GET":
        assert snapshot()["audit"] == before["audit"] + 1, "every change is audited"


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint", [pytest.param(ep, id=ep.name) for ep in WRITE_ENDPOINTS])
def test_anonymous_refused(endpoint: Endpoint, world: World, client_for: Any) -> None:
    before = snapshot()
    assert endpoint.call(client_for(None), world).status_code in (401, 403)
    assert snapshot() == before


@pytest.mark.django_db
def test_provider_cannot_reclaim_another_labs_node(world: World, client_for: Any, dispatch_spy: Any,
                                                   django_capture_on_commit_callbacks: Any) -> None:
    before = snapshot()
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for("provider").post(f"/api/nodes/{world.other_node.pk}/reclaim/", {"notice_s": 0},
                                               format="json")
    assert response.status_code == 403
    assert snapshot() == before
    assert Node.objects.get(pk=world.other_node.pk).state == "online"
    assert dispatch_spy.calls == []


@pytest.mark.django_db
def test_researcher_cannot_cancel_another_groups_job(world: World, client_for: Any, dispatch_spy: Any) -> None:
    _running(world)
    before = snapshot()
    response = client_for("other_researcher").post(f"/api/jobs/{world.job.pk}/cancel/")
    assert response.status_code == 404
    assert snapshot() == before
    assert Job.objects.get(pk=world.job.pk).state == "running"


@pytest.mark.django_db
def test_other_group_jobs_are_invisible(world: World, client_for: Any) -> None:
    assert client_for("other_researcher").get(f"/api/jobs/{world.job.pk}/").status_code == 404
    assert client_for("other_researcher").get("/api/jobs/").json()["count"] == 0
    assert client_for("provider").get(f"/api/jobs/{world.job.pk}/checkpoints/").status_code == 404
    assert client_for("researcher").get("/api/jobs/").json()["count"] == 1
    assert client_for("admin").get("/api/jobs/").json()["count"] == 1


@pytest.mark.django_db
def test_provider_cannot_register_for_another_lab(world: World, client_for: Any) -> None:
    before = snapshot()
    response = client_for("provider").post(
        "/api/nodes/", {"name": "sneaky", "provider": world.other_lab.pk, "building": world.building.pk,
                        "gpus": [{"model": "A100"}]}, format="json")
    assert response.status_code == 403
    assert snapshot() == before


@pytest.mark.django_db
@pytest.mark.parametrize("role", ROLES)
def test_every_role_reads_nodes_and_campus(role: str, world: World, client_for: Any) -> None:
    client = client_for(role)
    for url in ("/api/nodes/", f"/api/nodes/{world.node.pk}/", "/api/campus/topology/", "/api/summary/",
                "/api/me/", "/api/reclaims/", "/api/campus/buildings/"):
        assert client.get(url).status_code == 200, url
