"""A prefork Celery child keeps its database pool across tasks (portal/celery.py, docs/design.md §10).

Celery's Django fixup closed every connection and the whole psycopg pool before and after each task in a prefork
child: each task opened a new pool and a new connection, and a notification delivered in its own thread lost
its pool in mid-attempt. The fixup runs here as a worker runs it; the pool must outlive the tasks and the
connection must go back to it."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.db import connection

pytestmark = [pytest.mark.skipif(connection.vendor != "postgresql", reason="connection pooling needs PostgreSQL"),
              pytest.mark.django_db(transaction=True)]

ONE_CONNECTION = {"min_size": 1, "max_size": 1, "timeout": 2.0}


@pytest.fixture
def pooled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's connections from a one-connection pool, as a worker child's are (both the settings the
    fixup reads and the connection's own)."""
    connection.close()
    connection.close_pool()
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "pool", ONE_CONNECTION)
    monkeypatch.setitem(settings.DATABASES["default"].setdefault("OPTIONS", {}), "pool", ONE_CONNECTION)
    yield
    connection.close()
    connection.close_pool()


class _Task:
    """What the hooks read of a task: its request (a worker's, not an eager call)."""

    request = SimpleNamespace(is_eager=False)


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def test_a_prefork_child_keeps_its_pool_and_returns_its_connection_between_tasks(pooled: None) -> None:
    from celery.fixups.django import DjangoWorkerFixup
    from celery.signals import task_postrun, task_prerun

    from portal.celery import app

    fixup = DjangoWorkerFixup(app)
    fixup.worker = SimpleNamespace(pool_cls="prefork")  # what the worker's init sets
    task = _Task()
    first = _backend_pid()
    pool = connection.pool
    for _ in range(3):  # a task ends, the next begins: the fixup's hooks and the portal's, as signals send them
        fixup.on_task_postrun(sender=task)
        task_postrun.send(sender=task, task=task)
        assert connection.connection is None  # handed back to the pool, not kept by the thread
        fixup.on_task_prerun(sender=task)
        task_prerun.send(sender=task, task=task)
        assert _backend_pid() == first  # the same pooled connection, not a new one
    assert connection.pool is pool and not pool.closed
