"""Lock order between a researcher's cancel and an emergency recovery of the same job (design §3 emergency).

Both change the job row and its open placement. ``cancel_job`` locks the job, then closes the placement; the
recovery must take them in the same order, or the two transactions wait on each other until PostgreSQL kills
one ("deadlock detected", seen when a kill-switch raced a cancel across two portal processes).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from control_helpers import make_node, make_running_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def _waiting_on_a_lock() -> int:
    """Backends of this test database now waiting for a row lock another transaction holds."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock'")
        return int(cursor.fetchone()[0])


def _in_thread(target: Any, errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        from django.db import connection

        try:
            target()
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_an_emergency_recovery_waits_for_a_cancel_that_holds_the_job_and_does_not_restart_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from django.db import transaction

    from portal.control.reclaim.workflow import recover_from_replica
    from portal.core.lifecycle import jobs as job_lifecycle
    from portal.core.models import Job, Migration, Placement
    from portal.core.services import jobs as job_services

    node, _ = make_node("src", "A")
    make_node("dst", "A")
    job = make_running_job(node)

    holding, release = threading.Event(), threading.Event()
    real_cancel = job_lifecycle.cancel

    def cancel_after_a_pause(locked: Any) -> None:
        holding.set()  # cancel_job holds the job row here, before it closes the placement
        assert release.wait(20)
        real_cancel(locked)

    monkeypatch.setattr(job_services.job_lifecycle, "cancel", cancel_after_a_pause)
    errors: list[BaseException] = []
    cancel = _in_thread(lambda: job_services.cancel_job(Job.objects.get(pk=job.pk), None), errors)
    assert holding.wait(20)

    def recover() -> None:
        with transaction.atomic():
            recover_from_replica(Job.objects.get(pk=job.pk), node.pk, None, "killswitch")

    recovery = _in_thread(recover, errors)
    deadline = time.monotonic() + 20
    while _waiting_on_a_lock() == 0:  # the recovery is blocked: on the job row, if the order is right
        assert time.monotonic() < deadline and recovery.is_alive(), errors
        time.sleep(0.02)
    release.set()
    cancel.join(30)
    recovery.join(30)

    assert errors == []  # no "deadlock detected" on either side
    assert Job.objects.get(pk=job.pk).state == "cancelled"
    assert Placement.objects.get(job=job).end_reason == "cancelled"
    assert not Migration.objects.filter(job=job).exists()  # a cancelled job is not resumed elsewhere
