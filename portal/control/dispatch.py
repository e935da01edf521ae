"""Hooks the core services call (after commit) to hand work to the control plane (SPEC §1).

Each hook only queues a Celery task (JSON, ids as arguments); with no REDIS_URL the task runs eagerly
in-process (the embedded default). The signatures are the contract with ``portal.core.services``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

log = logging.getLogger(__name__)

_paused = False


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Queue nothing while inside (a management command of the embedded default: its in-memory channel layer
    cannot reach the agents, so it leaves the work to the control loop in the daphne process)."""
    global _paused
    previous, _paused = _paused, True
    try:
        yield
    finally:
        _paused = previous


def on_job_submitted(job_id: int) -> None:
    """A job entered the queue: try to place it."""
    if _paused:
        return
    from portal.control.tasks import place_job

    place_job.delay(job_id)


def on_job_cancelled(job_id: int) -> None:
    """A job was cancelled: stop it on its node and release its GPUs."""
    if _paused:
        return
    from portal.control.tasks import stop_cancelled_job

    stop_cancelled_job.delay(job_id)


def on_reclaim_requested(reclaim_id: int) -> None:
    """A provider pressed reclaim (scheduled, emergency or kill-switch): run the reclaim workflow."""
    if _paused:
        return
    from portal.control.tasks import run_reclaim

    run_reclaim.delay(reclaim_id)


def on_node_lent_again(node_id: int) -> None:
    """A reclaimed node is lent again."""
    if _paused:
        return
    from portal.control.tasks import node_lent_again

    node_lent_again.delay(node_id)
