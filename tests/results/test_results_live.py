"""Job results end to end over real HTTP (design §14): a live portal (daphne, the embedded control loop, this
test database), the node agent's uploader, and a real agent process running a job that writes files.

Only processes started here are signalled (harness.Proc, by PID); everything listens on loopback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from nodeagent import jobkit
from nodeagent.results import ResultsUploader
from nodeagent.transfer import Faults
from tests.e2e import harness
from tests.results.write_outputs import expected_outputs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


def _skip_without_postgres() -> None:
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        pytest.skip("the live portal shares the test database: needs DATABASE_URL=postgres://…")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[harness.Stack]:
    """A portal on loopback with the embedded control loop (no Redis: placement runs inside daphne), keeping
    results under ``tmp_path/media``."""
    _skip_without_postgres()
    st = harness.Stack(tmp_path / "stack", harness.stack_database_url(), "", extra_env={
        "REDIS_URL": "", "RECLAIMNET_MEDIA_ROOT": str(tmp_path / "media"),
        "RECLAIMNET_RESULTS_GROUP_CAP_BYTES": str(50 * 2**20)})
    try:
        yield st
    finally:
        st.stop_all()


def _get(st: harness.Stack, path: str, token: str) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{st.port}{path}", headers={"Authorization": f"Token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read(), {k.lower(): v for k, v in answer.headers.items()}
    except urllib.error.HTTPError as error:
        return error.code, error.read(), {k.lower(): v for k, v in error.headers.items()}


def _researchers() -> tuple[Any, Any, str, str]:
    """The e2e group's researcher (and an API token) and a researcher of another group (and theirs)."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from portal.core.models import ResearchGroup

    group, _ = ResearchGroup.objects.get_or_create(slug="e2e-group", defaults={"name": "E2E Group"})
    user, _ = get_user_model().objects.get_or_create(username="e2e")
    group.members.add(user)
    stranger = get_user_model().objects.create_user("stranger")
    other, _ = ResearchGroup.objects.get_or_create(slug="other-group", defaults={"name": "Other Group"})
    other.members.add(stranger)
    return group, user, Token.objects.create(user=user).key, Token.objects.create(user=stranger).key


