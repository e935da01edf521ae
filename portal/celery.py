"""The Celery app. With no REDIS_URL, tasks run eagerly in-process (the embedded default).

Shutdown (docs/design.md §10): SIGTERM starts Celery's warm shutdown, which waits for running tasks without
limit. Here it is bounded: ``COLD_SHUTDOWN_S`` before ``RECLAIMNET_SHUTDOWN_GRACE_S`` the worker sends itself
SIGQUIT, Celery's cold shutdown, which cancels what still runs and puts those (late-acked) messages back on their
queues for another worker; at the grace the process ends regardless (a message it still held is redelivered after
the broker's visibility timeout). Every process closes its database connections (pooled ones included) on the
way out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from typing import Any

import redis.exceptions
from celery import Celery
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_shutdown,
    worker_shutting_down,
)
from django.db import close_old_connections, connections
from kombu.transport import redis as kombu_redis

from portal.env import env_float

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")


class _RedisChannel(kombu_redis.Channel):
    """kombu's Redis channel, surviving a broker restart (docs/design.md §10).

    On a lost connection Celery 5.7 calls ``Connection.collect()`` (which drops the transport's ``client``) and
    then ``Connection.close()``; closing the channel again tries to requeue the unacknowledged messages through
    a new client, built from the dropped ``client``: ``AttributeError: 'NoneType' object has no attribute
    'hostname'``, which is not a connection error, so the worker died ("Unrecoverable error"). Here that case is
    a connection error, which Celery ignores before reconnecting; the messages stay in Redis's unacked set and
    are redelivered after the visibility timeout (the reconciler re-drives lost control steps sooner)."""

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection was already collected")
        return dict(super()._connparams(asynchronous=asynchronous))


class RedisTransport(kombu_redis.Transport):
    """``CELERY_BROKER_TRANSPORT`` with Redis: kombu's transport with :class:`_RedisChannel`."""

    Channel = _RedisChannel


app = Celery("reclaimnet")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django fixup closes every connection, and in a prefork child the whole psycopg pool, before and after
# each task (celery/fixups/django.py ``_close_database``): every task then opened a new pool (its threads and a
# new connection), and a notification still being delivered in its thread lost its pool in mid-attempt ("pool has
# already been opened/closed and cannot be reused"). The fixup's closing is switched off here (its setting:
# close after this many tasks) and :func:`_release_connections` applies Django's per-request rule instead.
app.conf["CELERY_DB_REUSE_MAX"] = 2**62
app.autodiscover_tasks()

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = env_float("RECLAIMNET_SHUTDOWN_GRACE_S", 6.0)
COLD_SHUTDOWN_S = 3.5  # what the cold shutdown (it requeues what it cancels) gets before the process ends
_shutdown_armed = threading.Event()


def close_database_connections() -> None:
    """Close this thread's database connections and this process's connection pools (a pooled connection in use
    elsewhere is closed when it is given back)."""
    for alias in connections:
        conn = connections[alias]
        with contextlib.suppress(Exception):
            conn.close()
        close_pool = getattr(conn, "close_pool", None)
        if close_pool is not None:
            with contextlib.suppress(Exception):
                close_pool()


def _bounded_shutdown(grace_s: float) -> None:
    warm_s = max(grace_s - COLD_SHUTDOWN_S, 0.0)
    time.sleep(warm_s)
    log.warning("tasks still running %.1f s after SIGTERM: cancelling them (they go back to their queues)", warm_s)
    os.kill(os.getpid(), signal.SIGQUIT)
    time.sleep(COLD_SHUTDOWN_S)
    close_database_connections()
    logging.shutdown()
    os._exit(1)


@worker_shutting_down.connect
def _arm_shutdown_deadline(sig: str = "", how: str = "", **kwargs: Any) -> None:
    """Sent in the worker's main process when it starts to shut down (SIGTERM: warm, SIGQUIT: cold)."""
    if how == "Warm" and not _shutdown_armed.is_set():
        _shutdown_armed.set()
        threading.Thread(target=_bounded_shutdown, args=(SHUTDOWN_GRACE_S,), name="shutdown-deadline",
                         daemon=True).start()


@worker_init.connect
def _no_pool_in_the_parent(**kwargs: Any) -> None:
    """The worker's main process forks the children (and an embedded beat): it keeps no pool they could inherit
    (each child's start closes what it inherited, and closing a pool the parent still uses would end the
    parent's connections)."""
    close_database_connections()


@task_prerun.connect
@task_postrun.connect
def _release_connections(**kwargs: Any) -> None:
    """Before and after each task, as Django does around a request: this thread's connection goes back to the
    process's pool (CONN_MAX_AGE 0) and an unusable one is dropped; the pool itself stays open."""
    task = kwargs.get("task")
    if task is not None and getattr(task.request, "is_eager", False):
        return  # an eager task runs inside its caller's transaction
    close_old_connections()


@worker_process_shutdown.connect
def _close_child_connections(**kwargs: Any) -> None:
    """A prefork child exits: its connections too."""
    close_database_connections()
