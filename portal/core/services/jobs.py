"""Researcher-side job operations (design §1 "Who may do what": usage is charged to the group)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Min
from django.utils import timezone

from portal.core import outbox, permissions
from portal.core.lifecycle import jobs as job_lifecycle
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Gpu, Job, PriorityClass, ResearchGroup
from portal.core.models.jobs import (
    MAX_JOB_CPU_CORES,
    MAX_JOB_MEMORY_BYTES,
    MIN_JOB_MEMORY_BYTES,
    LossBudgetMode,
)
from portal.core.services._validate import fail, integer, number, text
from portal.core.services.audit import audit
from portal.core.services.results import clean_output_dir
from portal.core.snapshots import shared

MAX_GPUS_PER_JOB = 16  # a gang job is moved whole and must fit one node (design §1)
MAX_CKPT_BYTES = 10 * 2**40  # 10 TiB; the paper's largest checkpoint was 48 GB
MAX_RUNTIME_S = 365 * 24 * 3600.0

# Submit rules another app owns, each called with the cleaned values (``priority_class``, ``gpu_count``, ``group``)
# and answering {field: message} to refuse (empty: fine). The control app registers the ladder's per-class GPU
# limit when it is ready (design §15.1), so every caller of :func:`submit_job` is held to it and core services
# import no control module (design §9.3).
SUBMIT_RULES: list[Callable[[Mapping[str, Any]], dict[str, str]]] = []


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
    loss_budget_mode: str = "expected",
    restart_s: float = 30.0,
    priority_class: str = PriorityClass.STANDARD,
    output_dir: str = "",
    upload_with_checkpoints: bool = False,
    memory_bytes: int | None = None,
    cpu_cores: float | None = None,
) -> Job:
    """Queue a job charged to ``group`` (the actor must belong to it, or be an admin)."""
    if actor is not None and not permissions.can_submit_to_group(actor, group):
        raise PermissionDenied("You may only submit jobs for a research group you belong to.")
    name = text("name", name, max_length=120, required=True)
    command = text("command", command, max_length=2000)
    image = text("image", image, max_length=300)
    if not command and not image:
        fail("command", "Give a command or a container image.")
    if command and image:
        fail("image", "Give a command or a container image, not both: the job would run only the command. "
                      "Clear one of the two.")
    if image:
        fail("image", "This campus's node agents run commands, not container images: give the command that starts "
                      "your training instead (it may start your container itself, e.g. "
                      "`apptainer exec IMAGE python train.py`).")
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
    if loss_budget_mode not in LossBudgetMode.values:  # design §2 "Loss budget modes"
        fail("loss_budget_mode", f"Choose one of {', '.join(LossBudgetMode.values)}.")
    if loss_budget_mode == LossBudgetMode.BOUND and budget is None:
        fail("loss_budget_s", "A bound loss budget needs the budget: the most seconds an interruption may lose.")
    if priority_class not in PriorityClass.values:
        fail("priority_class", f"Choose one of {', '.join(PriorityClass.values)}.")
    # The ladder's rules and what no node of the campus could ever run, together: every refused field named at
    # once, with each reason that applies to it (the class's limit first, then the campus's).
    errors: dict[str, list[str]] = {}
    for rule in SUBMIT_RULES:
        for field, message in rule({"priority_class": priority_class, "gpu_count": gpu_count, "group": group}).items():
            errors.setdefault(field, []).append(message)
    for field, message in campus_misfit(gpu_count, vram, capability).items():
        errors.setdefault(field, []).append(message)
    if errors:
        raise ValidationError(errors)
    output_dir = clean_output_dir(output_dir)  # design §14: relative, inside the job's working directory
    if not isinstance(upload_with_checkpoints, bool):
        fail("upload_with_checkpoints", "true or false is required.")
    # design §19.2: the job's own cgroup limits (None: the node's per-GPU default)
    memory = None if memory_bytes is None else integer("memory_bytes", memory_bytes)
    if memory is not None and not MIN_JOB_MEMORY_BYTES <= memory <= MAX_JOB_MEMORY_BYTES:
        fail("memory_bytes", f"Must be between 256 MiB ({MIN_JOB_MEMORY_BYTES} bytes) and 16 TiB "
                             f"({MAX_JOB_MEMORY_BYTES} bytes).")
    cores = None if cpu_cores is None else number("cpu_cores", cpu_cores, minimum=0, exclusive_minimum=True,
                                                  maximum=MAX_JOB_CPU_CORES)
    owner = actor if actor is not None else None
    if owner is None:
        fail("owner", "A job needs an owner.")
    # No savepoint inside a caller's transaction (the API's idempotency key, an array): nothing here is retried
    # on its own, an error fails the whole submit (two statements fewer per submit, design §10).
    with transaction.atomic(savepoint=False):
        job = Job.objects.create(
            name=name, owner=owner, group=group, command=command, image=image, gpu_count=gpu_count,
            vram_gb_per_gpu=vram, min_capability=capability, framework=framework, expected_runtime_s=runtime,
            ckpt_bytes_estimate=ckpt, loss_budget_s=budget, restart_s=restart, priority_class=priority_class,
            loss_budget_mode=loss_budget_mode,
            output_dir=output_dir, upload_with_checkpoints=upload_with_checkpoints,
            memory_bytes=memory, cpu_cores=cores,
        )
        audit(actor, "job.submit", job, group=group.slug, gpus=gpu_count)
        outbox.enqueue(outbox.Task.PLACE_JOB, job.pk)
    return job


def campus_hardware() -> list[tuple[int, float, Decimal]]:
    """(GPUs, smallest VRAM in GB, smallest compute capability) of every registered node that is not retired and
    has GPUs — its hardware as the campus read model sees it (``portal.core.campus.load``)."""
    rows = (Gpu.objects.exclude(node__state=NodeState.RETIRED).order_by().values("node_id")
            .annotate(n=Count("pk"), vram=Min("vram_gb"), cc=Min("compute_capability"))
            .values_list("n", "vram", "cc"))
    return [(int(n), float(vram), Decimal(str(cc)).quantize(Decimal("0.1"))) for n, vram, cc in rows]


def campus_limits(nodes: list[tuple[int, float, Decimal]]) -> tuple[int, float, Decimal]:
    """The most GPUs on one node, the largest VRAM and the highest compute capability of ``nodes``."""
    return max(n for n, _, _ in nodes), max(v for _, v, _ in nodes), max(cc for _, _, cc in nodes)


def campus_misfit(gpu_count: int, vram_gb_per_gpu: float, min_capability: Decimal) -> dict[str, str]:
    """Why no node of the campus could ever run this request, by field (design §3 feasibility); empty when one
    could — now or once it is lent, whatever is free now — or when no node is registered yet.

    Every registered node counts (retired ones do not), with its hardware as the campus read model sees it
    (``portal.core.campus.load``): its number of GPUs, the smallest VRAM and compute capability among them.
    A request that fits is accepted on the deployment's shared hardware snapshot (``portal.core.snapshots``;
    design §10 "CPU per request": a burst of submits reads it once); a refusal, and an empty snapshot (no node
    yet when it was taken), are confirmed on the database itself, so a node registered a moment ago is never
    missed."""
    snapshot = shared("campus-hardware", campus_hardware)
    errors = _misfit(snapshot, gpu_count, vram_gb_per_gpu, min_capability)
    if errors or not snapshot:
        return _misfit(campus_hardware(), gpu_count, vram_gb_per_gpu, min_capability)
    return errors


def _misfit(nodes: list[tuple[int, float, Decimal]], gpu_count: int, vram_gb_per_gpu: float,
            min_capability: Decimal) -> dict[str, str]:
    """:func:`campus_misfit` on the hardware ``nodes`` (:func:`campus_hardware`)."""
    if not nodes:
        return {}
    most_gpus, most_vram, best_cc = campus_limits(nodes)
    errors: dict[str, str] = {}
    if gpu_count > most_gpus:
        errors["gpu_count"] = f"No node on this campus has {gpu_count} GPUs; the largest has {most_gpus}."
    if vram_gb_per_gpu > most_vram:
        errors["vram_gb_per_gpu"] = (f"No GPU on this campus has {vram_gb_per_gpu:g} GB of memory; the largest "
                                     f"has {most_vram:g} GB.")
    if min_capability > best_cc:
        errors["min_capability"] = (f"No GPU on this campus has compute capability {min_capability} or higher; "
                                    f"the highest is {best_cc}.")
    if errors:
        return errors
    fitting = [n for n, v, cc in nodes if v >= vram_gb_per_gpu and cc >= min_capability]
    if not fitting:
        errors["vram_gb_per_gpu"] = (f"No node on this campus has GPUs with both {vram_gb_per_gpu:g} GB of memory "
                                     f"and compute capability {min_capability}; lower one of the two.")
    elif max(fitting) < gpu_count:
        wanted = " and ".join(part for part in (
            f"at least {vram_gb_per_gpu:g} GB" if vram_gb_per_gpu > 0 else "",
            f"compute capability {min_capability} or higher" if min_capability > 0 else "") if part)
        errors["gpu_count"] = (f"No node on this campus has {gpu_count} GPUs with {wanted}; the most on one "
                               f"node is {max(fitting)}.")
    return errors


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
