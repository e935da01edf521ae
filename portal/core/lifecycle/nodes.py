"""The node lifecycle (design §1): a lent node can be taken back at any moment.

```
registered ──agent connects──▶ online ⇄ offline (heartbeat lost / back)
online ──scheduled reclaim──▶ draining ──drained or deadline──▶ reclaimed
online | draining | offline ──emergency reclaim or kill-switch──▶ reclaimed
reclaimed ──provider lends again──▶ offline (until its agent says hello) ──▶ online
any ──▶ retired
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.utils import timezone

from portal.core.lifecycle.base import InvalidTransition, apply_transition
from portal.core.states import NODE_ALLOWED, NODE_LENDABLE, NodeState

if TYPE_CHECKING:
    from portal.core.models import Node


# The states and their table live in portal.core.states (no model import, so the models can take them);
# these names are the lifecycle's public ones.
ALLOWED = NODE_ALLOWED
LENDABLE = NODE_LENDABLE


def _move(node: Node, target: str, **extra: Any) -> None:
    """Apply the transition and record it, with its time, for the hazard estimator's exposure."""
    apply_transition("node", ALLOWED, node, target, extra)
    node.availability.create(at=timezone.now(), state=target,  # NodeAvailability, by its reverse relation
                             lent=target in LENDABLE and not node.killswitch_engaged)


def come_online(node: Node) -> None:
    """Its agent connected (or a heartbeat came back)."""
    _move(node, NodeState.ONLINE)


def go_offline(node: Node) -> None:
    """Heartbeat lost for longer than the timeout."""
    _move(node, NodeState.OFFLINE)


def start_draining(node: Node) -> None:
    """A scheduled reclaim: warn → drain → force (design §1)."""
    _move(node, NodeState.DRAINING)


def reclaim(node: Node, *, killswitch: bool = False) -> None:
    """The provider has the node back (drained, deadline reached, emergency or kill-switch).

    ``killswitch=True`` also engages ``Node.killswitch_engaged`` in the same conditional UPDATE.
    """
    if killswitch:
        _move(node, NodeState.RECLAIMED, killswitch_engaged=True)
    else:
        _move(node, NodeState.RECLAIMED)


def lend_again(node: Node) -> None:
    """The provider lends the node again; it is offline until its agent says hello.

    Only a reclaimed node can be lent again (the table alone would also let an online node "go offline" here).
    """
    if node.state != NodeState.RECLAIMED:
        raise InvalidTransition("node", node.state, NodeState.OFFLINE)
    _move(node, NodeState.OFFLINE, killswitch_engaged=False)


def retire(node: Node) -> None:
    _move(node, NodeState.RETIRED)


def can(node: Node, target: str) -> bool:
    return target in ALLOWED.get(node.state, frozenset())
