"""Submitting arrays and dependencies (design §16.6) through the API and the web form: the answers, the errors
that name their field, idempotent replays, the array's API and page, and who may see them."""

from __future__ import annotations

from typing import Any

from django.test import Client

from portal.core.models import Job
from portal.queue.models import ArrayTask, JobArray, JobDependency
from tests.queue.conftest import QueueCampus

BODY = {"name": "sweep", "command": "python train.py", "gpu_count": 1, "expected_runtime_s": 600,
        "ckpt_bytes_estimate": 1000000}


def _post(qc: QueueCampus, user: Any, **extra: Any) -> Any:
    return qc.client(user).post("/api/jobs/", {**BODY, **extra}, format="json")


def test_an_array_submit_answers_the_array_and_its_jobs_in_index_order(qc: QueueCampus) -> None:
    qc.node(2)
    answer = _post(qc, qc.alice, array="0-4%2")
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    arr = JobArray.objects.get()
    assert body["array"] == {"id": arr.pk, "name": "sweep", "spec": "0-4%2", "size": 5, "throttle": 2,
                             "group": qc.a.pk}
    assert [(j["array_index"], j["name"], j["state"]) for j in body["jobs"]] == [
        (i, f"sweep[{i}]", "queued") for i in range(5)]
    detail = qc.client(qc.alice).get(f"/api/jobs/{body['jobs'][3]['id']}/").json()
    assert detail["array"] == {"id": arr.pk, "index": 3, "spec": "0-4%2", "name": "sweep"}
    listed = qc.client(qc.alice).get(f"/api/jobs/?array={arr.pk}").json()
    assert sorted(j["id"] for j in listed["results"]) == sorted(j["id"] for j in body["jobs"])
    page = qc.client(qc.alice).get(f"/api/arrays/{arr.pk}/").json()
    assert page["counts"] == {"queued": 5} and page["throttle"] == 2 and len(page["jobs"]) == 5
    assert qc.client(qc.bob).get(f"/api/arrays/{arr.pk}/").status_code == 404  # another group's array


def test_an_array_submit_replayed_with_its_idempotency_key_creates_nothing_more(qc: QueueCampus) -> None:
    qc.node(1)
    client = qc.client(qc.alice)
    first = client.post("/api/jobs/", {**BODY, "array": "0-2"}, format="json", HTTP_IDEMPOTENCY_KEY="sweep-1")
    again = client.post("/api/jobs/", {**BODY, "array": "0-2"}, format="json", HTTP_IDEMPOTENCY_KEY="sweep-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert (JobArray.objects.count(), Job.objects.count()) == (1, 3)


def test_bad_array_and_dependency_fields_are_refused_naming_the_field(qc: QueueCampus) -> None:
    qc.node(1)
    foreign = qc.job(qc.b)  # Group B's job: Alice cannot see it
    cases = [
        ({"array": "5-2"}, "array", "Range 5-2 ends before it starts."),
        ({"array": "0-9%0"}, "array", "The throttle after % must be at least 1."),
        ({"array": "0-x"}, "array", "is not an index or a range"),
        ({"after_ok": [999999]}, "after_ok", "No job 999999 that you can see."),
        ({"after_ok": [foreign.pk]}, "after_ok", f"No job {foreign.pk} that you can see."),
        ({"after_any": ["x"]}, "after_any", ""),
    ]
    for extra, field, words in cases:
        answer = _post(qc, qc.alice, **extra)
        assert answer.status_code == 400, (extra, answer.json())
        assert field in answer.json(), (extra, answer.json())
        assert words in " ".join(str(m) for m in answer.json()[field]), (extra, answer.json())
    assert not Job.objects.filter(group=qc.a).exists()  # nothing half-submitted


def test_a_dependency_names_an_existing_job_so_no_cycle_can_form(qc: QueueCampus) -> None:
    qc.node(1)
    parent = _post(qc, qc.alice).json()
    child = _post(qc, qc.alice, after_ok=[parent["id"]], after_any=[]).json()
    assert JobDependency.objects.get(job_id=child["id"]).parent_id == parent["id"]
    # A job can only wait for jobs that exist when it is submitted: an older one, never itself or a later one.
    assert _post(qc, qc.alice, after_ok=[child["id"] + 1]).status_code == 400
    detail = qc.client(qc.alice).get(f"/api/jobs/{child['id']}/").json()
    assert detail["after_ok"] == [parent["id"]] and detail["after_any"] == []


def test_the_web_form_submits_an_array_and_lands_on_its_page(qc: QueueCampus) -> None:
    qc.node(2)
    client = Client()
    client.force_login(qc.alice)
    form = {"group": qc.a.pk, "name": "seeds", "gpu_count": 1, "vram_gb_per_gpu": 0, "min_capability": 0,
            "framework": "pytorch", "command": "python train.py", "expected_runtime_h": 1, "ckpt_gb": 1,
            "restart_s": 30, "priority_class": "standard", "array": "0-5%3"}
    answer = client.post("/jobs/new/", form)
    arr = JobArray.objects.get(name="seeds")
    assert answer.status_code == 302 and answer["Location"] == f"/jobs/arrays/{arr.pk}/"
    page = client.get(answer["Location"]).content.decode()
    assert "seeds[5]" in page and "at most 3 running at once" in page
    assert ArrayTask.objects.filter(array=arr).count() == 6
    listed = client.get(f"/jobs/?array={arr.pk}").content.decode()
    assert listed.count('data-testid="array-filter"') == 6

    refused = client.post("/jobs/new/", {**form, "name": "later", "array": "", "after_ok": "999999"})
    assert refused.status_code == 400 and "No job 999999 that you can see." in refused.content.decode()
    assert not Job.objects.filter(name="later").exists()
