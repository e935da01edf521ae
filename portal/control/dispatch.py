"""Hooks the core services call (after commit) to hand work to the control plane.

The control plane (Celery tasks in ``portal.control.tasks``) replaces these bodies; the signatures are the
contract between ``portal.core.services`` and the control plane.
"""

from __future__ import annotations


def on_job_submitted(job_id: int) -> None:
    """A job entered the queue: try to place it."""


def on_job_cancelled(job_id: int) -> None:
    """A job was cancelled: stop it on its node and release its GPUs."""


def on_reclaim_requested(reclaim_id: int) -> None:
    """A provider pressed reclaim (scheduled, emergency or kill-switch): run the reclaim workflow."""


def on_node_lent_again(node_id: int) -> None:
    """A reclaimed node is lent again."""
