"""The transactional outbox: work exists exactly when the change that queued it commits, is handed over until a
publisher takes it, and is never handed to two relays at once."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from portal.core import outbox
from portal.core.models import Job, OutboxMessage
from portal.core.services import jobs as job_services
from tests.portal.conftest import World
from tests.portal.factories import at_once


def _submit(world: World, name: str = "gpt") -> Job:
    return job_services.submit_job(world.users["researcher"], group=world.group, name=name, command="python x.py",
                                   gpu_count=1, expected_runtime_s=60, ckpt_bytes_estimate=10**6)


@pytest.mark.django_db
def test_submit_queues_placement_in_its_own_transaction(world: World) -> None:
    job = _submit(world)
    row = OutboxMessage.objects.get()
    assert (row.task_name, row.args, row.sent_at) == (outbox.Task.PLACE_JOB, [job.pk], None)


@pytest.mark.django_db
def test_work_of_a_rolled_back_change_is_never_queued(world: World) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        _submit(world)
        raise RuntimeError("the request failed after the service call")
    assert not Job.objects.filter(name="gpt").exists()
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db
def test_a_failing_publisher_keeps_the_row_and_backs_off(world: World) -> None:
    _submit(world)

    def broker_down(message: OutboxMessage) -> None:
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")

    assert outbox.relay_once(broker_down) == (0, 1)
    row = OutboxMessage.objects.get()
    assert row.sent_at is None and row.attempts == 1 and "Connection refused" in row.last_error
    assert row.available_at > timezone.now()  # backing off: not handed over again at once
    assert outbox.relay_once(broker_down) == (0, 0)
    OutboxMessage.objects.update(available_at=timezone.now() - dt.timedelta(seconds=1))
    delivered: list[tuple[str, list[Any]]] = []
    assert outbox.relay_once(lambda m: delivered.append((m.task_name, m.args))) == (1, 0)
    assert delivered == [(outbox.Task.PLACE_JOB, [Job.objects.get(name="gpt").pk])]
    assert OutboxMessage.objects.get().sent_at is not None
    assert outbox.relay_once(lambda m: delivered.append((m.task_name, m.args))) == (0, 0)  # sent once


@pytest.mark.django_db
def test_delayed_work_waits_for_its_time() -> None:
    outbox.enqueue(outbox.Task.ENFORCE_DEADLINE, 7, delay_s=60)
    assert outbox.relay_once(lambda m: None) == (0, 0)
    OutboxMessage.objects.update(available_at=timezone.now())
    assert outbox.relay_once(lambda m: None) == (1, 0)


@pytest.mark.django_db
def test_a_relay_that_died_holding_rows_loses_them_to_another_after_the_claim() -> None:
    outbox.enqueue(outbox.Task.PLACE_JOB, 1)
    assert len(outbox.claim_due()) == 1  # a relay claims, then dies before publishing
    assert outbox.claim_due() == []
    later = timezone.now() + dt.timedelta(seconds=outbox.CLAIM_S + 1)
    assert [m.args for m in outbox.claim_due(now=later)] == [[1]]


@pytest.mark.django_db(transaction=True)
def test_concurrent_relays_never_hand_over_the_same_row() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks with SKIP LOCKED need PostgreSQL")
    for i in range(200):
        outbox.enqueue(outbox.Task.PLACE_JOB, i)
    handed: list[int] = []
    lock = threading.Lock()

    def relay() -> None:
        while True:
            sent, _ = outbox.relay_once(lambda m: (lock.acquire(), handed.append(m.args[0]), lock.release()),
                                        limit=7)
            if not sent:
                break

    at_once(4, relay)
    assert sorted(handed) == list(range(200))
    assert outbox.pending() == 0


@pytest.mark.django_db
def test_prune_deletes_only_rows_sent_long_ago() -> None:
    old, recent, unsent = (outbox.enqueue(outbox.Task.PLACE_JOB, i) for i in range(3))
    OutboxMessage.objects.filter(pk=old.pk).update(sent_at=timezone.now() - dt.timedelta(days=2))
    OutboxMessage.objects.filter(pk=recent.pk).update(sent_at=timezone.now())
    assert outbox.prune_sent() == 1
    assert set(OutboxMessage.objects.values_list("pk", flat=True)) == {recent.pk, unsent.pk}


@pytest.mark.django_db(transaction=True)
def test_the_control_tick_is_single_flight_across_workers() -> None:
    """Another worker holding the tick lock (a second connection) makes this tick skip, not run twice."""
    if connection.vendor != "postgresql":
        pytest.skip("advisory locks need PostgreSQL")
    import psycopg

    from portal.control.loop.ticks import TICK_LOCK_KEY, control_tick

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as other_worker:
        other_worker.execute("SELECT pg_advisory_lock(%s)", [TICK_LOCK_KEY])
        assert control_tick() == {"skipped": 1}
        other_worker.execute("SELECT pg_advisory_unlock(%s)", [TICK_LOCK_KEY])
    assert "skipped" not in control_tick()


@pytest.mark.django_db
def test_reclaims_are_handed_over_before_placements_queued_earlier() -> None:
    for job_id in range(5):
        outbox.enqueue(outbox.Task.PLACE_JOB, job_id)
    outbox.enqueue(outbox.Task.ADVANCE_MIGRATION, 9)
    outbox.enqueue(outbox.Task.RUN_RECLAIM, 7)
    order: list[str] = []
    outbox.relay_once(lambda m: order.append(m.task_name), limit=2)
    assert order == [outbox.Task.RUN_RECLAIM, outbox.Task.ADVANCE_MIGRATION]
