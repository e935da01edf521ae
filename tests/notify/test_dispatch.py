"""From a notice to deliveries (design §12): who gets what by which channel, attempts with real receivers on
loopback, retries with backoff, the digest, the watchers."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from portal.core import events
from portal.core.models import OutboxMessage
from portal.notify import dispatch
from portal.notify.api import create_webhook
from portal.notify.models import Attempt, Delivery, DeliveryStatus, EmailMode, Preference
from tests.notify.conftest import World
from tests.notify.servers import Receiver, SmtpSink
from tests.portal import factories as f

pytestmark = pytest.mark.django_db


def _notice(world: World, name: str = "job.failed", **extra: Any) -> dict[str, Any]:
    notice = events.emit(name, job=world.job, node=world.node, **extra)
    assert notice is not None
    return {**notice.payload(), "facts": notice.facts}


def _deliveries(**filters: Any) -> list[Delivery]:
    return list(Delivery.objects.filter(**filters).order_by("pk"))


def _queued(task: str = dispatch.DELIVER) -> list[list[Any]]:
    return [m.args for m in OutboxMessage.objects.filter(task_name=task).order_by("pk")]


# --- preferences filtering -------------------------------------------------------------------------------------

def test_by_default_a_failure_mails_the_jobs_owner_and_not_the_rest_of_the_group(world: World) -> None:
    assert dispatch.fan_out(_notice(world)) == 1
    [mail] = _deliveries()
    assert (mail.channel, mail.user, mail.target) == ("email", world.researcher, "alice@campus.example")
    assert mail.text.startswith("Your job “bert-finetune” failed on lab-a-01")
    assert _queued() == [[mail.pk, 1]]


def test_a_colleague_who_chose_the_event_gets_it_in_the_others_words_and_an_owner_can_turn_it_off(
        world: World) -> None:
    Preference.objects.create(user=world.colleague, event="job.failed", email=EmailMode.NOW)
    Preference.objects.create(user=world.researcher, event="job.failed", email=EmailMode.OFF)
    dispatch.fan_out(_notice(world))
    [mail] = _deliveries()
    assert mail.user == world.colleague and mail.text.startswith("Job “bert-finetune” of alice failed")


def test_info_events_are_toasts_only_good_news_waits_for_the_digest(world: World) -> None:
    assert dispatch.fan_out(_notice(world, "job.placed")) == 0
    assert not _deliveries()
    dispatch.fan_out(_notice(world, "job.finished"))
    [row] = _deliveries()
    assert (row.channel, row.status) == ("digest", DeliveryStatus.IN_DIGEST) and not _queued()


def test_provider_events_reach_the_labs_members_and_admin_events_the_admins(world: World) -> None:
    notice = events.emit("node.owner_using_gpu", node=world.node, gpus=[{"index": 1, "util_pct": 97.0}])
    assert notice is not None and "GPU 1 (97%) is busy with no borrowed job" in notice.text
    dispatch.fan_out({**notice.payload(), "facts": notice.facts})
    assert [d.user for d in _deliveries()] == [world.provider_user]
    Delivery.objects.all().delete()
    f.place_job(world.job, world.node)
    world.job.loss_budget_s = 120.0
    world.job.save()
    budget = events.emit("job.budget_at_risk", job=world.job, node=world.node)
    assert budget is not None and "loss budget of 2 min" in budget.text
    dispatch.fan_out({**budget.payload(), "facts": budget.facts})
    assert [d.user for d in _deliveries()] == [world.admin]


def test_a_fan_out_delivered_twice_writes_each_delivery_once(world: World) -> None:
    payload = _notice(world)
    dispatch.fan_out(payload)
    dispatch.fan_out(payload)
    assert len(_deliveries()) == 1 and len(_queued()) == 1


def test_webhooks_the_users_own_by_preference_and_the_groups_always(world: World, receiver: Receiver) -> None:
    mine = create_webhook(world.researcher, url=receiver.url)
    groups = create_webhook(world.colleague, url=receiver.url + "/group", group=world.group)
    create_webhook(world.outsider, url=receiver.url + "/other", group=world.other_group)
    create_webhook(world.colleague, url=receiver.url + "/bob")  # bob chose nothing for a job not his
    disabled = create_webhook(world.researcher, url=receiver.url + "/off")
    disabled.enabled = False
    disabled.save()
    dispatch.fan_out(_notice(world))
    hooks = {d.webhook_id: d for d in _deliveries(channel="webhook")}
    assert set(hooks) == {mine.pk, groups.pk}
    assert hooks[mine.pk].text.startswith("Your job") and hooks[groups.pk].text.startswith("Job “bert-finetune” of")


# --- attempts, retries, backoff ------------------------------------------------------------------------------

def test_a_webhook_is_posted_signed_with_slack_text_and_structured_fields(world: World, receiver: Receiver) -> None:
    hook = create_webhook(world.researcher, url=receiver.url)
    receiver.secret = hook.secret
    dispatch.fan_out(_notice(world, returncode=3))
    [delivery] = _deliveries(channel="webhook")
    assert dispatch.attempt_delivery(delivery.pk, 1) == "sent"
    [got] = receiver.received
    assert got.signature_ok is True
    assert got.headers["x-reclaimnet-event"] == "job.failed"
    body = got.json
    assert body["text"].startswith("Your job “bert-finetune” failed on lab-a-01 (exit code 3)")
    assert body["job"] == {"id": world.job.pk, "name": "bert-finetune", "owner": "alice", "group_id": world.group.pk}
    assert body["node"]["name"] == "lab-a-01" and body["returncode"] == 3 and body["attempt"] == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.last_status_code, delivery.attempts) == ("sent", 200, 1)
    assert [(a.number, a.status_code, a.error) for a in Attempt.objects.all()] == [(1, 200, "")]


def test_a_500_is_retried_after_a_growing_backoff_until_it_answers(world: World, receiver: Receiver,
                                                                   fast_retries: Any, settings: Any) -> None:
    settings.RECLAIMNET_NOTIFY = {**settings.RECLAIMNET_NOTIFY, "RETRY_BASE_S": 10.0}
    hook = create_webhook(world.researcher, url=receiver.url)
    receiver.statuses = [500, 503]
    dispatch.fan_out(_notice(world))
    [delivery] = _deliveries(channel="webhook")
    before = timezone.now()
    assert dispatch.attempt_delivery(delivery.pk, 1) == "retrying"
    assert dispatch.attempt_delivery(delivery.pk, 2) == "retrying"
    retries = list(OutboxMessage.objects.filter(task_name=dispatch.DELIVER).order_by("pk"))[-2:]
    assert [m.args for m in retries] == [[delivery.pk, 2], [delivery.pk, 3]]
    waits = [(m.available_at - before).total_seconds() for m in retries]
    assert 9 < waits[0] < 15 and 19 < waits[1] < 25  # 10 s, then 20 s
    assert dispatch.attempt_delivery(delivery.pk, 3) == "sent"
    assert [(a.number, a.status_code) for a in Attempt.objects.order_by("number")] == [(1, 500), (2, 503), (3, 200)]
    assert hook.deliveries.get().status == DeliveryStatus.SENT


def test_backoff_doubles_from_the_base_and_is_capped(settings: Any) -> None:
    settings.RECLAIMNET_NOTIFY = {**settings.RECLAIMNET_NOTIFY, "RETRY_BASE_S": 5.0, "RETRY_MAX_S": 60.0}
    assert [dispatch.backoff_s(n) for n in (1, 2, 3, 4, 5, 6)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]


def test_it_gives_up_after_the_last_attempt_and_at_once_on_a_404(world: World, receiver: Receiver,
                                                                   fast_retries: Any) -> None:
    create_webhook(world.researcher, url=receiver.url)
    receiver.status = 500
    dispatch.fan_out(_notice(world))
    [delivery] = _deliveries(channel="webhook")
    assert [dispatch.attempt_delivery(delivery.pk, n) for n in (1, 2, 3)] == ["retrying", "retrying", "gave up"]
    receiver.status = 404
    other = dispatch.send_test(create_webhook(world.researcher, url=receiver.url + "/x"), world.researcher,
                               "webhook")
    assert dispatch.attempt_delivery(other.pk, 1) == "gave up"
    assert Delivery.objects.get(pk=other.pk).last_error == "HTTP 404"


def test_a_timeout_is_an_error_retried_and_an_attempt_is_claimed_once(world: World, receiver: Receiver,
                                                                        fast_retries: Any, settings: Any) -> None:
    settings.RECLAIMNET_NOTIFY = {**settings.RECLAIMNET_NOTIFY, "WEBHOOK_TIMEOUT_S": 0.3}
    receiver.delay_s = 2.0
    create_webhook(world.researcher, url=receiver.url)
    dispatch.fan_out(_notice(world))
    [delivery] = _deliveries(channel="webhook")
    assert dispatch.attempt_delivery(delivery.pk, 1) == "retrying"
    assert "timed out" in Delivery.objects.get(pk=delivery.pk).last_error
    assert dispatch.attempt_delivery(delivery.pk, 1) == "not mine"  # the same attempt delivered twice


def test_mail_goes_through_a_real_smtp_server_naming_the_job_and_a_dead_server_is_retried(
        world: World, smtp: SmtpSink, fast_retries: Any, settings: Any) -> None:
    dispatch.fan_out(_notice(world))
    [delivery] = _deliveries(channel="email")
    assert dispatch.attempt_delivery(delivery.pk, 1) == "sent"
    [message] = smtp.messages
    assert message["to"] == ["alice@campus.example"]
    assert "bert-finetune" in message["data"] and "Node: lab-a-01" in message["data"]
    settings.EMAIL_PORT = f.uid() + 1  # nothing listens there
    settings.EMAIL_PORT = _closed_port()
    again = dispatch.send_test(None, world.researcher, "email")
    assert dispatch.attempt_delivery(again.pk, 1) == "retrying"
    assert "Refused" in Delivery.objects.get(pk=again.pk).last_error


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_deliver_returns_at_once_and_the_attempt_runs_in_the_background(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The task body never waits for the network: a slow receiver holds a pool thread, not the caller (the
    embedded relay, a worker's task slot)."""
    import threading

    release = threading.Event()
    ran_in: list[str] = []

    def slow_attempt(delivery_id: int, attempt: int, **kwargs: Any) -> str:
        release.wait(10.0)
        ran_in.append(threading.current_thread().name)
        return "sent"

    monkeypatch.setattr(dispatch, "attempt_delivery", slow_attempt)
    dispatch.deliver(123, 1)  # returns while the attempt is still blocked
    assert not ran_in
    release.set()
    assert dispatch.drain(10.0)
    assert len(ran_in) == 1 and ran_in[0].startswith("notify")


