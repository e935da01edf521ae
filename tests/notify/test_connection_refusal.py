"""A delivery thread outlives its Celery task: when the pool refuses it a connection (Celery's Django fixup closes
the prefork child's pool around every task) the database step is tried again, never the send (design §12)."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from portal.notify import dispatch


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch.time, "sleep", lambda s: None)


def test_a_step_refused_a_connection_is_tried_again_until_it_runs() -> None:
    calls: list[int] = []

    def step() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("the pool 'pool-64' is closed")
        if len(calls) == 2:
            raise OperationalError("couldn't get a connection after 10.00 sec")
        return "recorded"

    assert dispatch._with_connection(step) == "recorded"
    assert len(calls) == 3


def test_another_database_error_is_not_retried() -> None:
    calls: list[int] = []

    def step() -> str:
        calls.append(1)
        raise OperationalError("deadlock detected")

    with pytest.raises(OperationalError, match="deadlock"):
        dispatch._with_connection(step)
    assert len(calls) == 1


def test_a_pool_that_stays_closed_gives_up_after_the_last_try() -> None:
    calls: list[int] = []

    def step() -> str:
        calls.append(1)
        raise OperationalError("the pool 'pool-1' is closed")

    with pytest.raises(OperationalError, match="is closed"):
        dispatch._with_connection(step)
    assert len(calls) == dispatch.CONNECTION_TRIES
