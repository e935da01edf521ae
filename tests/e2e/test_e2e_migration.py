"""End to end on loopback (design §1-§4): real PostgreSQL, Redis, Celery worker, daphne and three agents.

The job is the deterministic numpy trainer, so any resume from a verified checkpoint ends with weights bitwise
equal to an uninterrupted run; what differs between scenarios is how much work is redone (the loss).
Scenarios run in order on one stack; each leaves every node lent and online for the next.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import harness
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

STEPS = 300
STEP_SLEEP_S = 0.03
PAD_BYTES = 1_000_000  # ~1 MB checkpoints: transfers are paced, not instant


@pytest.mark.django_db
def test_runs_on_the_test_database() -> None:
    """Also makes pytest-django create the test database: it only does so when a collected test is marked
    ``django_db``, and the scenario tests cannot be (other processes must see their committed rows)."""
    from django.conf import settings

    assert settings.DATABASES["default"]["NAME"].startswith("test_")


@pytest.fixture(scope="module")
def reference(stack: dict[str, Any]) -> str:
    return harness.reference_weights(STEPS, PAD_BYTES, stack["workdir"] / "reference")


def _start_job(name: str) -> tuple[Any, Any]:
    """Submit the trainer, wait until it runs and has a checkpoint pre-synced to another node."""
    from portal.core.models import Checkpoint, Job

    job_id = harness.submit_training_job(name, STEPS, STEP_SLEEP_S, PAD_BYTES)
    harness.wait_for(lambda: Job.objects.get(pk=job_id).state == "running", 20, what=f"{name} running")
    job = Job.objects.get(pk=job_id)
    node = job.placements.get(ended_at__isnull=True).node
    harness.wait_for(lambda: Checkpoint.objects.filter(job=job).exclude(replica_nodes=None).exists(), 20,
                     what=f"{name}: a pre-synced checkpoint")
    return job, node


def _wait_done(job: Any, timeout_s: float = 60) -> Any:
    from portal.core.models import Job

    harness.wait_for(lambda: Job.objects.get(pk=job.pk).state in ("completed", "failed", "cancelled"), timeout_s,
                     what=f"job {job.pk} to finish")
    return Job.objects.select_related("runtime").get(pk=job.pk)


def _lend_again(node: Any) -> None:
    from portal.core.models import Node
    from portal.core.services.nodes import lend_again

    node = Node.objects.get(pk=node.pk)
    if node.state == "reclaimed":
        lend_again(node, None)
    harness.wait_for(lambda: Node.objects.get(pk=node.pk).state == "online", 20, what=f"{node.name} online again")


def _reclaim(node: Any, notice_s: float) -> Any:
    from portal.core.services.reclaims import request_reclaim

    return request_reclaim(node, None, notice_s)


def test_scheduled_reclaim_is_lossless(stack: dict[str, Any], reference: str) -> None:
    """Enough notice: final checkpoint, transfer at the P3 rate, resume elsewhere; bitwise-equal weights."""
    from portal.control.models import Transfer
    from portal.core.models import Migration, ReclaimEvent

    job, node = _start_job("scheduled")
    reclaim = _reclaim(node, 20.0)
    job = _wait_done(job)
    assert job.state == "completed", job.failure_reason
    mig = Migration.objects.get(job=job)
    assert mig.mode == "planned" and mig.success and mig.destination_id != node.pk
    assert mig.work.phase == "done"
    transfer = Transfer.objects.get(migration=mig)
    assert transfer.purpose == "migration" and transfer.state == "received" and transfer.dscp == 34
    assert transfer.rate_bytes_per_s and transfer.rate_bytes_per_s > 0
    assert job.runtime.result_sha256 == reference
    harness.wait_for(lambda: ReclaimEvent.objects.get(pk=reclaim.pk).outcome == "completed", 10,
                     what="reclaim completed")
    _lend_again(node)


def test_short_notice_is_degraded_and_resumes_from_checkpoint(stack: dict[str, Any], reference: str) -> None:
    """Too little notice for C/b + T_r: degraded, resumed from the last pre-synced checkpoint."""
    from portal.core.models import Migration, ReclaimEvent

    job, node = _start_job("short-notice")
    reclaim = _reclaim(node, 0.5)
    job = _wait_done(job)
    assert job.state == "completed", job.failure_reason
    mig = Migration.objects.get(job=job)
    assert mig.mode == "degraded" and mig.degraded_reason in ("notice", "deadline", "capacity")
    assert mig.success and mig.checkpoint is not None and mig.checkpoint.step > 0
    assert job.runtime.result_sha256 == reference
    assert ReclaimEvent.objects.get(pk=reclaim.pk).outcome in ("degraded", "forced")
    _lend_again(node)


def test_emergency_resumes_from_presynced_replica(stack: dict[str, Any], reference: str) -> None:
    """τ = 0: resume from the freshest replica held off the node; loss at most one checkpoint interval plus the
    time a checkpoint takes to become durable (written, then copied off the node: the newer one may still have
    been on its way when the node went)."""
    from portal.core.models import Checkpoint, Job, Migration

    job, node = _start_job("emergency")
    time.sleep(1.0)
    _reclaim(node, 0.0)
    job = _wait_done(job)
    assert job.state == "completed", job.failure_reason
    mig = Migration.objects.get(job=job)
    interval_s = Job.objects.get(pk=job.pk).checkpoint_interval_s
    assert mig.mode == "degraded" and mig.success
    assert mig.checkpoint is not None and mig.checkpoint.node_id == node.pk  # written there, copied off before
    newer = Checkpoint.objects.filter(job=job, sequence__gt=mig.checkpoint.sequence).order_by("sequence").first()
    durable_lag_s = max((c.write_s or 0.0) + (c.transfer_s or 0.0) for c in (mig.checkpoint, newer) if c)
    assert mig.work_lost_s <= interval_s + durable_lag_s + 0.5, (mig.work_lost_s, interval_s, durable_lag_s)
    assert job.runtime.result_sha256 == reference
    _lend_again(node)


def test_sigkilled_agent_is_detected_and_job_recovered(stack: dict[str, Any], reference: str) -> None:
    """An agent killed with SIGKILL: heartbeat loss detected within the timeout (+ one control period)."""
    from portal.core.models import Migration, ReclaimEvent

    st: harness.Stack = stack["stack"]
    job, node = _start_job("sigkill")
    proc = st.procs[f"agent-{node.name}"]
    killed_at = time.time()
    os.kill(proc.popen.pid, signal.SIGKILL)  # a PID this test session started
    proc.popen.wait(5)
    event = harness.wait_for(
        lambda: ReclaimEvent.objects.filter(node=node, kind="heartbeat_lost").order_by("-requested_at").first(),
        st.heartbeat_timeout_s + st.control_period_s + 5, what="heartbeat loss detected")
    detected_s = event.requested_at.timestamp() - killed_at
    assert detected_s <= st.heartbeat_timeout_s + st.control_period_s + 0.5, detected_s
    job = _wait_done(job)
    assert job.state == "completed", job.failure_reason
    assert Migration.objects.get(job=job).success
    assert job.runtime.result_sha256 == reference
    st.start_agent(node.name, stack["nodes"][node.name][1])
    _lend_again(node)


def test_corrupt_or_truncated_transfer_is_retried_never_resumed_from(stack: dict[str, Any], reference: str) -> None:
    """The migration copy is corrupted once and cut once: the receiver's sha256 check discards the corrupt copy,
    the cut one resumes from its offset, and the job resumes only from the verified checkpoint."""
    from portal.control.models import RejectedMessage, Transfer
    from portal.core.models import Migration

    st: harness.Stack = stack["stack"]
    job, node = _start_job("corrupt")
    st.inject_faults(node.name, corrupt=1, truncate=1, classes=("migration",))
    _reclaim(node, 20.0)
    job = _wait_done(job)
    assert job.state == "completed", job.failure_reason
    mig = Migration.objects.get(job=job)
    transfer = Transfer.objects.get(migration=mig)
    assert transfer.state == "received" and transfer.attempts >= 3, (transfer.attempts, transfer.errors)
    assert any("sha256 mismatch" in e for e in transfer.errors), transfer.errors
    assert mig.mode == "planned" and mig.success
    assert job.runtime.result_sha256 == reference
    assert not RejectedMessage.objects.filter(node=node).exists()
    _lend_again(node)
