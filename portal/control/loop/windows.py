"""A lending window's end moves jobs off with notice (design §9.13).

Every control tick (``portal.control.loop.ticks.control_tick``, beat-driven every control period) looks for
online nodes running jobs whose open lending-window stretch ends within the window notice
(``RECLAIMNET["WINDOW_NOTICE_S"]``, default 10 min: ``portal.core.campus.window_notice_s``) — or has already ended — and, once per
stretch, records a reclaim of kind ``window`` ("lending window ends") whose deadline is the window's end, and
queues its plan through the outbox, in one transaction. From there it is the scheduled-reclaim path
(``portal.control.reclaim.apply``: plan with τ = the time left, final checkpoints, migrations, release or force at
the deadline), except that the node is never reclaimed nor kill-switched: it stays online, the campus read model
keeps it out of placement until the deadline and then while it is outside every window, and it takes work again
when its next window opens, with no "Lend again".

Re-driven, idempotent: a tick that died before committing left nothing and the next tick does it again; a
committed reclaim whose task was lost is re-queued by the reconciler (design §9.6); a node with a window reclaim
whose deadline has not passed (or that is still unfinished) gets no second one.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from portal.core import campus as campus_model
from portal.core import outbox
from portal.core.lifecycle.jobs import JobState
from portal.core.lifecycle.nodes import NodeState
from portal.core.models import Node, Placement, ReclaimEvent, ReclaimKind
from portal.core.outbox import Task
from scheduler import windows as lending

log = logging.getLogger(__name__)

WINDOW_REASON = "lending window ends"
window_notice_s = campus_model.window_notice_s  # one notice for placement (the read model) and the drain


def windows_closing(now: dt.datetime, notice_s: float) -> dict[int, float]:
    """Node pk → seconds until its lending window ends, for nodes with windows whose open stretch ends within
    ``notice_s`` (0: outside every window now). One statement."""
    windows, _ = campus_model.lending_windows(now)
    weekday, minute = lending.local_clock(timezone.localtime(now))
    due = {}
    for pk, ws in windows.items():
        left = lending.closes_in_s(ws, weekday, minute)
        if left is not None and left <= notice_s:
            due[pk] = left
    return due


def _pending(node_pks: Any, now: dt.datetime) -> set[int]:
    """Nodes whose window end is already being drained (a window reclaim unfinished, or whose deadline is ahead)."""
    return set(ReclaimEvent.objects.filter(node_id__in=list(node_pks), kind=ReclaimKind.WINDOW)
               .filter(Q(finished_at__isnull=True) | Q(deadline_at__gt=now)).values_list("node_id", flat=True))


def start_window_ends(now: dt.datetime | None = None) -> list[int]:
    """Record and queue a window reclaim for every online node running jobs whose window ends within the notice
    (at once when less remains or it has ended); returns the new reclaims' pks. Idempotent."""
    now = now or timezone.now()
    due = windows_closing(now, window_notice_s())
    if not due:
        return []
    busy = set(Placement.objects.filter(ended_at__isnull=True, node_id__in=list(due), node__state=NodeState.ONLINE,
                                        job__state=JobState.RUNNING).values_list("node_id", flat=True))
    started = []
    for pk in sorted(busy - _pending(busy, now)):
        try:
            reclaim_pk = _start(pk, due[pk], now)
        except Exception:  # this node's step is redone by the next tick; the other nodes and the tick go on
            log.exception("node %s: the window-end step failed; the next tick does it again", pk)
            continue
        if reclaim_pk is not None:
            started.append(reclaim_pk)
    return started


def _start(node_pk: int, left_s: float, now: dt.datetime) -> int | None:
    """One node's window-end reclaim and its queued plan, in one transaction (all or nothing)."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_pk)
        if node.state != NodeState.ONLINE or _pending([node_pk], now):
            return None
        reclaim = ReclaimEvent.objects.create(node=node, kind=ReclaimKind.WINDOW, notice_s=left_s,
                                              deadline_at=now + dt.timedelta(seconds=left_s),
                                              outcome_detail=WINDOW_REASON)
        outbox.enqueue(Task.RUN_RECLAIM, reclaim.pk)
    log.info("node %s: %s in %.0f s, its jobs move off", node.name, WINDOW_REASON, left_s)
    return reclaim.pk
