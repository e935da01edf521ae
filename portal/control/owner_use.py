"""Owner activity on lent GPUs (design §1 "Owner activity and MIG", HTCondor's owner-activity idea).

Each hello and heartbeat may carry ``gpu_state`` (:mod:`portal.control.link.gpu_state`): per GPU its MIG layout and
the processes on it that are none of the agent's jobs'. The portal keeps the newest on the node's :class:`Gpu`
rows (shown on the provider's node page and the admin dashboard) and decides whether the lab is using a GPU it
lent:

* a foreign process on a GPU a borrowed job holds is owner use;
* foreign processes on GPUs no borrowed job holds are owner use only on more GPUs than the node's floor (the
  provider keeps ``gpu_floor`` GPUs of its choice).

Seen in ``OWNER_USE_HEARTBEATS`` heartbeats in a row on a lent node, the node's ``owner_use_policy`` applies once
for that episode (the streak has to fall back to 0, a heartbeat without owner use, before it can apply again):
``ignore`` nothing, ``notify`` the ``node.owner_using_gpu`` event to the provider, ``reclaim`` that event and a
reclaim through :func:`portal.core.services.reclaims.request_reclaim` with the normal notice, reason "owner use".

Recording costs a fixed number of statements per heartbeat batch whatever the number of nodes (design §9.10):
none when no heartbeat carries ``gpu_state``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Case, IntegerField, Value, When

from portal.control.config import rn
from portal.control.link.gpu_state import GpuState, GpuStateError, check_gpu_state
from portal.core import events
from portal.core.lifecycle import InvalidTransition
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Gpu, Node, Placement
from portal.core.models.nodes import OwnerUsePolicy
from portal.core.services.reclaims import request_reclaim

log = logging.getLogger(__name__)

REASON = "owner use"
STATE_FIELDS = ("mig_mode", "mig_instances", "foreign_process_count", "foreign_memory_bytes", "foreign_pids")


def _fields(item: GpuState) -> dict[str, Any]:
    foreign = item["foreign_processes"]
    return {"mig_mode": item["mig_mode"], "mig_instances": item["mig_instances"],
            "foreign_process_count": foreign["count"], "foreign_memory_bytes": foreign["memory_bytes"],
            "foreign_pids": foreign["pids"]}


def _parsed(items: Any) -> list[GpuState] | None:
    try:
        return check_gpu_state("gpu_state", items)
    except GpuStateError:  # validated by the protocol already; a handler must not fail on it regardless
        return None


def store_gpu_state(reports: dict[int, tuple[list[GpuState], dt.datetime]]) -> int:
    """Write each node's newest per-GPU state on its GPU rows (only the rows whose state changed; ``activity_at``
    is when it last changed). Two statements at most. Returns the rows written."""
    if not reports:
        return 0
    changed = []
    for gpu in Gpu.objects.filter(node_id__in=list(reports)).only("pk", "node_id", "index", *STATE_FIELDS):
        items, at = reports[gpu.node_id]
        item = next((i for i in items if i["index"] == gpu.index), None)
        if item is None:
            continue
        fields = _fields(item)
        if any(getattr(gpu, k) != v for k, v in fields.items()):
            for k, v in fields.items():
                setattr(gpu, k, v)
            gpu.activity_at = at
            changed.append(gpu)
    if changed:
        Gpu.objects.bulk_update(changed, [*STATE_FIELDS, "activity_at"])
    return len(changed)


def owner_use_gpus(items: Iterable[GpuState], held: set[int], gpu_floor: int) -> list[GpuState]:
    """The GPUs of one report the lab is using although they are lent: foreign processes on a GPU a borrowed job
    holds, and on the GPUs no borrowed job holds when they are more than the provider's floor."""
    foreign = [i for i in items if i["foreign_processes"]["count"] > 0]
    on_ours = [i for i in foreign if i["index"] in held]
    elsewhere = [i for i in foreign if i["index"] not in held]
    return sorted(on_ours + (elsewhere if len(elsewhere) > gpu_floor else []), key=lambda i: i["index"])


def observe_gpu_state(beats: Iterable[tuple[int, Any, dt.datetime]]) -> dict[int, str]:
    """Called by the heartbeat batch (inside its transaction) with (node id, ``gpu_state`` or None, received at)
    of each node's newest heartbeat: store the state, count each lent node's owner-use streak and apply its
    policy when the streak reaches ``OWNER_USE_HEARTBEATS``. Returns {node id: action taken} ("notify",
    "reclaim", "reclaim refused")."""
    reports = {}
    for node_id, items, at in beats:
        parsed = _parsed(items) if items is not None else None
        if parsed is not None:
            reports[node_id] = (parsed, at)
    if not reports:
        return {}
    store_gpu_state(reports)
    nodes = {pk: rest for pk, *rest in Node.objects.filter(pk__in=list(reports)).values_list(
        "pk", "owner_use_policy", "owner_use_streak", "gpu_floor", "state", "killswitch_engaged")}
    held: dict[int, set[int]] = defaultdict(set)
    for node_id, indices in Placement.objects.filter(node_id__in=list(nodes), ended_at__isnull=True).values_list(
            "node_id", "gpu_indices"):
        held[node_id].update(int(i) for i in indices or ())
    threshold = max(1, int(rn("OWNER_USE_HEARTBEATS")))
    streaks: dict[int, int] = {}
    due: dict[int, tuple[str, list[GpuState]]] = {}
    for node_id, (policy, streak, floor, state, killswitch) in nodes.items():
        lent = state == NodeState.ONLINE and not killswitch
        using = owner_use_gpus(reports[node_id][0], held[node_id], floor) if lent else []
        new = streak + 1 if using and policy != OwnerUsePolicy.IGNORE else 0
        if new != streak:
            streaks[node_id] = min(new, 2**31 - 1)
        if new == threshold:
            due[node_id] = (policy, using)
    if streaks:
        Node.objects.filter(pk__in=list(streaks)).update(owner_use_streak=Case(
            *[When(pk=pk, then=Value(s)) for pk, s in streaks.items()], output_field=IntegerField()))
    return {node_id: _apply(node_id, policy, using, held[node_id]) for node_id, (policy, using) in due.items()}


def _apply(node_id: int, policy: str, using: list[GpuState], held: set[int]) -> str:
    """The node's policy, once for this episode: the provider's event, and for ``reclaim`` the reclaim."""
    gpus = [{"index": i["index"], "processes": i["foreign_processes"]["count"],
             "memory_bytes": i["foreign_processes"]["memory_bytes"], "borrowed": i["index"] in held}
            for i in using]
    events.emit("node.owner_using_gpu", node=node_id, gpus=gpus, action=policy)
    if policy != OwnerUsePolicy.RECLAIM:
        return "notify"

    try:
        with transaction.atomic():  # a savepoint: a refused reclaim leaves the heartbeat batch whole
            request_reclaim(Node.objects.get(pk=node_id), None, float(rn("OWNER_USE_NOTICE_S")), reason=REASON)
    except (InvalidTransition, ValidationError, PermissionDenied) as exc:
        log.info("node %s: owner use seen, reclaim refused: %s", node_id, exc)
        return "reclaim refused"
    log.info("node %s: owner use on GPU(s) %s, reclaim started", node_id, [g["index"] for g in gpus])
    return "reclaim"


def hello_gpu_state(node_id: int, items: Any, at: dt.datetime) -> None:
    """A hello's ``gpu_state``: stored on the GPU rows (no streak: an agent that just connected is judged from
    its heartbeats)."""
    parsed = _parsed(items) if items is not None else None
    if parsed is not None:
        store_gpu_state({node_id: (parsed, at)})
