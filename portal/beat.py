"""Celery beat with the outbox relay inside it (production setup; docs/design.md §8).

``CELERY_BEAT_SCHEDULER`` names :class:`RelayingScheduler`, so ``celery -A portal beat`` (or ``worker -B``) also
runs one relay thread: it hands committed outbox rows to the broker and marks them sent. It wakes on PostgreSQL
``NOTIFY`` the moment a row commits (the enqueue seam notifies in the writer's transaction) and polls every
``POLL_S`` as a fallback. A broker outage only delays rows: each is retried with backoff until Redis takes it.
Several relays (two beats by mistake) are safe: rows are claimed with ``SKIP LOCKED``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from celery.beat import PersistentScheduler
from celery.utils.log import get_logger
from django.db import close_old_connections, connection

from portal.celery import close_database_connections

log = get_logger(__name__)  # beat's own logging setup shows it

POLL_S = 0.5
PRUNE_EVERY_S = 600.0


def publish_to_broker(message: Any) -> None:
    """Publisher for ``outbox.relay_once``: one Celery message, task id = the row's id (duplicates recognisable).
    ``retry=False``: a broker that is down fails this call at once and the row waits for its next attempt."""
    from portal.celery import app

    app.send_task(message.task_name, args=list(message.args), task_id=str(message.message_id), retry=False)


class _Listener:
    """A dedicated PostgreSQL connection that LISTENs on the outbox channel (None on SQLite)."""

    def __init__(self) -> None:
        self.conn: Any = None

    def wait(self, timeout_s: float) -> None:
        from portal.core.outbox import NOTIFY_CHANNEL

        if connection.vendor != "postgresql":
            time.sleep(timeout_s)
            return
        try:
            if self.conn is None or self.conn.closed:
                import psycopg

                params = connection.get_connection_params()
                params.pop("cursor_factory", None)
                params.pop("context", None)
                self.conn = psycopg.connect(**params, autocommit=True)
                self.conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            for _ in self.conn.notifies(timeout=timeout_s, stop_after=1):
                break
        except Exception:  # the database is restarting: poll instead, reconnect next time
            log.debug("outbox listener unavailable", exc_info=True)
            self.close()
            time.sleep(timeout_s)

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.conn = None


def relay_forever(stop: threading.Event) -> None:
    """The relay thread's body: relay, then wait for a NOTIFY or the poll interval; every ``PRUNE_EVERY_S``
    drop rows sent a day ago and expired idempotency keys."""
    from portal.core import idempotency, outbox

    listener = _Listener()
    last_prune = 0.0
    try:
        while not stop.is_set():
            try:
                close_old_connections()
                sent, failed = outbox.relay_once(publish_to_broker)
                if time.monotonic() - last_prune > PRUNE_EVERY_S:
                    outbox.prune_sent()
                    idempotency.prune_expired()
                    last_prune = time.monotonic()
                if sent and not failed:
                    continue  # more may be due
            except Exception:  # database down or restarting: keep the thread, try again shortly
                log.warning("outbox relay: database unavailable, retrying", exc_info=True)
                with contextlib.suppress(Exception):
                    connection.close()
            listener.wait(POLL_S)
    finally:
        listener.close()
        with contextlib.suppress(Exception):
            connection.close()


class RelayingScheduler(PersistentScheduler):
    """Beat's persistent scheduler plus the outbox relay thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._relay_stop = threading.Event()
        self._relay_thread: threading.Thread | None = None
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        super().setup_schedule()
        if self._relay_thread is None:
            from django.apps import apps

            if not apps.ready:
                import django

                django.setup()
            self._relay_thread = threading.Thread(target=relay_forever, args=(self._relay_stop,),
                                                  name="outbox-relay", daemon=True)
            self._relay_thread.start()
            log.info("outbox relay started in the beat process")

    def close(self) -> None:
        """Beat is stopping (SIGTERM): the relay thread finishes its batch and gives its connection back, then
        this process's connection pool is closed (docs/design.md §10)."""
        self._relay_stop.set()
        if self._relay_thread is not None:
            self._relay_thread.join(timeout=5)
        close_database_connections()
        super().close()
