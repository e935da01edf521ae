"""Forms: field-by-field messages, typed values kept on refusal, and every write through the core services."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from portal.core.models import Job, LendingWindow, Node, ReclaimEvent
from portal.core.models.nodes import hash_agent_token
from tests.portal.factories import DispatchSpy
from tests.web.conftest import Campus

pytestmark = pytest.mark.django_db

GOOD_JOB = {
    "name": "llama-ft", "gpu_count": "2", "vram_gb_per_gpu": "24", "min_capability": "8.0",
    "framework": "pytorch", "command": "python train.py", "image": "", "expected_runtime_h": "6",
    "ckpt_gb": "3.2", "loss_budget_min": "30", "restart_s": "30", "priority_class": "standard",
}


def test_job_submission_refuses_bad_values_field_by_field(
    client_as: Callable[[str | None], Client], campus: Campus
) -> None:
    bad = GOOD_JOB | {"group": campus.group.pk, "gpu_count": "0", "vram_gb_per_gpu": "-1", "command": "",
                      "ckpt_gb": "lots", "expected_runtime_h": "", "name": "kept-name"}
    response = client_as("researcher").post("/jobs/new/", bad)
    assert response.status_code == 400
    form = response.context["form"]
    assert set(form.errors) == {"gpu_count", "vram_gb_per_gpu", "command", "ckpt_gb", "expected_runtime_h"}
    html = response.content.decode()
    assert "Ensure this value is greater than or equal to 1." in html
    assert "Give a command or a container image." in html
    assert "Enter a number." in html
    assert 'value="kept-name"' in html and 'value="lots"' in html  # what was typed stays
    assert 'aria-invalid="true"' in html
    assert not Job.objects.filter(name="kept-name").exists()


def test_job_submission_goes_through_the_service(
    client_as: Callable[[str | None], Client], campus: Campus, dispatch_spy: DispatchSpy,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = client_as("researcher").post("/jobs/new/", GOOD_JOB | {"group": campus.group.pk})
    job = Job.objects.get(name="llama-ft")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert job.group == campus.group and job.owner == campus.users["researcher"]
    assert job.gpu_count == 2 and job.ckpt_bytes_estimate == 3_200_000_000
    assert job.expected_runtime_s == 6 * 3600 and job.loss_budget_s == 1800
    assert dispatch_spy.calls == [("control.place_job", job.pk)]


def test_cancel_job(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    response = client_as("researcher").post(f"/jobs/{campus.job.pk}/cancel/", follow=True)
    campus.job.refresh_from_db()
    assert campus.job.state == "cancelled"
    assert b"cancelled" in response.content


def test_register_node_shows_the_token_once(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client = client_as("provider")
    response = client.post(
        "/provider/nodes/register/",
        {"provider": campus.lab.pk, "name": "vision-07", "building": campus.node.building_id,
         "gpu_model": "RTX 4090", "gpu_count": 2, "gpu_floor": 1, "access_link_mbit_s": 1000},
    )
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    token = response.context["token"]
    node = Node.objects.get(name="vision-07")
    assert node.agent_token_hash == hash_agent_token(token)
    assert node.gpus.count() == 2 and node.gpu_floor == 1
    assert f"python -m nodeagent --portal http://testserver --token {token}" in response.content.decode()
    # The node page never shows it again.
    assert token not in client.get(f"/provider/nodes/{node.pk}/").content.decode()


def test_register_node_errors_per_field(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    response = client_as("provider").post(
        "/provider/nodes/register/",
        {"provider": campus.lab.pk, "name": "bad name!", "building": "", "gpu_model": "RTX 3090",
         "gpu_count": 1, "gpu_floor": 3, "access_link_mbit_s": 1000},
    )
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert set(errors) == {"name", "building", "gpu_floor"}
    assert 'value="bad name!"' in response.content.decode()


def test_register_node_duplicate_name_comes_back_from_the_service(
    client_as: Callable[[str | None], Client], campus: Campus
) -> None:
    response = client_as("provider").post(
        "/provider/nodes/register/",
        {"provider": campus.lab.pk, "name": "vision-01", "building": campus.node.building_id,
         "gpu_model": "RTX 3090", "gpu_count": 1, "gpu_floor": 0, "access_link_mbit_s": 1000},
    )
    assert response.status_code == 400
    assert "name" in response.context["form"].errors


def test_lending_settings(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    url = f"/provider/nodes/{campus.node.pk}/settings/"
    data = {"gpu_floor": "1", "w-TOTAL_FORMS": "2", "w-INITIAL_FORMS": "0",
            "w-0-weekday": "5", "w-0-start_time": "00:00", "w-0-end_time": "23:59",
            "w-1-weekday": "0", "w-1-start_time": "19:00", "w-1-end_time": "07:00"}
    response = client_as("provider").post(url, data)
    assert response.status_code == 302
    campus.node.refresh_from_db()
    assert campus.node.gpu_floor == 1
    assert LendingWindow.objects.filter(node=campus.node).count() == 2
    bad = data | {"gpu_floor": "-1", "w-1-end_time": "25:00"}
    response = client_as("provider").post(url, bad)
    assert response.status_code == 400
    assert response.context["floor_form"].errors and response.context["windows"].errors[1]
    assert 'value="25:00"' in response.content.decode()


def test_reclaim_preview_shows_each_jobs_outcome(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client = client_as("provider")
    url = f"/provider/nodes/{campus.node.pk}/reclaim/"
    short = client.get(url, {"notice_s": "5", "fragment": "preview"}, HTTP_HX_REQUEST="true")
    assert short.status_code == 200 and b"<html" not in short.content
    preview = short.context["preview"]
    assert [j["job_id"] for j in preview["jobs"]] == [campus.job.pk]
    # Since its replica on robotics-01 was taken (5 min before the campus fixture ran) plus the 5 s notice; the
    # seconds grow with the time the fixture and the request take on a busy machine.
    assert re.search(rb"loses 5 min [5-9] s of work", short.content)
    assert b"resumes from its replica on robotics-01" in short.content
    assert b"Shortest notice with no loss" in short.content
    longer = client.get(url, {"notice_s": str(int(preview["shortest_loss_free_notice_s"]) + 1)})
    assert b"leaves with no loss" in longer.content
    invalid = client.get(url, {"notice_s": "0", "fragment": "preview"}, HTTP_HX_REQUEST="true")
    assert b"use emergency for 0" in invalid.content and b"Confirm reclaim" not in invalid.content


def test_scheduled_reclaim_through_the_service(
    client_as: Callable[[str | None], Client], campus: Campus, dispatch_spy: DispatchSpy,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = client_as("provider").post(f"/provider/nodes/{campus.node.pk}/reclaim/confirm/", {"notice_s": "120"})
    assert response.status_code == 302
    reclaim = ReclaimEvent.objects.get(node=campus.node)
    assert reclaim.kind == "scheduled" and reclaim.notice_s == 120
    assert reclaim.requested_by == campus.users["provider"]
    assert dispatch_spy.calls == [("control.run_reclaim", reclaim.pk)]


@pytest.mark.parametrize(("path", "kind"), [("emergency", "emergency"), ("killswitch", "killswitch")])
def test_emergency_and_killswitch_need_confirmation(
    client_as: Callable[[str | None], Client], campus: Campus, path: str, kind: str
) -> None:
    client = client_as("provider")
    url = f"/provider/nodes/{campus.node.pk}/reclaim/{path}/"
    refused = client.post(url, {})
    assert refused.status_code == 400 and b"Tick the box to confirm" in refused.content
    assert not ReclaimEvent.objects.exists()
    assert client.post(url, {"confirm": "on"}).status_code == 302
    assert ReclaimEvent.objects.get(node=campus.node).kind == kind
    campus.node.refresh_from_db()
    assert campus.node.state == "reclaimed"
    assert campus.node.killswitch_engaged is (kind == "killswitch")


def test_rotate_token(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    old_hash = campus.node.agent_token_hash
    response = client_as("provider").post(f"/provider/nodes/{campus.node.pk}/token/")
    assert response.status_code == 200 and "--token rna_" in response.content.decode()
    campus.node.refresh_from_db()
    assert campus.node.agent_token_hash != old_hash
