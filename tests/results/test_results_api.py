"""Job results through the portal (design §14): the agent's upload endpoint (checksummed, chunked, resumable,
idempotent, capped per research group, traversal-proof) and the researchers' read endpoints (who may read)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from portal.core.lifecycle.jobs import JobState
from portal.core.models import GroupResultsCap, Job, JobResultFile, JobResults
from portal.core.services import results as svc
from tests.portal import factories as f
from tests.results.conftest import Campus
from tests.results.helpers import complete, put_chunk, sha, streamed_body, upload

pytestmark = pytest.mark.django_db


def _api(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _download(client: APIClient, url: str) -> tuple[int, bytes, Any]:
    response = client.get(url)
    body = streamed_body(response) if getattr(response, "streaming", False) else response.content
    return response.status_code, body, response


# --- submitting: output_dir --------------------------------------------------------------------------------------
SUBMIT = {"name": "with-results", "command": "python train.py", "gpu_count": 1, "expected_runtime_s": 600,
          "ckpt_bytes_estimate": 1000}


@pytest.mark.parametrize("bad", ["/etc", "../up", "out/../../x", "a/..", "~/x", "C:/x", "out\\x"])
def test_a_submit_with_an_output_dir_outside_the_work_directory_is_refused_naming_the_field(
        campus: Campus, bad: str) -> None:
    answer = _api(campus.users["researcher"]).post("/api/jobs/", {**SUBMIT, "output_dir": bad}, format="json")
    assert answer.status_code == 400, answer.content
    assert "output_dir" in answer.json()
    assert not Job.objects.filter(name="with-results").exists()


def test_a_submitted_output_dir_is_kept_normalised_and_shown_by_the_api(campus: Campus) -> None:
    answer = _api(campus.users["researcher"]).post(
        "/api/jobs/", {**SUBMIT, "output_dir": "./out//metrics/", "upload_with_checkpoints": True}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["output_dir"] == "out/metrics"
    assert answer.json()["upload_with_checkpoints"] is True
    job = Job.objects.get(pk=answer.json()["id"])
    assert (job.output_dir, job.upload_with_checkpoints) == ("out/metrics", True)


def test_the_web_form_refuses_a_bad_output_dir_on_its_field(campus: Campus) -> None:
    client = Client()
    client.force_login(campus.users["researcher"])
    form = {"group": campus.group.pk, "name": "form-job", "gpu_count": 1, "vram_gb_per_gpu": 0,
            "min_capability": "0", "framework": "pytorch", "command": "python train.py", "expected_runtime_h": 1,
            "ckpt_gb": 1, "restart_s": 30, "priority_class": "standard", "output_dir": "../../etc"}
    page = client.post("/jobs/new/", form)
    assert page.status_code in (200, 400)
    assert not Job.objects.filter(name="form-job").exists()
    assert "must stay inside the job" in page.content.decode()


def test_the_start_command_carries_the_output_dir_to_the_agent(campus: Campus) -> None:
    from portal.control.models import AgentCommand
    from portal.control.reclaim.workflow import start_on

    job = f.make_job(campus.group, campus.users["researcher"], output_dir="out", upload_with_checkpoints=True)
    start_on(job, campus.node.pk, [1], None, "test")
    payload = AgentCommand.objects.filter(kind="start_job", node=campus.node).latest("id").payload
    assert (payload["output_dir"], payload["upload_with_checkpoints"]) == ("out", True)


# --- uploading ---------------------------------------------------------------------------------------------------
def test_an_uploaded_file_is_listed_and_downloaded_byte_identical_with_its_sha256(campus: Campus, settings: Any
                                                                                   ) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096  # several chunks
    data = os.urandom(10_000) + b"\x00end"
    answer = upload(Client(), campus.token, campus.job.pk, "metrics/final.bin", data, chunk_bytes=4096)
    assert answer.status_code == 201, answer.content
    assert complete(Client(), campus.token, campus.job.pk, ["metrics/final.bin"]).json()["state"] == "complete"
    listing = _api(campus.users["researcher"]).get(f"/api/jobs/{campus.job.pk}/results/").json()
    assert listing == {"files": [{"path": "metrics/final.bin", "size_bytes": len(data), "sha256": sha(data),
                                  "download_url": f"/api/jobs/{campus.job.pk}/results/files/metrics/final.bin"}],
                       "total_bytes": len(data), "state": "complete"}
    status, body, response = _download(_api(campus.users["researcher"]), listing["files"][0]["download_url"])
    assert status == 200
    assert body == data
    assert response["X-Checksum-SHA256"] == sha(data)
    assert response["Content-Type"] == "application/octet-stream"


def test_the_stored_file_is_written_atomically_under_its_content_address(campus: Campus, results_dirs: Path
                                                                          ) -> None:
    data = b"weights" * 100
    upload(Client(), campus.token, campus.job.pk, "w.bin", data)
    stored = results_dirs / "results" / "jobs" / str(campus.job.pk) / sha(data)
    assert stored.read_bytes() == data
    assert not list(stored.parent.glob(".upload-*"))  # no temp file left behind
    assert not list((results_dirs / "results-staging").glob("*.part"))


def test_sending_the_same_file_again_is_harmless(campus: Campus) -> None:
    data = b"same bytes"
    assert upload(Client(), campus.token, campus.job.pk, "a.txt", data).status_code == 201
    again = upload(Client(), campus.token, campus.job.pk, "a.txt", data)
    assert again.status_code == 200
    assert again.json()["already"] is True
    assert JobResultFile.objects.filter(job=campus.job).count() == 1


def test_a_changed_file_replaces_the_kept_one(campus: Campus, results_dirs: Path,
                                             django_capture_on_commit_callbacks: Any) -> None:
    upload(Client(), campus.token, campus.job.pk, "a.txt", b"first")
    with django_capture_on_commit_callbacks(execute=True):  # the old object is deleted after the commit
        upload(Client(), campus.token, campus.job.pk, "a.txt", b"second version")
    row = JobResultFile.objects.get(job=campus.job)
    assert (row.sha256, row.size_bytes) == (sha(b"second version"), 14)
    assert not (results_dirs / "results" / "jobs" / str(campus.job.pk) / sha(b"first")).exists()


def test_an_interrupted_upload_resumes_where_the_portal_has_it(campus: Campus, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    data = os.urandom(2500)
    first = put_chunk(Client(), campus.token, campus.job.pk, "big.bin", data[:1000], whole=data)
    assert first.json() == {"complete": False, "offset": 1000}
    # The agent restarts and begins again at 0: the portal names the offset it holds.
    restarted = put_chunk(Client(), campus.token, campus.job.pk, "big.bin", data[:1000], whole=data)
    assert restarted.status_code == 409
    assert restarted.json()["offset"] == 1000
    put_chunk(Client(), campus.token, campus.job.pk, "big.bin", data[1000:2000], offset=1000, whole=data)
    last = put_chunk(Client(), campus.token, campus.job.pk, "big.bin", data[2000:], offset=2000, whole=data)
    assert last.status_code == 201
    _, body, _ = _download(_api(campus.users["researcher"]), f"/api/jobs/{campus.job.pk}/results/files/big.bin")
    assert body == data


def test_a_corrupted_upload_is_refused_and_the_retry_is_kept(campus: Campus) -> None:
    data = b"the real bytes of the file"
    corrupted = put_chunk(Client(), campus.token, campus.job.pk, "r.txt", b"X" + data[1:], whole=data)
    assert corrupted.status_code == 422
    assert corrupted.json()["code"] == "checksum_mismatch"
    assert not JobResultFile.objects.filter(job=campus.job).exists()
    retried = upload(Client(), campus.token, campus.job.pk, "r.txt", data)
    assert retried.status_code == 201
    assert JobResultFile.objects.get(job=campus.job).sha256 == sha(data)


@pytest.mark.parametrize("name", ["../escape.txt", "out/../../escape.txt", "/etc/passwd", "%2e%2e/escape.txt",
                                  "a\\..\\b", "..", "a/%00b"])
def test_a_file_name_that_climbs_out_is_refused_naming_the_path(campus: Campus, name: str, results_dirs: Path
                                                                 ) -> None:
    data = b"payload"
    url = f"/api/agent/jobs/{campus.job.pk}/results/files/{name}"
    answer = Client().put(url, data=data, content_type="application/octet-stream",
                          HTTP_AUTHORIZATION=f"Bearer {campus.token}", HTTP_X_CHECKSUM_SHA256=sha(data),
                          HTTP_X_TOTAL_SIZE=str(len(data)), HTTP_X_OFFSET="0")
    assert answer.status_code in (400, 404), answer.content  # 404: a name the router cannot route at all
    if answer.status_code == 400:
        assert "path" in answer.json()
    assert not JobResultFile.objects.exists()
    assert not (results_dirs.parent / "escape.txt").exists()


def test_an_upload_past_the_groups_cap_is_refused_naming_the_cap_and_the_job_page_says_so(campus: Campus) -> None:
    GroupResultsCap.objects.create(group=campus.group, cap_bytes=1000)
    assert upload(Client(), campus.token, campus.job.pk, "small.txt", b"x" * 600).status_code == 201
    refused = upload(Client(), campus.token, campus.job.pk, "big.txt", b"y" * 600)
    assert refused.status_code == 413
    assert refused.json()["code"] == "cap_exceeded"
    assert "1000 bytes" in refused.json()["detail"]
    assert refused.json()["cap_bytes"] == 1000
    assert list(JobResultFile.objects.filter(job=campus.job).values_list("path", flat=True)) == ["small.txt"]
    client = Client()
    client.force_login(campus.users["researcher"])
    page = client.get(f"/jobs/{campus.job.pk}/").content.decode()
    assert "the cap is 1000 bytes" in page
    assert "small.txt" in page


def test_the_settings_default_cap_applies_without_a_group_row(campus: Campus, settings: Any) -> None:
    settings.RECLAIMNET_RESULTS_GROUP_CAP_BYTES = 100
    refused = upload(Client(), campus.token, campus.job.pk, "big.txt", b"y" * 101)
    assert refused.status_code == 413
    assert "100 bytes" in refused.json()["detail"]


def test_another_groups_jobs_count_only_against_their_own_cap(campus: Campus) -> None:
    GroupResultsCap.objects.create(group=campus.other_group, cap_bytes=10)
    assert upload(Client(), campus.token, campus.job.pk, "a.txt", b"z" * 500).status_code == 201


def test_an_agent_may_upload_only_for_a_job_that_ran_last_on_its_node(campus: Campus) -> None:
    wrong_node = upload(Client(), campus.other_token, campus.job.pk, "a.txt", b"data")
    assert wrong_node.status_code == 404
    bad_token = upload(Client(), "rna_not-a-token", campus.job.pk, "a.txt", b"data")
    assert bad_token.status_code == 401
    no_token = Client().get(f"/api/agent/jobs/{campus.job.pk}/results/")
    assert no_token.status_code == 401
    assert not JobResultFile.objects.exists()


def test_completing_drops_files_no_longer_in_the_directory_and_marks_the_results_complete(campus: Campus) -> None:
    upload(Client(), campus.token, campus.job.pk, "old.txt", b"old")
    upload(Client(), campus.token, campus.job.pk, "new.txt", b"new")
    answer = complete(Client(), campus.token, campus.job.pk, ["new.txt"])
    assert answer.json() == {"state": "complete", "missing": []}
    assert list(JobResultFile.objects.values_list("path", flat=True)) == ["new.txt"]


def test_completing_with_a_listed_file_not_kept_leaves_the_results_partial(campus: Campus) -> None:
    upload(Client(), campus.token, campus.job.pk, "new.txt", b"new")
    partial = complete(Client(), campus.token, campus.job.pk, ["new.txt", "never-sent.txt"])
    assert partial.json() == {"state": "partial", "missing": ["never-sent.txt"]}


def test_the_agent_learns_what_is_kept_already(campus: Campus) -> None:
    upload(Client(), campus.token, campus.job.pk, "a.txt", b"aaa")
    kept = Client().get(f"/api/agent/jobs/{campus.job.pk}/results/", HTTP_AUTHORIZATION=f"Bearer {campus.token}")
    assert kept.status_code == 200
    assert kept.json()["files"] == {"a.txt": sha(b"aaa")}
    assert kept.json()["checkpoint"] is None
    assert kept.json()["chunk_bytes"] > 0


# --- reading -----------------------------------------------------------------------------------------------------
def test_the_final_checkpoint_is_downloaded_and_a_job_without_one_answers_404_with_a_detail(campus: Campus) -> None:
    reader = _api(campus.users["researcher"])
    missing = reader.get(f"/api/jobs/{campus.job.pk}/checkpoint/")
    assert missing.status_code == 404
    assert "checkpoint" in missing.json()["detail"]
    ckpt = os.urandom(3000)
    answer = upload(Client(), campus.token, campus.job.pk, "ckpt-00000003.ckpt", ckpt, kind="checkpoint",
                    sequence=3)
    assert answer.status_code == 201, answer.content
    status, body, response = _download(reader, f"/api/jobs/{campus.job.pk}/checkpoint/")
    assert (status, body, response["X-Checksum-SHA256"]) == (200, ckpt, sha(ckpt))
    newer = os.urandom(100)
    upload(Client(), campus.token, campus.job.pk, "ckpt-00000004.ckpt", newer, kind="checkpoint", sequence=4)
    assert _download(reader, f"/api/jobs/{campus.job.pk}/checkpoint/")[1] == newer
    assert JobResultFile.objects.filter(job=campus.job, kind="checkpoint").count() == 1  # the newest replaces
    assert reader.get(f"/api/jobs/{campus.job.pk}/results/").json()["files"] == []  # not among the files


@pytest.mark.parametrize("role,status", [("researcher", 200), ("admin", 200), ("other_researcher", 404),
                                         ("outsider", 404), ("provider", 404)])
def test_only_the_owner_group_members_and_admins_read_results(campus: Campus, role: str, status: int) -> None:
    upload(Client(), campus.token, campus.job.pk, "a.txt", b"secret")
    upload(Client(), campus.token, campus.job.pk, "c.ckpt", b"ckpt", kind="checkpoint", sequence=1)
    reader = _api(campus.users[role])
    for url in (f"/api/jobs/{campus.job.pk}/results/", f"/api/jobs/{campus.job.pk}/results/files/a.txt",
                f"/api/jobs/{campus.job.pk}/checkpoint/"):
        answer = reader.get(url)
        assert answer.status_code == status, (url, answer.status_code)
        if status == 404:
            assert b"secret" not in (streamed_body(answer) if answer.streaming else answer.content)


def test_a_group_member_who_is_not_the_owner_reads_results(campus: Campus) -> None:
    colleague = f.make_user("colleague")
    campus.group.members.add(colleague)
    upload(Client(), campus.token, campus.job.pk, "a.txt", b"shared")
    assert _download(_api(colleague), f"/api/jobs/{campus.job.pk}/results/files/a.txt")[1] == b"shared"


def test_anonymous_readers_are_refused(campus: Campus) -> None:
    assert APIClient().get(f"/api/jobs/{campus.job.pk}/results/").status_code in (401, 403)


def test_a_file_not_kept_answers_404(campus: Campus) -> None:
    reader = _api(campus.users["researcher"])
    assert reader.get(f"/api/jobs/{campus.job.pk}/results/files/nope.txt").status_code == 404
    assert reader.get(f"/api/jobs/{campus.job.pk}/results/").json() == {"files": [], "total_bytes": 0,
                                                                       "state": "none"}


def test_the_job_page_lists_the_files_with_sizes_and_links_from_one_query(
        campus: Campus, django_assert_num_queries: Any) -> None:
    upload(Client(), campus.token, campus.job.pk, "metrics/final.json", b"{}" * 700)
    upload(Client(), campus.token, campus.job.pk, "c.ckpt", b"c" * 2000, kind="checkpoint", sequence=2)
    with django_assert_num_queries(1):
        section = svc.page_results(campus.job.pk)
    assert [f_["path"] for f_ in section["files"]] == ["metrics/final.json"]
    assert section["checkpoint"]["size_bytes"] == 2000
    client = Client()
    client.force_login(campus.users["researcher"])
    page = client.get(f"/jobs/{campus.job.pk}/").content.decode()
    assert f'href="/api/jobs/{campus.job.pk}/results/files/metrics/final.json"' in page
    assert f'href="/api/jobs/{campus.job.pk}/checkpoint/"' in page
    assert "1.4 KB" in page


def test_the_schema_documents_the_read_endpoints_and_their_errors() -> None:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    paths = schema["paths"]
    listing = paths["/api/jobs/{id}/results/"]["get"]
    assert {"200", "401", "404"} <= set(listing["responses"])
    files = paths["/api/jobs/{id}/results/files/{file_path}"]["get"]
    assert "application/octet-stream" in files["responses"]["200"]["content"]
    assert "X-Checksum-SHA256" in files["responses"]["200"].get("headers", {})
    assert {"401", "404"} <= set(paths["/api/jobs/{id}/checkpoint/"]["get"]["responses"])
    assert not any(p.startswith("/api/agent/") for p in paths)


# --- housekeeping ------------------------------------------------------------------------------------------------
def test_results_of_jobs_ended_longer_ago_than_the_keep_days_are_pruned(campus: Campus, settings: Any,
                                                                         results_dirs: Path) -> None:
    from portal.control.loop.housekeeping import housekeeping

    settings.RECLAIMNET_RESULTS_KEEP_DAYS = 7
    upload(Client(), campus.token, campus.job.pk, "old.txt", b"old results")
    recent = f.make_job(campus.group, campus.users["researcher"], state=JobState.COMPLETED)
    JobResultFile.objects.create(job=recent, path="keep.txt", size_bytes=1, sha256="0" * 64, storage_name="x")
    now = timezone.now()
    Job.objects.filter(pk=campus.job.pk).update(state=JobState.COMPLETED, finished_at=now - dt.timedelta(days=8))
    Job.objects.filter(pk=recent.pk).update(finished_at=now - dt.timedelta(days=1))
    assert housekeeping(now)["results_files_pruned"] == 1
    assert list(JobResultFile.objects.values_list("path", flat=True)) == ["keep.txt"]
    assert not JobResults.objects.filter(job=campus.job).exists()
    assert not (results_dirs / "results" / "jobs" / str(campus.job.pk) / sha(b"old results")).exists()
