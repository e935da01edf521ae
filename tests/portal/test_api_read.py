"""Read endpoints: shapes, filters, nested resources, summary, and a query-count baseline (no N+1)."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from portal.core.models import Migration
from portal.core.services.reclaims import emergency_reclaim
from tests.portal import factories as f
from tests.portal.api_helpers import assert_no_n_plus_one
from tests.portal.conftest import World

# (url, role, add rows) — each list endpoint declares only how to add rows of its resource.
LISTS: dict[str, tuple[str, Any]] = {
    "/api/nodes/": ("provider", lambda w, n: [f.make_node(w.lab, w.building, gpus=2) for _ in range(n)]),
    "/api/jobs/": ("researcher", lambda w, n: [f.place_job(f.make_job(w.group, w.users["researcher"]), w.node)
                                               for _ in range(n)]),
    "/api/reclaims/": ("admin", lambda w, n: [
        emergency_reclaim(f.make_node(w.lab, w.building, state="online")[0], None) for _ in range(n)]),
    "/api/campus/links/": ("outsider", lambda w, n: [f.make_node(w.lab, w.building) for _ in range(n)]),
    "/api/campus/buildings/": ("outsider", lambda w, n: [f.make_building() for _ in range(n)]),
}


@pytest.mark.django_db
@pytest.mark.parametrize("url", list(LISTS))
def test_list_has_no_n_plus_one(url: str, world: World, client_for: Any) -> None:
    role, add = LISTS[url]
    assert_no_n_plus_one(client_for(role), url, lambda n: add(world, n))


@pytest.mark.django_db
def test_node_detail_shape(world: World, client_for: Any) -> None:
    data = client_for("outsider").get(f"/api/nodes/{world.node.pk}/").json()
    assert data["name"] == "vision-01" and data["provider_name"] == "Vision Lab" and data["state"] == "online"
    assert [g["model"] for g in data["gpus"]] == ["RTX 3090", "RTX 3090"]
    assert data["access_link_bytes_per_s"] == 125e6 and data["lendable_gpu_count"] == 2


@pytest.mark.django_db
def test_node_filters(world: World, client_for: Any) -> None:
    client = client_for("provider")
    assert client.get("/api/nodes/?mine=1").json()["count"] == 1
    assert client.get(f"/api/nodes/?provider={world.other_lab.pk}").json()["count"] == 1
    assert client.get("/api/nodes/?state=reclaimed").json()["count"] == 0


@pytest.mark.django_db
def test_job_nested_resources(world: World, client_for: Any) -> None:
    job = world.job
    f.place_job(job, world.node)
    ckpt = f.make_checkpoint(job, world.node)
    ckpt.replica_nodes.add(world.other_node)
    Migration.objects.create(job=job, source=world.node, destination=world.other_node, mode="planned",
                             bytes=10**9, work_lost_s=0, success=True)
    client = client_for("researcher")
    detail = client.get(f"/api/jobs/{job.pk}/").json()
    assert detail["node"] == "vision-01" and detail["state"] == "running" and detail["owner"] == "researcher"
    [checkpoint] = client.get(f"/api/jobs/{job.pk}/checkpoints/").json()
    assert checkpoint["replica_nodes"] == ["robotics-01"]
    [migration] = client.get(f"/api/jobs/{job.pk}/migrations/").json()
    assert migration["destination_name"] == "robotics-01" and migration["mode"] == "planned"
    assert len(client.get(f"/api/jobs/{job.pk}/placements/").json()) == 1


@pytest.mark.django_db
def test_reclaims_visible_to_lab_and_affected_group(world: World, client_for: Any) -> None:
    event = emergency_reclaim(world.node, world.users["provider"])
    Migration.objects.create(job=world.job, reclaim=event, source=world.node, mode="degraded")
    assert client_for("provider").get("/api/reclaims/").json()["count"] == 1
    assert client_for("researcher").get("/api/reclaims/").json()["count"] == 1
    assert client_for("other_provider").get("/api/reclaims/").json()["count"] == 0
    assert client_for("other_researcher").get(f"/api/reclaims/{event.pk}/").status_code == 404


@pytest.mark.django_db
def test_summary(world: World, client_for: Any) -> None:
    f.place_job(world.job, world.node, [0])
    Migration.objects.create(job=world.job, source=world.node, mode="degraded", work_lost_s=1800, success=True)
    data = client_for("researcher").get("/api/summary/").json()
    assert data["nodes_by_state"]["online"] == 2 and data["jobs_by_state"]["running"] == 1
    assert data["gpus_total"] == 3 and data["gpus_lendable_online"] == 3 and data["gpus_busy"] == 1
    assert data["gpu_utilization"] == pytest.approx(1 / 3)
    assert data["work_lost_gpu_hours"] == pytest.approx(0.5)
    assert data["migrations"]["success_rate"] == 1.0


@pytest.mark.django_db
def test_topology_endpoint(world: World, client_for: Any) -> None:
    data = client_for("outsider").get("/api/campus/topology/").json()
    assert {"buildings", "switches", "links", "nodes"} <= set(data)
    assert {n["id"] for n in data["nodes"]} == {"vision-01", "robotics-01"}


@pytest.mark.django_db
def test_me(world: World, client_for: Any) -> None:
    data = client_for("provider").get("/api/me/").json()
    assert data["roles"] == ["provider"] and data["providers"][0]["name"] == "Vision Lab"
    assert client_for("admin").get("/api/me/").json()["roles"] == ["admin"]


@pytest.mark.django_db
def test_token_auth(world: World) -> None:
    f.make_user("tokenuser", password="s3cret-pass")
    client = APIClient()
    assert client.get("/api/nodes/").status_code in (401, 403)
    response = client.post("/api/auth/token/", {"username": "tokenuser", "password": "s3cret-pass"}, format="json")
    assert response.status_code == 200
    client.credentials(HTTP_AUTHORIZATION=f"Token {response.json()['token']}")
    assert client.get("/api/nodes/").status_code == 200
    bad = APIClient().post("/api/auth/token/", {"username": "tokenuser", "password": "nope"}, format="json")
    assert bad.status_code == 400


@pytest.mark.django_db
def test_every_api_route_requires_authentication(world: World) -> None:
    """Walk the URL resolver: every /api/ route refuses an anonymous GET, except the token endpoint and the
    public schema/docs pages."""
    from django.urls import get_resolver

    from portal.core.api import urls as api_urls

    anonymous = APIClient()
    checked = 0

    def walk(patterns: Any, prefix: str) -> Any:
        for pattern in patterns:
            route = prefix + str(pattern.pattern).lstrip("^").rstrip("$").replace("\\Z", "")
            if hasattr(pattern, "url_patterns"):
                yield from walk(pattern.url_patterns, route)
            else:
                yield route

    for route in walk(get_resolver(api_urls).url_patterns, ""):
        # Routes with converters or regular-expression classes name no single path: the probes below cover them.
        if any(part in route for part in ("auth/token", "schema", "docs", "redoc", "<", "(?P", "[", "format")):
            continue
        path = "/api/" + route.replace("\\.", ".")
        response = anonymous.get(path)
        assert response.status_code in (401, 403, 405), (path, response.status_code)
        checked += 1
    for path in ("/api/nodes/1/", "/api/jobs/1/", "/api/decide/p1/", "/metrics",
                 "/api/jobs/1/results/files/metrics/final.json", "/api/jobs/not-a-number/results/files/a\nb"):
        assert anonymous.get(path).status_code in (401, 403, 405), path
    assert checked >= 10
    for path in ("/api/schema/", "/api/docs/", "/api/redoc/"):
        assert anonymous.get(path).status_code == 200, path


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path"), [("get", "/api/nodes/1.5/"), ("get", "/api/jobs/7.4e-141/"),
                                              ("post", "/api/nodes/-1.2e-306/killswitch/"),
                                              ("get", "/api/no-such-route/"),
                                              ("get", "/api/notify/preferences/%C2%9EY%06%0A0/"),
                                              ("delete", "/api/notify/preferences/a%0Ab/")])
def test_an_id_that_is_not_a_number_or_an_unknown_route_answers_json_404(world: World, method: str,
                                                                          path: str) -> None:
    """Fuzz-found: ids the router's pattern does not match fell through to Django's HTML 404 page (the schema
    documents JSON), and so did one holding a line break, which the catch-all's ``.`` did not match; a POST there,
    from a token client with no CSRF cookie, must not answer a CSRF 403 either."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=world.users['admin']).key}")
    response = getattr(client, method)(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found."}


@pytest.mark.django_db
def test_an_unknown_api_route_says_nothing_to_anonymous_callers() -> None:
    assert APIClient().get("/api/no-such-route/").status_code == 401


@pytest.mark.django_db
def test_an_api_path_without_its_trailing_slash_is_still_redirected(client_for: Any) -> None:
    assert client_for("admin").get("/api/nodes").status_code == 301
