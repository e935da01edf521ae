"""Commands from the control plane to node agents, through the Channels group ``agent-<node id>`` (design §1-§4,
§9.9).

Every command is an :class:`~portal.control.models.AgentCommand` row written in the caller's transaction and
pushed after commit, so an agent never acts on a decision that was rolled back (and never reports back before
the rows it refers to are visible). The agent acknowledges each ``cmd_id``; until it does, the command is sent
again when the agent reconnects (:func:`pending_for`, right after the welcome, in the original order) and by the
reconciler (:func:`resend_due`) with backoff, until it expires. A command of a subject (its supersede key)
replaces the older unacked commands of that subject: they are never sent again, and the payload carries
``issued_us`` so the agent can refuse an older one that arrives late. The agent acks a duplicate again without
executing it twice.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from typing import Any

from django.db import transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from portal.control.link.publish import group_send_many
from portal.control.models import AgentCommand, AgentSession

log = logging.getLogger(__name__)

RESEND_AFTER_S = 3.0  # an unacked command is first sent again after this long
RESEND_MAX_S = 30.0  # the backoff doubles up to this
RESEND_BATCH = 500  # commands the reconciler re-sends in one pass
DEFAULT_TTL_S = 300.0
# How long an unacked command of each kind stays worth sending (the caller may give its own ``ttl_s``: a
# reclaim notice until its deadline). A start is worth sending while its placement may be open.
TTL_S: dict[str, float] = {
    "start_job": 30.0, "set_interval": 30.0, "set_rate": 30.0, "stop_job": 300.0, "checkpoint": 300.0,
    "killswitch": 600.0, "expect_checkpoint": 600.0, "send_checkpoint": 600.0, "drop_checkpoints": 600.0,
    "set_reserve": 86400.0,  # design §4: the day's reserve, until the next calibration supersedes it
}


def agent_group(node_id: int) -> str:
    """The one Channels group per node that its agent's consumer joins."""
    return f"agent-{node_id}"


def supersede_key_of(node_id: int, kind: str, fields: dict[str, Any]) -> str:
    """The subject a command sets; a newer command of the same key replaces an older unacked one ("" for none).

    The kill-switch state and the reclaim notice are a node's; a job's interval and its start are the job's
    wherever it is (a start elsewhere replaces a start that never arrived); a rate is its transfer's."""
    if kind in ("killswitch", "reclaim_notice", "set_reserve"):
        return f"{node_id}/{kind}"
    if kind in ("set_interval", "start_job") and "job_id" in fields:
        return f"{kind}:{fields['job_id']}"
    if kind == "set_rate" and "transfer_id" in fields:
        return f"set_rate:{fields['transfer_id']}"
    return ""


def _push(batch: list[tuple[int, dict[str, Any]]]) -> None:
    """Hand ``(node id, payload)`` pairs to the channel layer, in order; never raises (a lost push is re-sent)."""
    try:
        group_send_many([(agent_group(node_id), {"type": "agent.command", "payload": payload})
                         for node_id, payload in batch])
    except Exception:  # the row stays unacked: the reconciler and the agent's reconnect send it again
        log.warning("command to agents not delivered now: %s", [p.get("type") for _, p in batch], exc_info=True)


def send_many(orders: list[tuple[int, str, dict[str, Any]]], ttl_s: float | None = None) -> list[str]:
    """Record many commands ``(node id, kind, fields)`` and push them after commit; returns their ids.

    A fixed number of statements whatever the count: one UPDATE supersedes older unacked commands of the same
    subjects, one INSERT writes the rows (the tick sends ``set_interval`` to many agents at once)."""
    if not orders:
        return []
    now = timezone.now()
    issued_us = time.time_ns() // 1000
    rows, batch, ids, keys = [], [], [], []
    for node_id, kind, raw in orders:
        fields = dict(raw)
        cmd_id = fields.pop("cmd_id", None) or uuid.uuid4().hex
        key = supersede_key_of(node_id, kind, fields)[:96]
        payload = {"type": kind, "cmd_id": cmd_id, "sent_at": time.time(), **fields}
        if key:
            payload.update(supersede_key=key, issued_us=issued_us)
            keys.append(key)
        life_s = ttl_s if ttl_s is not None else TTL_S.get(kind, DEFAULT_TTL_S)
        rows.append(AgentCommand(node_id=node_id, cmd_id=cmd_id, kind=kind[:32], payload=payload,
                                 supersede_key=key, created_at=now, sent_at=now, attempts=1,
                                 next_send_at=now + dt.timedelta(seconds=RESEND_AFTER_S),
                                 expires_at=now + dt.timedelta(seconds=max(1.0, life_s))))
        batch.append((node_id, payload))
        ids.append(cmd_id)
    if keys:
        AgentCommand.objects.filter(supersede_key__in=set(keys), acked_at__isnull=True,
                                    superseded_at__isnull=True).update(superseded_at=now)
    AgentCommand.objects.bulk_create(rows)
    transaction.on_commit(lambda: _push(batch))
    return ids


