"""A task that only sleeps, for the queue and broker tests: workers load it with ``-I tests.e2e.slow_task``.
Nothing routes it: a test sends it to the queue it wants occupied. It holds no database connection."""

from __future__ import annotations

import time

from celery import shared_task

SLEEP_TASK = "tests.sleep"


@shared_task(name=SLEEP_TASK, ignore_result=True, acks_late=True)
def sleep_s(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
