"""The evaluation task, on its own ``evaluation`` queue (design §10; the route is in settings).

Acknowledged on receipt (``acks_late=False``): a run may outlast the broker's visibility timeout, and a second
delivery would only find the row claimed. A worker that dies mid-run leaves the row ``running`` until
``services.expire_stale`` marks it failed. In the embedded default (``make demo``: no broker, the outbox relay runs
task bodies inside daphne) the run goes to a thread of its own, so the relay never waits behind a simulation.
"""

from __future__ import annotations

import threading

from celery import shared_task
from django.conf import settings
from django.db import close_old_connections, connections

from portal.core.outbox import relay_mode
from portal.whatif import services


def _in_thread(evaluation_id: int) -> None:
    close_old_connections()
    try:
        services.run_evaluation(evaluation_id)
    finally:
        connections.close_all()


@shared_task(name=services.TASK, ignore_result=True, acks_late=False,
             soft_time_limit=getattr(settings, "RECLAIMNET_WHATIF_SOFT_TIME_LIMIT_S", 1800.0),
             time_limit=getattr(settings, "RECLAIMNET_WHATIF_TIME_LIMIT_S", 1860.0))
def run_evaluation(evaluation_id: int) -> None:
    if relay_mode() == "loop":
        threading.Thread(target=_in_thread, args=(evaluation_id,), name=f"whatif-{evaluation_id}",
                         daemon=True).start()
        return
    services.run_evaluation(evaluation_id)
