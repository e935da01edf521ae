"""ASGI entry point: HTTP through Django, websockets through Channels (agents and browsers).

Django is set up before any consumer is imported (the consumers import models).

Under daphne, SIGTERM ends the process within ``RECLAIMNET_SHUTDOWN_GRACE_S`` with its database connections
closed (docs/design.md §10). Daphne's own shutdown cancels every open connection's application and waits for
all of them with no limit, and asgiref waits for a cancelled ``sync_to_async`` call to return (sync.py, "ret =
await exec_coro"): one request or consumer stuck in the database (a lock wait, a saturated server) kept a daphne
alive, holding its connections, through two SIGTERMs for 17 minutes. So: the in-process loops are cancelled as
the reactor starts to stop, the connection pool is closed once it has stopped, and a deadline thread closes the
pool and ends the process if the graceful path has not finished by the grace.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup(set_prefix=False)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from portal.celery import SHUTDOWN_GRACE_S, close_database_connections  # noqa: E402
from portal.control.loop import embedded  # noqa: E402
from portal.core.http import PortalHttpHandler  # noqa: E402
from portal.core.middleware import ConcurrencyLimit  # noqa: E402
from portal.routing import websocket_urlpatterns  # noqa: E402

log = logging.getLogger(__name__)

# Requests queue for one of RECLAIMNET_HTTP_CONCURRENCY slots instead of all running at once, then run in one
# thread hop each, in a pool with a thread per slot (docs/design.md §10).
_reads, _writes = settings.RECLAIMNET_HTTP_CONCURRENCY, settings.RECLAIMNET_HTTP_WRITE_CONCURRENCY
django_http_app = PortalHttpHandler(threads=_reads + _writes if _reads > 0 and _writes > 0 else 32)
http_application = ConcurrencyLimit(django_http_app, settings.RECLAIMNET_HTTP_CONCURRENCY,
                                    settings.RECLAIMNET_HTTP_QUEUE_TIMEOUT_S, settings.RECLAIMNET_DB_BUSY_RETRY_AFTER_S,
                                    write_limit=settings.RECLAIMNET_HTTP_WRITE_CONCURRENCY,
                                    write_limit_under_reads=settings.RECLAIMNET_HTTP_WRITE_CONCURRENCY_UNDER_READS)
application = ProtocolTypeRouter({"http": http_application, "websocket": URLRouter(websocket_urlpatterns)})


def _exit_at_deadline(grace_s: float) -> None:
    time.sleep(grace_s)
    log.warning("still running %.1f s after the shutdown began: closing database connections and exiting", grace_s)
    close_database_connections()
    logging.shutdown()
    os._exit(0)


def _shutdown_begins() -> None:
    """Reactor "before shutdown" trigger (SIGTERM, SIGINT): stop the loops, arm the deadline."""
    embedded.stop()
    threading.Thread(target=_exit_at_deadline, args=(SHUTDOWN_GRACE_S,), name="shutdown-deadline",
                     daemon=True).start()


def _install_shutdown_hooks() -> None:
    """Only under daphne, which installed Twisted's asyncio reactor before loading this module."""
    reactor = sys.modules.get("twisted.internet.reactor")
    if reactor is None or "daphne.server" not in sys.modules:
        return
    reactor.addSystemEventTrigger("before", "shutdown", _shutdown_begins)
    reactor.addSystemEventTrigger("after", "shutdown", close_database_connections)


_install_shutdown_hooks()


def _freeze_startup_objects() -> None:
    """Move what start-up made (modules, the URLconf and its views, settings, models) out of the cyclic
    garbage collector's sight: they live as long as the process, yet every full collection walked all of them
    again — about 2 ms of a 30 ms page, measured (docs/design.md §10 "CPU per request"). The URLconf is loaded
    first so its views' modules are among them."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 — imports every view module
    gc.collect()
    gc.freeze()


_freeze_startup_objects()
