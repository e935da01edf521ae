"""A job's own memory limit and CPU quota (design §19.2): asked in the submission form and the API, validated with
the field named, shown on the job page ("node default" when not set), and sent to the agent in the job's start
command only when set — for a first start and a resume alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from rest_framework.test import APIClient

from portal.core.models import Job
from tests.portal import factories as f
from tests.web.conftest import Campus
from tests.web.test_forms import GOOD_JOB

pytestmark = pytest.mark.django_db

GIB, MIB, TIB = 2**30, 2**20, 2**40
API_JOB = {"name": "api-limits", "gpu_count": 1, "expected_runtime_s": 3600, "ckpt_bytes_estimate": 10**9,
           "command": "python train.py"}


def _api(campus: Campus) -> APIClient:
    client = APIClient()
    client.force_authenticate(campus.users["researcher"])
    return client


# --- the form and the job page ----------------------------------------------------------------------------------
def test_form_takes_the_limits_in_gib_and_cores_and_the_job_page_shows_them(
        client_as: Callable[[str | None], Client], campus: Campus) -> None:
    response = client_as("researcher").post("/jobs/new/", GOOD_JOB | {"group": campus.group.pk,
                                                                      "memory_gib": "16", "cpu_cores": "0.5"})
    assert response.status_code == 302, response.content
    job = Job.objects.get(name="llama-ft")
    assert (job.memory_bytes, job.cpu_cores) == (16 * GIB, 0.5)
    page = client_as("researcher").get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="memory-limit">16 GiB<' in page and 'data-testid="cpu-limit">0.5<' in page


def test_form_left_empty_is_the_node_default_and_the_page_says_so(
        client_as: Callable[[str | None], Client], campus: Campus) -> None:
    client_as("researcher").post("/jobs/new/", GOOD_JOB | {"group": campus.group.pk, "memory_gib": "",
                                                          "cpu_cores": ""})
    job = Job.objects.get(name="llama-ft")
    assert (job.memory_bytes, job.cpu_cores) == (None, None)
    page = client_as("researcher").get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="memory-limit">node default<' in page and 'data-testid="cpu-limit">node default<' in page


def test_the_job_page_shows_a_limit_that_is_not_whole_gib_in_mib(
        client_as: Callable[[str | None], Client], campus: Campus) -> None:
    job = f.make_job(campus.group, campus.users["researcher"], memory_bytes=1536 * MIB, cpu_cores=4.0)
    page = client_as("researcher").get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="memory-limit">1536 MiB<' in page and 'data-testid="cpu-limit">4<' in page


@pytest.mark.parametrize(("fields", "named"), [
    ({"memory_gib": "0.1"}, {"memory_gib"}),  # under 256 MiB
    ({"memory_gib": "20000"}, {"memory_gib"}),  # over 16 TiB
    ({"memory_gib": "lots"}, {"memory_gib"}),
    ({"cpu_cores": "0"}, {"cpu_cores"}),
    ({"cpu_cores": "-2"}, {"cpu_cores"}),
    ({"cpu_cores": "2000"}, {"cpu_cores"}),
    ({"memory_gib": "0", "cpu_cores": "x"}, {"memory_gib", "cpu_cores"}),
])
def test_form_refuses_bad_limits_naming_the_field(client_as: Callable[[str | None], Client], campus: Campus,
                                                 fields: dict[str, str], named: set[str]) -> None:
    response = client_as("researcher").post("/jobs/new/", GOOD_JOB | {"group": campus.group.pk, "name": "x",
                                                                      **fields})
    assert response.status_code == 400
    assert set(response.context["form"].errors) == named
    assert not Job.objects.filter(name="x").exists()


def test_the_submit_page_offers_the_two_fields(client_as: Callable[[str | None], Client]) -> None:
    page = client_as("researcher").get("/jobs/new/").content.decode()
    assert "Memory limit (GiB)" in page and "CPU cores" in page


# --- the API ------------------------------------------------------------------------------------------------------
def test_api_takes_and_shows_the_limits(campus: Campus) -> None:
    made = _api(campus).post("/api/jobs/", API_JOB | {"memory_bytes": 8 * GIB, "cpu_cores": 2.5}, format="json")
    assert made.status_code == 201, made.content
    assert (made.json()["memory_bytes"], made.json()["cpu_cores"]) == (8 * GIB, 2.5)
    shown = _api(campus).get(f"/api/jobs/{made.json()['id']}/").json()
    assert (shown["memory_bytes"], shown["cpu_cores"]) == (8 * GIB, 2.5)
    assert (Job.objects.get(pk=made.json()["id"]).memory_bytes) == 8 * GIB
    default = _api(campus).post("/api/jobs/", API_JOB | {"name": "d"}, format="json").json()
    assert (default["memory_bytes"], default["cpu_cores"]) == (None, None)
    nulls = _api(campus).post("/api/jobs/", API_JOB | {"name": "n", "memory_bytes": None, "cpu_cores": None},
                              format="json")
    assert nulls.status_code == 201 and nulls.json()["memory_bytes"] is None
    listed = {j["id"]: j for j in _api(campus).get("/api/jobs/").json()["results"]}
    assert listed[made.json()["id"]]["cpu_cores"] == 2.5


def test_api_bounds_are_inclusive_and_an_integral_float_is_bytes(campus: Campus) -> None:
    low = _api(campus).post("/api/jobs/", API_JOB | {"name": "lo", "memory_bytes": 256 * MIB, "cpu_cores": 1024},
                            format="json")
    assert low.status_code == 201, low.content
    high = _api(campus).post("/api/jobs/", API_JOB | {"name": "hi", "memory_bytes": float(16 * TIB),
                                                      "cpu_cores": 0.01}, format="json")
    assert high.status_code == 201, high.content
    assert high.json()["memory_bytes"] == 16 * TIB and isinstance(high.json()["memory_bytes"], int)


@pytest.mark.parametrize(("field", "bad"), [
    ("memory_bytes", 256 * MIB - 1), ("memory_bytes", 16 * TIB + 1), ("memory_bytes", 1.5e9 + 0.5),
    ("memory_bytes", "16G"), ("memory_bytes", True), ("memory_bytes", -1),
    ("cpu_cores", 0), ("cpu_cores", -1), ("cpu_cores", 1024.5), ("cpu_cores", "many"), ("cpu_cores", True),
    ("cpu_cores", "NaN"),
])
def test_api_refuses_a_bad_limit_naming_the_field(campus: Campus, field: str, bad: Any) -> None:
    refused = _api(campus).post("/api/jobs/", API_JOB | {"name": "z", field: bad}, format="json")
    assert refused.status_code == 400, refused.content
    assert set(refused.json()) == {field}
    assert not Job.objects.filter(name="z").exists()


def test_an_idempotent_submit_with_limits_answers_the_first_job_again(campus: Campus) -> None:
    body = API_JOB | {"name": "once", "memory_bytes": 4 * GIB, "cpu_cores": 3}
    first = _api(campus).post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="lim-1")
    again = _api(campus).post("/api/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="lim-1")
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json() and Job.objects.filter(name="once").count() == 1
    other = _api(campus).post("/api/jobs/", body | {"cpu_cores": 4}, format="json", HTTP_IDEMPOTENCY_KEY="lim-1")
    assert other.status_code == 422 and "Idempotency-Key" in other.json()
    assert Job.objects.filter(name="once").count() == 1


def test_the_schema_shows_the_limits() -> None:
    from drf_spectacular.generators import SchemaGenerator

    schemas = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    for name in ("JobSubmit", "Job", "JobDetail"):
        props = schemas[name]["properties"]
        assert props["memory_bytes"]["type"] == "integer" and props["memory_bytes"].get("nullable") is True, name
        assert props["cpu_cores"]["type"] == "number" and props["cpu_cores"].get("nullable") is True, name
    submit = schemas["JobSubmit"]["properties"]
    assert submit["memory_bytes"]["minimum"] == 256 * MIB and submit["memory_bytes"]["maximum"] == 16 * TIB
    assert submit["cpu_cores"]["maximum"] == 1024


# --- the service and the model ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("field", "bad"), [("memory_bytes", 100), ("memory_bytes", 2.0**40),
                                            ("cpu_cores", 0.0), ("cpu_cores", float("inf"))])
def test_service_refuses_a_bad_limit_naming_the_field(campus: Campus, field: str, bad: Any) -> None:
    from portal.core.services.jobs import submit_job

    with pytest.raises(ValidationError) as err:
        submit_job(campus.users["researcher"], group=campus.group, name="s", gpu_count=1, expected_runtime_s=60,
                   ckpt_bytes_estimate=10, command="x", **{field: bad})
    assert set(err.value.message_dict) == {field}


@pytest.mark.parametrize(("fields", "named"), [
    ({"memory_bytes": 255 * MIB}, "memory_bytes"), ({"memory_bytes": 17 * TIB}, "memory_bytes"),
    ({"cpu_cores": 0.0}, "cpu_cores"), ({"cpu_cores": 1025.0}, "cpu_cores"),
])
def test_the_models_validators_bound_the_limits(campus: Campus, fields: dict[str, Any], named: str) -> None:
    job = Job(name="m", owner=campus.users["researcher"], group=campus.group, command="x", gpu_count=1,
              expected_runtime_s=60, ckpt_bytes_estimate=10, **fields)
    with pytest.raises(ValidationError) as err:
        job.full_clean()
    assert named in err.value.message_dict
    Job(name="m", owner=campus.users["researcher"], group=campus.group, command="x", gpu_count=1,
        expected_runtime_s=60, ckpt_bytes_estimate=10, memory_bytes=256 * MIB, cpu_cores=0.5).full_clean()


# --- the start command ------------------------------------------------------------------------------------------
def _started(campus: Campus, job: Job, restore: Any = None) -> dict[str, Any]:
    from portal.control.models import AgentCommand
    from portal.control.reclaim.workflow import start_on

    start_on(job, campus.node.pk, [0], restore, "resume" if restore else "placed")
    return AgentCommand.objects.filter(kind="start_job", node=campus.node).latest("id").payload


def test_start_on_sends_the_limits_when_set_on_a_first_start_and_a_resume(campus: Campus) -> None:
    job = f.make_job(campus.group, campus.users["researcher"], memory_bytes=24 * GIB, cpu_cores=6.0)
    first = _started(campus, job)
    assert (first["memory_bytes"], first["cpu_cores"]) == (24 * GIB, 6.0)
    assert type(first["memory_bytes"]) is int and type(first["cpu_cores"]) is float
    ckpt = f.make_checkpoint(job, campus.node, size_bytes=10**6, completed_ago_s=10)
    resumed = _started(campus, job, ckpt)
    assert resumed["restore_sequence"] == ckpt.sequence
    assert (resumed["memory_bytes"], resumed["cpu_cores"]) == (24 * GIB, 6.0)


def test_start_on_leaves_out_a_limit_the_job_did_not_set(campus: Campus) -> None:
    neither = _started(campus, f.make_job(campus.group, campus.users["researcher"]))
    assert "memory_bytes" not in neither and "cpu_cores" not in neither
    only_cpu = _started(campus, f.make_job(campus.group, campus.users["researcher"], cpu_cores=2.0))
    assert "memory_bytes" not in only_cpu and only_cpu["cpu_cores"] == 2.0


def test_the_agent_lowers_its_defaults_to_a_request_and_never_raises_them(tmp_path: Any) -> None:
    """``Confiner.limits_for`` (design §19.2): a request below the node's per-GPU default is kept (an int-like float
    too), one above is capped at it (a job never takes more than the owner lends), none or a bad one is the
    default; a node without defaults takes the request as it is."""
    from nodeagent.confine import Confiner

    confiner = Confiner(data_dir=tmp_path, mode="off", memory_bytes_per_gpu=8 * GIB, cpu_cores_per_gpu=4.0)
    asked = confiner.limits_for([0, 1], 12 * GIB, 6.0)
    assert (asked.memory_bytes, asked.cpu_cores) == (12 * GIB, 6.0)
    assert confiner.limits_for([0], float(2 * GIB), 3).memory_bytes == 2 * GIB
    over = confiner.limits_for([0], 64 * GIB, 32.0)
    assert (over.memory_bytes, over.cpu_cores) == (8 * GIB, 4.0)
    defaults = confiner.limits_for([0, 1])
    assert (defaults.memory_bytes, defaults.cpu_cores) == (16 * GIB, 8.0)
    bad = confiner.limits_for([0], 1.5, True)
    assert (bad.memory_bytes, bad.cpu_cores) == (8 * GIB, 4.0)
    unlimited = Confiner(data_dir=tmp_path / "u", mode="off").limits_for([0], 64 * GIB, 32.0)
    assert (unlimited.memory_bytes, unlimited.cpu_cores) == (64 * GIB, 32.0)
