"""One-time form tokens: a double click or a browser retry of a web form does its work once."""

from __future__ import annotations

import re
from collections.abc import Callable

from django.test import Client

from portal.core.models import Job, Node, ReclaimEvent
from tests.web.conftest import Campus
from tests.web.test_forms import GOOD_JOB


def _token(client: Client, path: str) -> str:
    html = client.get(path).content.decode()
    match = re.search(r'name="submit_token" value="([^"]+)"', html)
    assert match, f"no submit_token on {path}"
    return match.group(1)


def test_every_rendered_form_gets_a_fresh_token(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client = client_as("researcher")
    assert _token(client, "/jobs/new/") != _token(client, "/jobs/new/")


def test_a_double_submitted_job_form_creates_one_job(client_as: Callable[[str | None], Client],
                                                     campus: Campus) -> None:
    client = client_as("researcher")
    form = GOOD_JOB | {"group": campus.group.pk, "submit_token": _token(client, "/jobs/new/")}
    first = client.post("/jobs/new/", form)
    second = client.post("/jobs/new/", form)  # the browser sent it again
    job = Job.objects.get(name="llama-ft")
    assert Job.objects.filter(name="llama-ft").count() == 1
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"] == f"/jobs/{job.pk}/"
    page = client.get(second["Location"]).content.decode()
    assert "already sent" in page


def test_a_refused_form_keeps_no_token_so_the_corrected_one_goes_through(
        client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client = client_as("researcher")
    token = _token(client, "/jobs/new/")
    bad = client.post("/jobs/new/", GOOD_JOB | {"group": campus.group.pk, "gpu_count": "0", "submit_token": token})
    assert bad.status_code == 400
    good = client.post("/jobs/new/", GOOD_JOB | {"group": campus.group.pk, "submit_token": token})
    assert good.status_code == 302 and Job.objects.filter(name="llama-ft").count() == 1


def test_a_double_submitted_registration_registers_once_and_leads_to_the_node(
        client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client = client_as("provider")
    form = {"provider": campus.lab.pk, "name": "vision-09", "building": campus.node.building_id,
            "gpu_model": "RTX 4090", "gpu_count": 1, "gpu_floor": 0, "access_link_mbit_s": 1000,
            "submit_token": _token(client, "/provider/nodes/register/")}
    first = client.post("/provider/nodes/register/", form)
    second = client.post("/provider/nodes/register/", form)
    node = Node.objects.get(name="vision-09")
    assert first.status_code == 200 and first.context["token"]  # the one-time token page
    assert second.status_code == 302 and second["Location"] == f"/provider/nodes/{node.pk}/"
    assert first.context["token"] not in client.get(second["Location"]).content.decode()


def test_a_double_clicked_emergency_reclaim_reclaims_once(client_as: Callable[[str | None], Client],
                                                          campus: Campus) -> None:
    client = client_as("provider")
    token = _token(client, f"/provider/nodes/{campus.node.pk}/reclaim/")
    path = f"/provider/nodes/{campus.node.pk}/reclaim/emergency/"
    first = client.post(path, {"confirm": "on", "submit_token": token})
    second = client.post(path, {"confirm": "on", "submit_token": token})
    assert first.status_code == second.status_code == 302
    assert ReclaimEvent.objects.filter(node=campus.node).count() == 1
    assert "cannot be reclaimed" not in client.get(second["Location"]).content.decode()
