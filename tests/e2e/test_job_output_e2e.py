"""End to end on loopback (design §9.11): a job's output travels from its process through a real agent and daphne
to the database, and a client follows it over HTTP with ``since`` while the job runs, as ``logs -f`` will."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TICKS = 60
COMMAND = ("python -c \"import sys, time; [print(f'tick {i}', file=sys.stderr if i % 7 == 0 else sys.stdout, "
           f"flush=True) or time.sleep(0.1) for i in range({TICKS})]\"")


@pytest.mark.django_db
def test_runs_on_the_test_database() -> None:
    """Makes pytest-django create the test database (see tests/e2e/test_e2e_migration.py)."""
    from django.conf import settings

    assert settings.DATABASES["default"]["NAME"].startswith("test_")


def _submit() -> tuple[int, str]:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from portal.core.models import ResearchGroup
    from portal.core.services.jobs import submit_job

    group, _ = ResearchGroup.objects.get_or_create(slug="e2e-group", defaults={"name": "E2E Group"})
    user, _ = get_user_model().objects.get_or_create(username="e2e-output")
    group.members.add(user)
    job = submit_job(user, group=group, name="printing", gpu_count=1, expected_runtime_s=10.0,
                     ckpt_bytes_estimate=4096, command=COMMAND, loss_budget_s=5.0, restart_s=1.0)
    token, _ = Token.objects.get_or_create(user=user)
    return job.pk, token.key


def test_output_is_followed_over_http_while_the_job_runs_and_kept_after(stack: dict[str, Any]) -> None:
    job_id, token = _submit()
    base = f"http://127.0.0.1:{stack['stack'].port}/api/jobs/{job_id}/output/"

    def read(since: int) -> dict[str, Any]:
        request = urllib.request.Request(f"{base}?since={since}", headers={"Authorization": f"Token {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return dict(json.loads(response.read()))

    answers: list[dict[str, Any]] = []
    since = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # follow, as `logs -f` does
        answer = read(since)
        answers.append(answer)
        since = answer["next_offset"]
        if not answer["running"] and not answer["text"]:
            break
        time.sleep(0.3)
    followed = "".join(a["text"] for a in answers)
    assert not answers[-1]["running"], "the job did not end in time"
    assert followed.startswith("— run 1 on node e2e-")
    assert followed.splitlines()[1:] == [f"tick {i}" for i in range(TICKS)]  # stdout and stderr, in order, once
    assert any(a["running"] and "tick" in a["text"] for a in answers), "no output arrived while the job ran"
    assert all(a["truncated"] == 0 for a in answers)
    assert read(0)["text"] == followed  # kept after the job ended

    from portal.core.models import Job

    assert Job.objects.get(pk=job_id).state == "completed"
