"""Researcher-side job operations (design §1 jobs; "identity is the mechanism": usage is charged to the group)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from portal.core import outbox, permissions
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.models import Job, PriorityClass, ResearchGroup
from portal.core.services._validate import fail, integer, number, text
from portal.core.services.audit import audit

MAX_GPUS_PER_JOB = 16  # a gang job is moved whole and must fit one node (design §1)
MAX_CKPT_BYTES = 10 * 2**40  # 10 TiB; the paper's largest checkpoint was 48 GB
MAX_RUNTIME_S = 365 * 24 * 3600.0


def submit_job(
    actor: Any,
    *,
    group: ResearchGroup,
    name: str,
    gpu_count: int,
    expected_runtime_s: float,
    ckpt_bytes_estimate: int,
    command: str = "",
    image: str = "",
    vram_gb_per_gpu: float = 0.0,
    min_capability: Decimal | float | str = 0,
    framework: str = "",
    loss_budget_s: float | None = None,
    restart_s: float = 30.0,
    priority_class: str = PriorityClass.STANDARD,
) -> Job:
    """Queue a job charged to ``group`` (the actor must belong to it, or be an admin)."""
    if actor is not None and not permissions.can_submit_to_group(actor, group):
        raise PermissionDenied("You may only submit jobs for a research group you belong to.")
    name = text("name", name, max_length=120, required=True)
    command = text("command", command, max_length=2000)
    image = text("image", image, max_length=300)
    if not command and not image:
        fail("command", "Give a command or a container image.")
    gpu_count = integer("gpu_count", gpu_count, minimum=1, maximum=MAX_GPUS_PER_JOB)
    vram = number("vram_gb_per_gpu", vram_gb_per_gpu, minimum=0, maximum=1024)
    try:
        capability = Decimal(str(min_capability)).quantize(Decimal("0.1"))
    except (InvalidOperation, ValueError):
        fail("min_capability", "A number like 8.0 is required.")
    if not Decimal("0") <= capability <= Decimal("99.9"):
        fail("min_capability", "Must be between 0 and 99.9.")
    framework = text("framework", framework, max_length=64)
    runtime = number("expected_runtime_s", expected_runtime_s, minimum=1, maximum=MAX_RUNTIME_S)
    ckpt = integer("ckpt_bytes_estimate", ckpt_bytes_estimate, minimum=1, maximum=MAX_CKPT_BYTES)
    budget = None if loss_budget_s is None else number("loss_budget_s", loss_budget_s, minimum=1,
                                                       maximum=MAX_RUNTIME_S)
    restart = number("restart_s", restart_s, minimum=0, maximum=24 * 3600.0)
    if priority_class not in PriorityClass.values:
        fail("priority_class", f"Choose one of {', '.join(PriorityClass.values)}.")
    owner = actor if actor is not None else None
    if owner is None:
        fail("owner", "A job needs an owner.")
    with transaction.atomic():
        job = Job.objects.create(
            name=name, owner=owner, group=group, command=command, image=image, gpu_count=gpu_count,
            vram_gb_per_gpu=vram, min_capability=capability, framework=framework, expected_runtime_s=runtime,
            ckpt_bytes_estimate=ckpt, loss_budget_s=budget, restart_s=restart, priority_class=priority_class,
        )
        audit(actor, "job.submit", job, group=group.slug, gpus=gpu_count)
        outbox.enqueue(outbox.Task.PLACE_JOB, job.pk)
    return job


def cancel_job(job: Job, actor: Any) -> Job:
    """Cancel ``job``: lifecycle cancel, close its open placement, then tell the control plane to stop it.

    1. Check the actor belongs to the job's group (or is an admin).
    2. Lock the job row, move it to ``cancelled`` (``InvalidTransition`` if it already finished).
    3. Close the open placement with ``end_reason="cancelled"`` (the node to stop it on).
    4. Queue ``control.stop_cancelled_job`` in the same transaction (the outbox).
    """
    if actor is not None and not permissions.can_cancel_job(actor, job):
        raise PermissionDenied("Only members of the job's research group (or an admin) may cancel it.")
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        job_lifecycle.cancel(job)
        job.placements.filter(ended_at__isnull=True).update(ended_at=timezone.now(), end_reason="cancelled")
        audit(actor, "job.cancel", job)
        outbox.enqueue(outbox.Task.STOP_CANCELLED_JOB, job.pk)
    return job