# --- digest, watchers, stuck attempts --------------------------------------------------------------------------

def test_the_digest_gathers_each_users_waiting_events_into_one_mail(world: World) -> None:
    for _ in range(3):
        dispatch.fan_out(_notice(world, "job.finished"))
    assert len(_deliveries(channel="digest", status="in_digest")) == 3
    assert dispatch.send_digests() == 1
    [mail] = _deliveries(channel="email")
    assert mail.facts["subject"] == "[ReclaimNet] Digest: 3 events" and mail.text.count("finished") == 3
    assert _queued() == [[mail.pk, 1]]
    assert dispatch.send_digests() == 0  # nothing waits any more
    assert len(_deliveries(status="digested")) == 3


def test_a_loss_budget_turning_at_risk_is_announced_once_and_again_after_it_recovered(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    emitted: list[tuple[str, Any]] = []
    monkeypatch.setattr(events, "emit", lambda name, **kw: emitted.append((name, kw)) or name)
    f.place_job(world.job, world.node)
    jobs = type(world.job).objects.filter(pk=world.job.pk)
    jobs.update(loss_budget_s=60.0, loss_budget_at_risk=True)
    assert dispatch.watch_budgets() == 1
    assert emitted == [("job.budget_at_risk", {"job": world.job.pk, "node": world.node.pk})]
    assert dispatch.watch_budgets() == 0  # still at risk: told once
    jobs.update(loss_budget_at_risk=False)
    assert dispatch.watch_budgets() == 0
    jobs.update(loss_budget_at_risk=True)
    assert dispatch.watch_budgets() == 1 and len(emitted) == 2


def test_owner_use_needs_a_busy_gpu_no_job_of_ours_holds_twice_in_a_row(world: World,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from django.core.cache import cache

    cache.delete_many([f"notify:owner-use-seen:{world.node.pk}", f"notify:owner-use-told:{world.node.pk}"])
    emitted: list[tuple[str, Any]] = []
    monkeypatch.setattr(events, "emit", lambda name, **kw: emitted.append((name, kw)))
    f.place_job(world.job, world.node, gpu_indices=[0])
    lent = {world.node.pk}
    dispatch.observe_heartbeats([(world.node.pk, [100.0, 3.0])], lent)  # ours: GPU 0
    dispatch.observe_heartbeats([(world.node.pk, [100.0, 3.0])], lent)
    assert emitted == []
    dispatch.observe_heartbeats([(world.node.pk, [100.0, 88.0])], set())  # not lent: the lab's own business
    dispatch.observe_heartbeats([(world.node.pk, [100.0, 88.0])], lent)
    assert emitted == []  # once is a glimpse
    dispatch.observe_heartbeats([(world.node.pk, [100.0, 91.0])], lent)
    assert emitted == [("node.owner_using_gpu", {"node": world.node.pk, "gpus": [{"index": 1, "util_pct": 91.0}]})]
    dispatch.observe_heartbeats([(world.node.pk, [100.0, 91.0])], lent)
    assert len(emitted) == 1  # at most once an hour per node


def test_an_attempt_lost_with_its_process_is_queued_again(world: World, receiver: Receiver) -> None:
    create_webhook(world.researcher, url=receiver.url)
    dispatch.fan_out(_notice(world))
    [delivery] = _deliveries(channel="webhook")
    long_ago = timezone.now() - dt.timedelta(seconds=dispatch.STUCK_AFTER_S + 5)
    Delivery.objects.filter(pk=delivery.pk).update(attempts=1, claimed_at=long_ago)  # claimed, never finished
    assert dispatch.requeue_stuck() == 1
    assert _queued()[-1] == [delivery.pk, 2]
    assert dispatch.requeue_stuck() == 0


def test_the_warning_says_by_when_where_to_and_what_the_notice_allows(world: World) -> None:
    from portal.core.models import ReclaimEvent

    reclaim = ReclaimEvent(node=world.node, kind="scheduled", notice_s=600.0, deadline_at=timezone.now())
    loss_free = events.CATALOGUE["job.warned"].render(
        events.Facts(reclaim=reclaim, extra={"expected_loss_s": 0.0, "leave_s": 40.0}), "Your job “x”")
    assert loss_free is not None and loss_free.startswith("Your job “x” must leave lab-a-01 by ")
    assert loss_free.endswith("no work should be lost (expected loss 0 s, about 40 s to checkpoint, copy and "
                              "restart).")
    lossy = events.CATALOGUE["job.warned"].render(
        events.Facts(reclaim=reclaim, extra={"expected_loss_s": 40.0, "leave_s": 90.0}), "Your job “x”")
    assert lossy is not None and lossy.endswith("expected loss 40 s, about 1 min 30 s to checkpoint, copy and restart.")


def test_a_notices_facts_are_json_whatever_the_emitter_passed(world: World) -> None:
    when = timezone.now()
    notice = events.emit("job.failed", job=world.job, node=world.node, returncode=1, release_at=when,
                         opaque=object(), nested={"bad": object()})
    assert notice is not None
    assert notice.facts["release_at"] == when.isoformat() and notice.facts["returncode"] == 1
    assert "opaque" not in notice.facts and "nested" not in notice.facts
