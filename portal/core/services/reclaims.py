"""Reclaim: the provider takes its node back (design §1; warn → drain → force, provider always wins).

A reclaim is never priority preemption: the event records which kind it was and who asked.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from portal.core import outbox, permissions
from portal.core.lifecycle import nodes as node_lifecycle
from portal.core.lifecycle.base import InvalidTransition
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Node, ReclaimEvent, ReclaimKind
from portal.core.services._validate import number
from portal.core.services.audit import audit

MAX_NOTICE_S = 7 * 24 * 3600.0  # a week: anything longer is not a reclaim but a lending window


def request_reclaim(node: Node, actor: Any, notice_s: float, *, killswitch: bool = False,
                    reason: str = "") -> ReclaimEvent:
    """Take ``node`` back with ``notice_s`` seconds of notice (design §1 reclaim kinds).

    1. Validate ``notice_s`` (finite, 0 ≤ notice ≤ a week) and the actor's right to reclaim this node.
    2. Lock the node row; choose the kind: kill-switch, emergency (notice 0) or scheduled (notice > 0).
    3. Move the node through its lifecycle: scheduled on an online node → draining (the control plane drains
       and forces at the deadline); anything else → reclaimed at once. A kill-switch also sets
       ``killswitch_engaged``, and on an already reclaimed node only sets that flag.
    4. Create the ReclaimEvent (deadline = now + notice) and the audit row.
    5. Queue ``control.run_reclaim`` in the same transaction (the outbox hands it over after commit).
    ``reason`` says why when it is not a person's click (``"owner use"``: design §1 "Owner activity and MIG").
    Refused transitions raise ``InvalidTransition`` and change nothing.
    """
    notice_s = number("notice_s", notice_s, minimum=0.0, maximum=MAX_NOTICE_S)
    if killswitch:
        notice_s = 0.0
    if actor is not None and not permissions.can_manage_node(actor, node):
        raise PermissionDenied("Only members of the node's provider lab (or an admin) may reclaim it.")
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        if killswitch:
            kind = ReclaimKind.KILLSWITCH
        elif notice_s == 0:
            kind = ReclaimKind.EMERGENCY
        else:
            kind = ReclaimKind.SCHEDULED
        if kind == ReclaimKind.SCHEDULED and node.state == NodeState.ONLINE:
            node_lifecycle.start_draining(node)
        elif killswitch and node.state == NodeState.RECLAIMED:
            Node.objects.filter(pk=node.pk).update(killswitch_engaged=True)
            node.killswitch_engaged = True
        elif node.state in (NodeState.RECLAIMED, NodeState.RETIRED) or (
            kind == ReclaimKind.SCHEDULED and node.state == NodeState.DRAINING
        ):
            raise InvalidTransition("node", node.state, NodeState.RECLAIMED if kind != ReclaimKind.SCHEDULED
                                    else NodeState.DRAINING)
        else:
            node_lifecycle.reclaim(node, killswitch=killswitch)
        now = timezone.now()
        event = ReclaimEvent.objects.create(
            node=node,
            requested_by=actor if actor is not None and actor.is_authenticated else None,
            kind=kind,
            notice_s=notice_s,
            deadline_at=now + dt.timedelta(seconds=notice_s),
            reason=str(reason)[:64],
        )
        audit(actor, f"node.reclaim.{kind}", node, reclaim=event.pk, notice_s=notice_s,
              **({"reason": str(reason)[:64]} if reason else {}))
        outbox.enqueue(outbox.Task.RUN_RECLAIM, event.pk)
    return event


def emergency_reclaim(node: Node, actor: Any) -> ReclaimEvent:
    """τ = 0: the node is the provider's again now; jobs resume from their freshest pre-synced checkpoint."""
    return request_reclaim(node, actor, 0.0)


def engage_killswitch(node: Node, actor: Any) -> ReclaimEvent:
    """The node stops taking new work at once (the agent's BPF flag drops new SYNs, design §4)."""
    return request_reclaim(node, actor, 0.0, killswitch=True)