def test_files_a_real_agent_uploads_when_its_job_ends_are_served_byte_identical(stack: harness.Stack,
                                                                                 tmp_path: Path) -> None:
    from portal.core.models import Job, JobResults
    from portal.core.services.jobs import submit_job

    nodes = harness.make_campus([("results-live-a1", "A")])
    group, user, token, stranger_token = _researchers()
    stack.start_portal()
    stack.start_agent("results-live-a1", nodes["results-live-a1"][1], gpus=1)
    big = 3 * 2**20 + 12345  # several chunks
    job = submit_job(user, group=group, name="writes-results", gpu_count=1, expected_runtime_s=10,
                     ckpt_bytes_estimate=10_000, output_dir="out",
                     command=f"python tests/results/write_outputs.py --out out --seed 11 --big-bytes {big}")
    harness.wait_for(lambda: Job.objects.get(pk=job.pk).state == "completed", 90, what="the job to complete")
    harness.wait_for(lambda: JobResults.objects.filter(job=job, state="complete").exists(), 60,
                     what="its results to be complete")

    status, body, _ = _get(stack, f"/api/jobs/{job.pk}/results/", token)
    assert status == 200, body
    listing = json.loads(body)
    expected = expected_outputs(11, big)
    assert sorted(f["path"] for f in listing["files"]) == sorted(expected)  # outside.txt was not uploaded
    assert listing["total_bytes"] == sum(len(v) for v in expected.values())
    for item in listing["files"]:
        status, data, headers = _get(stack, item["download_url"], token)
        assert status == 200, item
        assert data == expected[item["path"]], item["path"]
        assert headers["x-checksum-sha256"] == item["sha256"]

    ckpt_dir = stack.agent_dir("results-live-a1") / "ckpt" / str(job.pk)
    newest = jobkit.list_manifests(ckpt_dir)[-1]
    status, data, headers = _get(stack, f"/api/jobs/{job.pk}/checkpoint/", token)
    assert status == 200
    assert data == (ckpt_dir / newest.file).read_bytes()
    assert headers["x-checksum-sha256"] == newest.sha256

    for path in (f"/api/jobs/{job.pk}/results/", f"/api/jobs/{job.pk}/results/files/metrics.json",
                 f"/api/jobs/{job.pk}/checkpoint/"):
        assert _get(stack, path, stranger_token)[0] == 404, path

    # The command line's ``reclaimnet fetch`` against the same live portal: every file, checked.
    dest = tmp_path / "fetched"
    env = {**os.environ, "RECLAIMNET_URL": f"http://127.0.0.1:{stack.port}", "RECLAIMNET_TOKEN": token,
           "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(harness.REPO)}
    run = subprocess.run([harness.PY, "-m", "reclaimnet.cli", "fetch", str(job.pk), "-o", str(dest)], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    for rel, data in expected.items():
        assert (dest / rel).read_bytes() == data, rel


def test_the_uploader_retries_a_corrupted_chunk_and_resumes_after_agent_and_portal_restarts(
        stack: harness.Stack, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from portal.core.lifecycle import jobs as job_lifecycle
    from portal.core.models import GroupResultsCap, Job, JobResults, Placement

    nodes = harness.make_campus([("results-live-b1", "A")])
    node_id, node_token = nodes["results-live-b1"]
    group, user, token, _ = _researchers()
    job = Job.objects.create(name="uploader", owner=user, group=group, command="true", gpu_count=1,
                             expected_runtime_s=60, ckpt_bytes_estimate=1000, output_dir="out")
    Placement.objects.create(job=job, node_id=node_id, gpu_indices=[0])
    job_lifecycle.start(job)
    work = tmp_path / "work"
    files = {"a.txt": b"alpha\n", "deep/b.bin": os.urandom(2 * 2**20 + 7)}
    for rel, data in files.items():
        (work / "out" / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / "out" / rel).write_bytes(data)
    agent_dir = tmp_path / "agent"
    stack.port = harness.free_port()
    portal_url = f"ws://127.0.0.1:{stack.port}/ws/agent/"

    # The portal is down: the upload fails now and is kept, with a retry scheduled.
    first = ResultsUploader(agent_dir, portal_url, node_token, rate_bytes_per_s=None)
    first.enqueue(str(job.pk), work, "out", final=True)
    assert asyncio.run(first.run_task(first.tasks[str(job.pk)])) is False
    assert first.tasks[str(job.pk)].not_before > 0
    assert (agent_dir / "results" / "queue.json").exists()

    # The agent restarts (a new uploader reads the queue), the portal comes up, the first chunk is corrupted.
    stack.start_portal()
    (agent_dir / "faults.json").write_text(json.dumps({"corrupt": 1, "classes": ["results"]}))
    second = ResultsUploader(agent_dir, portal_url, node_token, rate_bytes_per_s=50e6,
                             faults=Faults(agent_dir / "faults.json"))
    assert list(second.tasks) == [str(job.pk)]
    with caplog.at_level(logging.WARNING, logger="nodeagent.results"):
        assert asyncio.run(second.run_task(second.tasks[str(job.pk)])) is True
    assert any("sha256 mismatch" in r.getMessage() for r in caplog.records)  # refused, then sent again
    assert second.done == [str(job.pk)] and not second.tasks
    assert JobResults.objects.get(job=job).state == "complete"
    for rel, data in files.items():
        status, body, _ = _get(stack, f"/api/jobs/{job.pk}/results/files/{quote(rel)}", token)
        assert (status, body) == (200, data), rel

    # Past the group's cap: refused for good, named on the job's results.
    GroupResultsCap.objects.create(group=group, cap_bytes=len(files["a.txt"]) + len(files["deep/b.bin"]) + 10)
    (work / "out" / "more.bin").write_bytes(b"m" * 100)
    second.enqueue(str(job.pk), work, "out", final=True)
    assert asyncio.run(second.run_task(second.tasks[str(job.pk)])) is True
    refused = JobResults.objects.get(job=job).refused_reason
    assert "cap is" in refused and "more.bin" in refused
    assert _get(stack, f"/api/jobs/{job.pk}/results/files/more.bin", token)[0] == 404
