"""Celery tasks of the notify app, all on the ``notifications`` queue (settings.CELERY_TASK_ROUTES; design §12).
JSON arguments; each body is idempotent (deliveries are unique per notice and target, attempts are claimed)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from portal.notify import dispatch


@shared_task(name="notify.fan_out", ignore_result=True, acks_late=True)
def fan_out(payload: dict[str, Any]) -> int:
    """Who receives a notice by which channel: write its deliveries and queue them."""
    return dispatch.fan_out(payload)


@shared_task(name="notify.deliver", ignore_result=True, acks_late=True)
def deliver(delivery_id: int, attempt: int) -> None:
    """Start one attempt of a delivery in the background (bounded by its timeout; retried with backoff)."""
    dispatch.deliver(delivery_id, attempt)


@shared_task(name="notify.send_digests", ignore_result=True, acks_late=True)
def send_digests() -> int:
    """Beat: one digest mail per user with events waiting for it."""
    return dispatch.send_digests()


@shared_task(name="notify.watch", ignore_result=True, acks_late=True)
def watch() -> dict[str, int]:
    """Beat: loss budgets turning at risk, attempts lost with their process."""
    return dispatch.watch()
