"""A job the kernel killed for its memory limit fails with that reason, and its page says so (design §19).

The agent's ``job_exited`` (as ``test_confined_jobs`` shows it sends for a job over its limit) goes through the
portal's real handler; the job page is rendered for its owner."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import Client
from django.urls import reverse

from tests.control.control_helpers import make_node, make_running_job

pytestmark = pytest.mark.django_db

REASON = "memory limit exceeded (67108864 bytes)"


def test_a_memory_limit_failure_is_the_jobs_failure_reason_on_its_page() -> None:
    from portal.control.link.handlers import job_exited
    from portal.core.models import Job

    node, _ = make_node("n1")
    job = make_running_job(node)
    with transaction.atomic():
        job_exited(node.pk, {"type": "job_exited", "job_id": job.pk, "returncode": -9, "step": 12, "result": {},
                             "reason": REASON})
    job = Job.objects.get(pk=job.pk)
    assert job.state == "failed"
    assert job.failure_reason.startswith(f"exit code -9: {REASON}")

    job.group.members.add(job.owner)  # a researcher: a member of the job's group
    client = Client()
    client.force_login(job.owner)
    page = client.get(reverse("web:job-detail", args=[job.pk]))
    assert page.status_code == 200
    assert REASON in page.content.decode()
