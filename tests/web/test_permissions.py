"""Identity is the mechanism: other labs' nodes and other groups' jobs are 404, by URL or by form edit."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.test import Client

from portal.core.models import Node, ReclaimEvent
from tests.web.conftest import Campus

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "url",
    ["/provider/", "/provider/reclaims/", "/provider/nodes/register/", "/provider/nodes/{node}/",
     "/provider/nodes/{node}/reclaim/"],
)
def test_researcher_cannot_reach_provider_pages(
    client_as: Callable[[str | None], Client], campus: Campus, url: str
) -> None:
    assert client_as("researcher").get(url.format(node=campus.node.pk)).status_code == 404


def test_researcher_cannot_see_another_groups_job(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client = client_as("researcher")
    assert client.get(f"/jobs/{campus.other_job.pk}/").status_code == 404
    assert client.post(f"/jobs/{campus.other_job.pk}/cancel/").status_code == 404
    campus.other_job.refresh_from_db()
    assert campus.other_job.state == "queued"


@pytest.mark.parametrize("url", ["/jobs/", "/jobs/new/", "/jobs/{job}/"])
def test_provider_has_no_researcher_pages(client_as: Callable[[str | None], Client], campus: Campus, url: str) -> None:
    assert client_as("provider").get(url.format(job=campus.job.pk)).status_code == 404


@pytest.mark.parametrize("role", ["provider", "researcher", "outsider"])
def test_dashboard_is_for_admins(client_as: Callable[[str | None], Client], role: str) -> None:
    client = client_as(role)
    assert client.get("/dashboard/").status_code == 404
    assert client.get("/dashboard/export/groups.csv").status_code == 404
    assert client.get("/dashboard/charts.json").status_code == 404


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("reclaim/confirm/", {"notice_s": "60"}),
        ("reclaim/emergency/", {"confirm": "on"}),
        ("reclaim/killswitch/", {"confirm": "on"}),
        ("lend-again/", {}),
        ("token/", {}),
        ("settings/", {"gpu_floor": "0", "w-TOTAL_FORMS": "0", "w-INITIAL_FORMS": "0"}),
    ],
)
def test_provider_cannot_act_on_another_labs_node(
    client_as: Callable[[str | None], Client], campus: Campus, path: str, data: dict[str, str]
) -> None:
    client = client_as("provider")
    assert client.get(f"/provider/nodes/{campus.other_node.pk}/").status_code == 404
    response = client.post(f"/provider/nodes/{campus.other_node.pk}/{path}", data)
    assert response.status_code == 404
    assert not ReclaimEvent.objects.filter(node=campus.other_node).exists()
    campus.other_node.refresh_from_db()
    assert campus.other_node.state == "online" and not campus.other_node.killswitch_engaged


def test_provider_cannot_register_a_node_for_another_lab(
    client_as: Callable[[str | None], Client], campus: Campus
) -> None:
    """Editing the form's lab id to another lab's is refused like any invalid choice."""
    response = client_as("provider").post(
        "/provider/nodes/register/",
        {"provider": campus.other_lab.pk, "name": "sneaky-01", "building": campus.node.building_id,
         "gpu_model": "RTX 3090", "gpu_count": 1, "gpu_floor": 0, "access_link_mbit_s": 1000},
    )
    assert response.status_code == 400
    assert b"Select a valid choice" in response.content
    assert not Node.objects.filter(name="sneaky-01").exists()


def test_researcher_cannot_submit_for_another_group(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    response = client_as("researcher").post("/jobs/new/", {"group": campus.other_group.pk, "name": "x"})
    assert response.status_code == 400
    assert b"Select a valid choice" in response.content
