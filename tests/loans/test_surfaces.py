"""Where people and agents meet loans (design §15): ``GET /api/ladder/``, ``POST /api/jobs/{id}/resume/``, what a
class may borrow at submit, the ladder page and the job form, the Django admin, the heartbeat's new field and the
agent's utilisation sources."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.portal import factories as f

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("ladder")]


@pytest.fixture
def labs() -> Any:
    return f.make_two_labs()


def _client(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _suspended_job(labs: Any) -> Any:
    from portal.core.models import Job

    job = f.make_job(labs.group, labs.users["researcher"], name="notebook")
    Job.objects.filter(pk=job.pk).update(state="suspended")
    job.refresh_from_db()
    return job


# --- the ladder in the API ----------------------------------------------------------------------------------


def test_every_signed_in_user_reads_the_ladder_in_class_order(labs: Any) -> None:
    answer = _client(labs.users["outsider"]).get("/api/ladder/")
    assert answer.status_code == 200
    body = answer.json()
    assert [c["priority_class"] for c in body["classes"]] == ["interactive", "standard", "best_effort"]
    interactive = body["classes"][0]
    assert (interactive["max_loan_s"], interactive["idle_limit_s"], interactive["notice_s"],
            interactive["grace_s"], interactive["max_gpus_per_job"]) == (28800.0, 1800.0, 600.0, 120.0, 2)
    assert body["watchdog_never"] == ["best_effort"]
    assert body["classes"][2]["idle_limit_s"] is None  # never watched: no idle limit to publish
    assert [s["step"] for s in body["reclaim_sequence"]] == ["warn", "drain", "force"]


def test_the_ladder_is_not_public() -> None:
    assert APIClient().get("/api/ladder/").status_code in (401, 403)


def test_an_admins_edit_of_a_class_policy_is_what_the_ladder_says_next(labs: Any) -> None:
    from portal.control.models import ClassPolicy

    policy = ClassPolicy.objects.get(priority_class="standard")
    policy.idle_watch = False
    policy.save()  # clears the cached ladder
    assert _client(labs.users["researcher"]).get("/api/ladder/").json()["watchdog_never"] == [
        "standard", "best_effort"]


def test_the_schema_documents_the_ladder_and_resume() -> None:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert "/api/ladder/" in schema["paths"] and "/api/jobs/{id}/resume/" in schema["paths"]
    ladder = schema["paths"]["/api/ladder/"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ladder["$ref"].endswith("/Ladder")


# --- resume ----------------------------------------------------------------------------------------------------


def test_the_owner_resumes_a_suspended_job_and_it_is_queued(labs: Any) -> None:
    from portal.core.models import AuditLog, OutboxMessage

    job = _suspended_job(labs)
    answer = _client(labs.users["researcher"]).post(f"/api/jobs/{job.pk}/resume/")
    assert answer.status_code == 200 and answer.json()["state"] == "queued"
    assert AuditLog.objects.filter(action="job.resume", object_id=str(job.pk)).exists()
    assert OutboxMessage.objects.filter(args=[job.pk]).exists()  # placement asked for


def test_only_a_suspended_job_resumes(labs: Any) -> None:
    job = f.make_job(labs.group, labs.users["researcher"], name="queued-one")
    answer = _client(labs.users["researcher"]).post(f"/api/jobs/{job.pk}/resume/")
    assert answer.status_code == 409 and "cannot go back to the queue" in answer.json()["detail"]


def test_a_group_member_who_is_not_the_owner_may_not_resume(labs: Any) -> None:
    job = _suspended_job(labs)
    colleague = f.make_user("colleague")
    labs.group.members.add(colleague)
    assert _client(colleague).post(f"/api/jobs/{job.pk}/resume/").status_code == 403


def test_another_groups_job_is_not_there(labs: Any) -> None:
    job = _suspended_job(labs)
    assert _client(labs.users["other_researcher"]).post(f"/api/jobs/{job.pk}/resume/").status_code == 404


# --- what a class may borrow ---------------------------------------------------------------------------------


def test_an_interactive_job_may_not_borrow_more_gpus_than_its_class_allows(labs: Any) -> None:
    body = {"name": "big-notebook", "gpu_count": 4, "command": "jupyter lab", "expected_runtime_s": 3600,
            "ckpt_bytes_estimate": 10**9, "priority_class": "interactive"}
    answer = _client(labs.users["researcher"]).post("/api/jobs/", body, format="json")
    assert answer.status_code == 400
    assert "at most 2 GPUs" in answer.json()["gpu_count"][0]


# --- pages ---------------------------------------------------------------------------------------------------


def test_the_ladder_page_and_its_nav_link(labs: Any, client: Any) -> None:
    client.force_login(labs.users["provider"])
    page = client.get("/ladder/").content.decode()
    assert 'href="/ladder/"' in page and "The ladder" in page
    assert "never touched by the idle watchdog" in page and "8 h" in page and "30 min" in page


def test_the_job_form_shows_each_class_limits_and_refuses_too_many_gpus(labs: Any, client: Any) -> None:
    client.force_login(labs.users["researcher"])
    page = client.get("/jobs/new/").content.decode()
    assert 'data-testid="class-limits-interactive"' in page
    assert "Interactive: loans up to 8 h, released after 30 min idle, at most 2 GPUs" in page


def test_the_job_page_shows_the_loan_and_resume_for_its_owner(labs: Any, client: Any) -> None:
    job = _suspended_job(labs)
    client.force_login(labs.users["researcher"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="job-loan"' in page and 'data-testid="job-resume"' in page
    answer = client.post(f"/jobs/{job.pk}/resume/")
    assert answer.status_code == 302
    job.refresh_from_db()
    assert job.state == "queued"


def test_the_admin_edits_class_policies(labs: Any, client: Any) -> None:
    client.force_login(labs.users["admin"])
    assert client.get("/admin/control/classpolicy/").status_code == 200
    assert client.get("/admin/control/eviction/").status_code == 200
    assert client.get("/admin/control/jobactivity/").status_code == 200


# --- the heartbeat's new field and the agent's sources ------------------------------------------------------


@pytest.mark.parametrize("bad", [101.0, -1.0, float("nan"), float("inf"), "50", True])
def test_a_job_utilisation_outside_0_to_100_or_not_a_number_is_refused(bad: Any) -> None:
    from portal.control.link.protocol import ProtocolError, validate

    msg = {"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {}, "jobs": [{"job_id": 1, "step": 2,
                                                                                   "gpu_util": bad}]}
    with pytest.raises(ProtocolError, match="gpu_util"):
        validate(msg)


def test_a_job_utilisation_in_range_is_accepted() -> None:
    from portal.control.link.protocol import validate

    validate({"type": "heartbeat", "seq": 1, "gpu_util": [], "egress": {},
              "jobs": [{"job_id": 1, "step": 2, "gpu_util": 55.5}, {"job_id": 2, "step": 0, "gpu_util": 0}]})


def test_the_simulated_source_reports_what_each_job_says_its_load_is() -> None:
    from nodeagent.config import SimulatedGpu
    from nodeagent.inventory import (
        SimulatedUtilisation,
        job_utilisation,
        simulated_inventory,
        utilisation_source,
    )

    gpus = simulated_inventory((SimulatedGpu("RTX 3090", 24.0, 8.6),) * 3, "n1")
    source = utilisation_source(gpus)
    assert isinstance(source, SimulatedUtilisation)
    per_gpu = source.per_gpu(gpus, {0: 0.0, 1: 80.0})
    assert per_gpu == [0.0, 80.0, 0.0]  # GPU 2 holds no job
    assert job_utilisation(gpus, per_gpu, {"7": [0, 1], "8": []}) == {"7": 40.0}


def test_a_job_that_says_nothing_counts_as_fully_using_its_simulated_gpus(tmp_path: Any) -> None:
    import json

    from nodeagent.runner import RunningJob

    run = RunningJob(job_id="7", gpus=[0], proc=None, work_dir=tmp_path, ckpt_dir=tmp_path)  # type: ignore[arg-type]
    assert run.simulated_load() == 100.0
    (tmp_path / "gpu_load.json").write_text(json.dumps({"pct": 3.5}))
    assert run.simulated_load() == 3.5
    (tmp_path / "gpu_load.json").write_text("not json")
    assert run.simulated_load() == 100.0
