"""A job's loss budget mode (design §2 "Loss budget modes"): picked in the submission form and the API, validated
with the field named, "expected" by default, shown on the job page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from portal.core.models import Job
from tests.web.conftest import Campus
from tests.web.test_forms import GOOD_JOB

pytestmark = pytest.mark.django_db

API_JOB = {"name": "api-bound", "gpu_count": 1, "expected_runtime_s": 3600, "ckpt_bytes_estimate": 10**9,
           "command": "python train.py", "loss_budget_s": 900}


def test_form_default_is_expected_and_bound_is_kept(client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client_as("researcher").post("/jobs/new/", GOOD_JOB | {"group": campus.group.pk})
    assert Job.objects.get(name="llama-ft").loss_budget_mode == "expected"
    client_as("researcher").post("/jobs/new/", GOOD_JOB | {"group": campus.group.pk, "name": "b",
                                                          "loss_budget_mode": "bound"})
    job = Job.objects.get(name="b")
    assert job.loss_budget_mode == "bound"
    page = client_as("researcher").get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="loss-budget-mode">bound' in page


def test_form_refuses_an_unknown_mode_naming_the_field(client_as: Callable[[str | None], Client],
                                                       campus: Campus) -> None:
    response = client_as("researcher").post("/jobs/new/", GOOD_JOB | {"group": campus.group.pk, "name": "x",
                                                                      "loss_budget_mode": "strict"})
    assert response.status_code == 400
    assert set(response.context["form"].errors) == {"loss_budget_mode"}
    assert not Job.objects.filter(name="x").exists()


def _api(campus: Campus) -> APIClient:
    client = APIClient()
    client.force_authenticate(campus.users["researcher"])
    return client


def test_api_takes_and_shows_the_mode(campus: Campus) -> None:
    made = _api(campus).post("/api/jobs/", API_JOB | {"loss_budget_mode": "bound"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["loss_budget_mode"] == "bound"
    default = _api(campus).post("/api/jobs/", API_JOB | {"name": "d"}, format="json")
    assert default.json()["loss_budget_mode"] == "expected"
    assert _api(campus).get(f"/api/jobs/{made.json()['id']}/").json()["loss_budget_mode"] == "bound"


@pytest.mark.parametrize("bad", ["strict", 1, None, ""])
def test_api_refuses_a_bad_mode_naming_the_field(campus: Campus, bad: Any) -> None:
    refused = _api(campus).post("/api/jobs/", API_JOB | {"name": "z", "loss_budget_mode": bad}, format="json")
    assert refused.status_code == 400 and "loss_budget_mode" in refused.json()
    assert not Job.objects.filter(name="z").exists()


def test_service_refuses_a_bad_mode(campus: Campus) -> None:
    from django.core.exceptions import ValidationError

    from portal.core.services.jobs import submit_job

    with pytest.raises(ValidationError) as err:
        submit_job(campus.users["researcher"], group=campus.group, name="s", gpu_count=1, expected_runtime_s=60,
                   ckpt_bytes_estimate=10, command="x", loss_budget_mode="worst")
    assert "loss_budget_mode" in err.value.message_dict