def send(node_id: int, kind: str, *, ttl_s: float | None = None, **fields: Any) -> str:
    """Record command ``kind`` for node ``node_id``, pushed after commit; returns its ``cmd_id`` (the agent
    acks it). ``ttl_s``: how long it is re-sent unacked (default: by kind, :data:`TTL_S`)."""
    return send_many([(node_id, kind, fields)], ttl_s=ttl_s)[0]


def acknowledge(node_id: int, cmd_ids: list[str]) -> int:
    """The agent acknowledged ``cmd_ids``: they are never sent again (one UPDATE). Returns how many were
    pending; unknown ids and other nodes' ids change nothing."""
    return AgentCommand.objects.filter(node_id=node_id, cmd_id__in={c[:32] for c in cmd_ids},
                                       acked_at__isnull=True).update(acked_at=timezone.now())


def _unacked(now: dt.datetime) -> Any:
    return AgentCommand.objects.filter(acked_at__isnull=True, superseded_at__isnull=True, expires_at__gt=now)


def pending_for(node_id: int) -> list[dict[str, Any]]:
    """The node's unacked, live commands in their original order, counted as sent again (the consumer sends them
    right after the welcome of a new session)."""
    now = timezone.now()
    with transaction.atomic():
        rows = list(_unacked(now).filter(node_id=node_id).select_for_update(skip_locked=True)
                    .order_by("created_at", "id").values_list("pk", "payload")[:RESEND_BATCH])
        if rows:
            AgentCommand.objects.filter(pk__in=[pk for pk, _ in rows]).update(
                sent_at=now, attempts=F("attempts") + 1, next_send_at=now + dt.timedelta(seconds=RESEND_AFTER_S))
    return [payload for _, payload in rows]


def backoff_s(attempts: int) -> float:
    """Wait before the next re-send of a command already sent ``attempts`` times: 3 s doubling to 30 s."""
    return min(RESEND_MAX_S, RESEND_AFTER_S * 2.0 ** max(0, attempts - 1))


def resend_due(now: dt.datetime | None = None) -> int:
    """Re-send the commands still unacked past their next send time to nodes with a session open (the
    reconciler's pass); each waits longer before the next try. Returns how many were sent."""
    now = now or timezone.now()
    connected = AgentSession.objects.filter(node_id=OuterRef("node_id"), closed_at__isnull=True)
    with transaction.atomic():
        rows = list(_unacked(now).filter(next_send_at__lte=now).filter(Exists(connected))
                    .select_for_update(skip_locked=True, of=("self",)).order_by("created_at", "id")
                    .values_list("pk", "node_id", "payload", "attempts")[:RESEND_BATCH])
        by_attempts: dict[int, list[int]] = {}
        for pk, _node, _payload, attempts in rows:
            by_attempts.setdefault(attempts, []).append(pk)
        for attempts, pks in by_attempts.items():  # one UPDATE per backoff step (a handful)
            AgentCommand.objects.filter(pk__in=pks).update(
                sent_at=now, attempts=attempts + 1, next_send_at=now + dt.timedelta(seconds=backoff_s(attempts + 1)))
    if rows:
        log.info("re-sending %d unacknowledged command(s)", len(rows))
        _push([(node_id, payload) for _, node_id, payload, _ in rows])
    return len(rows)


def prune(now: dt.datetime | None = None, keep_s: float = 3600.0) -> int:
    """Delete commands acked, superseded or expired more than ``keep_s`` ago (the table stays bounded)."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(seconds=keep_s)
    removed, _ = (AgentCommand.objects.filter(acked_at__lt=cutoff)
                  | AgentCommand.objects.filter(superseded_at__lt=cutoff)
                  | AgentCommand.objects.filter(expires_at__lt=cutoff)).delete()
    return removed
