"""Mail and webhooks end to end (design §12): real PostgreSQL, Redis, daphne, a Celery worker with beat (one solo
worker consuming every queue: the harshest case for "a slow receiver never delays a reclaim"), two agents, a
real SMTP server (aiosmtpd) and a real HTTP receiver on loopback.

A scheduled reclaim warns the job's owner by mail and by a signed webhook before its deadline; a receiver that
answers 500 is retried until it answers, and the reclaim finishes on time regardless."""

from __future__ import annotations

import email
import email.policy
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from tests.notify.servers import Receiver, SmtpSink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import harness

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

STEPS = 800  # ~24 s of training: still running when the reclaim comes, even on a loaded machine
STEP_SLEEP_S = 0.03
PAD_BYTES = 500_000
NOTICE_S = 20.0
OWNER = "e2e"  # harness.submit_training_job's user


@pytest.mark.django_db
def test_runs_on_the_test_database() -> None:
    """Makes pytest-django create the test database (the scenario below cannot be ``django_db``)."""
    from django.conf import settings

    assert settings.DATABASES["default"]["NAME"].startswith("test_")


@pytest.fixture(scope="module")
def notify_stack(django_db_setup: Any, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")) or not os.environ.get("REDIS_URL"):
        pytest.skip("needs DATABASE_URL=postgres://… and REDIS_URL")
    smtp = SmtpSink().start()
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-notify-e2e-"))
    redis_url = os.environ["REDIS_URL"]
    restore_broker = harness.use_broker(redis_url)
    with django_db_blocker.unblock():
        from django.contrib.auth import get_user_model

        st = harness.Stack(workdir, harness.stack_database_url(), redis_url, extra_env={
            "EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(smtp.port), "DEFAULT_FROM_EMAIL": "portal@campus.example",
            "RECLAIMNET_NOTIFY_RETRY_BASE_S": "0.5", "RECLAIMNET_NOTIFY_WEBHOOK_TIMEOUT_S": "2",
            "RECLAIMNET_NOTIFY_ALLOW_PRIVATE_WEBHOOKS": "1"})  # the receivers listen on 127.0.0.1
        st.flush_redis()
        _retire_leftovers()
        nodes = harness.make_campus([("notify-e2e-a1", "A"), ("notify-e2e-b1", "B")])
        owner, _ = get_user_model().objects.get_or_create(username=OWNER)
        owner.email = "owner@campus.example"
        owner.save(update_fields=["email"])
        try:
            st.start_portal()
            st.start_worker()
            for name, (_, token) in nodes.items():
                st.start_agent(name, token)
            from portal.core.models import Node

            harness.wait_for(lambda: Node.objects.filter(state="online", name__startswith="notify-e2e").count() == 2,
                             60, what="two agents online")
            yield {"stack": st, "smtp": smtp, "owner": owner}
        finally:
            st.stop_all()
            smtp.stop()
            restore_broker()
            _forget_notify_rows()
            if os.environ.get("RECLAIMNET_E2E_KEEP"):
                print(f"notify e2e logs kept in {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)


def _retire_leftovers() -> None:
    """Earlier modules of the session share this test database (pytest-django sets it up once) and leave nodes
    that look online, jobs that look queued or running and reclaims under way. This module's control loop would
    declare those nodes lost and move their jobs onto its own two nodes: retire them, end their jobs, close their
    reclaims and drop their migrations' pending steps."""
    from portal.control.models import MigrationWork
    from portal.core.lifecycle.jobs import TERMINAL, JobState
    from portal.core.lifecycle.nodes import NodeState
    from portal.core.models import Job, Node, ReclaimEvent
    from portal.core.models.reclaims import ReclaimOutcome

    MigrationWork.objects.all().delete()
    ReclaimEvent.objects.filter(finished_at__isnull=True).update(finished_at=timezone.now(),
                                                                 outcome=ReclaimOutcome.FORCED)
    Job.objects.exclude(state__in=TERMINAL).update(state=JobState.CANCELLED)
    Node.objects.exclude(state=NodeState.RETIRED).update(state=NodeState.RETIRED)


def _forget_notify_rows() -> None:
    """This module commits rows; the unit tests of the same session must not see its webhooks and deliveries."""
    from portal.core.models import OutboxMessage
    from portal.notify.models import Delivery, Preference, StoredMail, Webhook

    Delivery.objects.all().delete()
    Webhook.objects.all().delete()
    Preference.objects.all().delete()
    StoredMail.objects.all().delete()
    OutboxMessage.objects.filter(task_name__startswith="notify.").delete()


def _running_job(name: str) -> tuple[Any, Any]:
    from portal.core.models import Checkpoint, Job

    job_id = harness.submit_training_job(name, STEPS, STEP_SLEEP_S, PAD_BYTES)
    harness.wait_for(lambda: Job.objects.get(pk=job_id).state == "running", 60, what=f"{name} running")
    job = Job.objects.get(pk=job_id)
    node = job.placements.get(ended_at__isnull=True).node
    harness.wait_for(lambda: Checkpoint.objects.filter(job=job).exclude(replica_nodes=None).exists(), 60,
                     what=f"{name}: a pre-synced checkpoint")
    return job, node


def _finish(job: Any, node: Any, reclaim: Any) -> Any:
    from portal.core.models import Job, Node, ReclaimEvent
    from portal.core.services.nodes import lend_again

    harness.wait_for(lambda: ReclaimEvent.objects.get(pk=reclaim.pk).finished_at is not None, NOTICE_S + 30,
                     what="the reclaim to finish")
    harness.wait_for(lambda: Job.objects.get(pk=job.pk).state in ("completed", "failed", "cancelled"), 60,
                     what=f"job {job.pk} to finish")
    node = Node.objects.get(pk=node.pk)
    if node.state == "reclaimed":
        lend_again(node, None)
    harness.wait_for(lambda: Node.objects.get(pk=node.pk).state == "online", 30, what=f"{node.name} online again")
    return ReclaimEvent.objects.get(pk=reclaim.pk)


def _mails_about(smtp: SmtpSink, job_name: str) -> list[tuple[float, str, str]]:
    out = []
    for m in smtp.messages:
        msg = email.message_from_bytes(m["data"].encode(), policy=email.policy.default)
        body = msg.get_body(preferencelist=("plain",))
        text = body.get_content() if body is not None else ""
        if job_name in text:
            out.append((m["at_s"], str(msg["Subject"]).strip(), text))
    return out


def test_a_scheduled_reclaim_warns_the_owner_by_mail_and_signed_webhook_before_its_deadline(
        notify_stack: dict[str, Any]) -> None:
    from portal.core.services.reclaims import request_reclaim
    from portal.notify.api import create_webhook

    receiver = Receiver().start()
    try:
        hook = create_webhook(notify_stack["owner"], url=receiver.url, name="e2e")
        receiver.secret = hook.secret
        job, node = _running_job("notify-warned")
        reclaim = request_reclaim(node, None, NOTICE_S)
        deadline_s = reclaim.deadline_at.timestamp()
        # Waits longer than the notice: the assertions below check each arrived before the deadline.
        harness.wait_for(lambda: any(r.json["event"] == "job.warned" for r in receiver.received), 2 * NOTICE_S,
                         what="the warning webhook")
        harness.wait_for(lambda: _mails_about(notify_stack["smtp"], "“notify-warned” must leave"), 2 * NOTICE_S,
                         what="the warning mail")
        [warned] = [r for r in receiver.received if r.json["event"] == "job.warned"]
        assert warned.signature_ok is True and warned.at_s < deadline_s
        body = warned.json
        assert body["text"].startswith("Your job “notify-warned” must leave notify-e2e-")
        assert body["job"]["id"] == job.pk and body["node"]["name"] == node.name
        assert body["reclaim"]["deadline_at"] and body["expected_loss_s"] == 0.0
        [(mailed_at_s, subject, text)] = _mails_about(notify_stack["smtp"], "“notify-warned” must leave")
        assert mailed_at_s < deadline_s and subject.startswith("[ReclaimNet] Your job")
        local_deadline = timezone.localtime(reclaim.deadline_at).strftime("%H:%M")
        assert f"must leave {node.name} by {local_deadline}" in text
        assert "expected loss 0 s" in text and "Expected loss: 0 s" in text
        assert f"Node: {node.name}" in text and "Job: notify-warned" in text
        assert _finish(job, node, reclaim).outcome == "completed"
    finally:
        receiver.stop()


def test_a_receiver_answering_500_is_retried_and_the_reclaim_finishes_on_time_regardless(
        notify_stack: dict[str, Any]) -> None:
    from portal.core.services.reclaims import request_reclaim
    from portal.notify.api import create_webhook
    from portal.notify.models import Delivery, Webhook

    Webhook.objects.update(enabled=False)  # the earlier test's receiver is gone
    receiver = Receiver(statuses=[500, 500]).start()  # then 200
    try:
        hook = create_webhook(notify_stack["owner"], url=receiver.url, name="flaky")
        receiver.secret = hook.secret
        job, node = _running_job("notify-flaky")
        reclaim = request_reclaim(node, None, NOTICE_S)
        harness.wait_for(lambda: Delivery.objects.filter(webhook=hook, event="job.warned", status="sent").exists(),
                         2 * NOTICE_S, what="the warning delivered on its third attempt")
        delivery = Delivery.objects.get(webhook=hook, event="job.warned")
        assert [(a.number, a.status_code) for a in delivery.attempt_log.order_by("number")] == [
            (1, 500), (2, 500), (3, 200)]
        warned = [r for r in receiver.received if r.json["event"] == "job.warned"]
        assert [r.status for r in warned] == [500, 500, 200] and all(r.signature_ok for r in warned)
        done = _finish(job, node, reclaim)
        assert done.outcome == "completed" and done.finished_at <= done.deadline_at
    finally:
        receiver.stop()
