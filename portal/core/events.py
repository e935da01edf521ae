"""The events people see (docs/design.md §9.12): which exist, who gets them, and what they say.

The control plane publishes *internal* live events (``job.state``, ``checkpoint``, …; ids only) so that pages
re-fetch what changed. This module is the other kind: things a person cares about — their job was placed,
warned, moved, lost work, failed or finished; their node was given back, went silent or came back; a reclaim was
forced or a node lost — each with its audience and a sentence in plain words, by name ("Your job “bert-finetune”
moved to lab-a-03; 40 s of work lost.").

Every one of them goes through :func:`emit`, called from the place where the state change happens, inside its
transaction: the sentence is written from the rows as that transaction sees them, and the notice is delivered
only after commit (a rolled-back change tells nobody). Delivery today is the live websocket
(``portal.control.link.publish.publish_notice`` → ``portal.web.consumers.LiveConsumer``, which passes a notice
only to sockets of its audience); the portal's toasts render exactly these. Mail and webhooks (and each person's
choice of which events reach them) are further entries of :data:`DELIVERIES`, reading the same :data:`CATALOGUE`.

Audiences: ``researchers`` — the members of the job's research group (the owner reads "Your job", the others
"Job … of alice"); ``provider`` — the members of the node's lab; ``admins`` — campus admins.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.urls import reverse
from django.utils import timezone

from portal.control.link.publish import publish_notice
from portal.core.models import Job, Migration, Node, ReclaimEvent

log = logging.getLogger(__name__)

RESEARCHERS, PROVIDER, ADMINS = "researchers", "provider", "admins"


@dataclass
class Facts:
    """What an event is about, as the emitting transaction sees it. Models are loaded on first use."""

    job: Job | None = None
    node: Node | None = None
    reclaim: ReclaimEvent | None = None
    migration: Migration | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)


Render = Callable[[Facts, str], "str | None"]


@dataclass(frozen=True)
class EventType:
    """One entry of the catalogue: its name, who gets it, how loud it is, what it is (for a preferences page)
    and how it reads. ``render(facts, subject)`` returns the sentence, ``subject`` being how the recipient is
    addressed ("Your job “x”"), or None when these facts are not this event after all (nothing is sent)."""

    name: str
    audience: str
    level: str  # "info", "ok", "warning" or "bad"
    summary: str
    render: Render


@dataclass(frozen=True)
class Notice:
    """One emitted event, ready to deliver: ``text`` for the job's owner (or everyone when there is no owner),
    ``text_others`` for the rest of the audience; ``groups`` are the audience's live-update groups."""

    id: str
    name: str
    audience: str
    level: str
    text: str
    text_others: str
    groups: tuple[str, ...]
    owner_id: int | None
    url: str
    at: str

    def payload(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "audience": self.audience, "level": self.level,
                "text": self.text, "text_others": self.text_others, "groups": list(self.groups),
                "owner_id": self.owner_id, "url": self.url, "at": self.at}


# --- words ---------------------------------------------------------------------------------------------------

def duration(seconds: float) -> str:
    """40 s, 5 min 20 s, 2 h 5 min."""
    s = max(0.0, float(seconds))
    if 0 < s < 0.5:
        return "under 1 s"
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        minutes, rest = divmod(round(s), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(round(s / 60), 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def clock(when: datetime) -> str:
    """"14:05 UTC" in the portal's time zone."""
    return timezone.localtime(when).strftime("%H:%M %Z")


def count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


# Why a job had to leave without its final checkpoint, as a clause after "because" (Migration.degraded_reason
# and the reasons the reclaim planner gives).
LEFT_BECAUSE: dict[str, str] = {
    "emergency": "its lab took the node back without notice",
    "killswitch": "its lab stopped the node with the kill-switch",
    "heartbeat_lost": "the node stopped answering",
    "deadline": "the notice ran out before its final checkpoint was sent",
    "notice": "the notice was too short to send a final checkpoint",
    "cap": "its final checkpoint could not be sent fast enough",
    "capacity": "the network had no room to send its final checkpoint in time",
    "transfer failed": "copying its checkpoint to the new node failed",
    "agent restarted": "the node's agent restarted",
}


def _node_name(node: Node | None) -> str:
    return node.name if node is not None else "another node"


def _jobs_on(node: Node) -> int:
    return Job.objects.filter(placements__node=node, placements__ended_at__isnull=True,
                              state__in=["running", "migrating"]).distinct().count()


def _moved_off(reclaim: ReclaimEvent) -> tuple[int, float]:
    """Jobs that left ``reclaim``'s node and the work they lost in total."""
    rows = Migration.objects.filter(reclaim=reclaim)
    return rows.count(), float(rows.aggregate(s=Sum("work_lost_s"))["s"] or 0.0)


def _loss_words(moved: int, lost_s: float) -> str:
    if moved == 0:
        return "no job was running on it"
    if lost_s <= 0:
        return f"{count(moved, 'job', 'jobs')} moved off it with no work lost"
    return f"{count(moved, 'job', 'jobs')} moved off it; {duration(lost_s)} of work lost in total"


# --- the catalogue ---------------------------------------------------------------------------------------------

def _placed(f: Facts, subject: str) -> str:
    return f"{subject} was placed on {_node_name(f.node)} and is starting."


def _warned(f: Facts, subject: str) -> str | None:
    reclaim = f.reclaim
    if reclaim is None:
        return None
    dest = _model(Node, f.get("destination"))
    where = f"move to {dest.name}" if dest is not None else "move to another node"
    why = "its lending window ends" if reclaim.kind == "window" else "its lab is taking the node back"
    return (f"{subject} must leave {reclaim.node.name} by {clock(reclaim.deadline_at)}: {why}. It will "
            f"checkpoint and {where}; no work should be lost.")


def _moved(f: Facts, subject: str) -> str | None:
    mig = f.migration
    if mig is None:
        return None
    lost = "no work lost" if mig.work_lost_s <= 0 else f"{duration(mig.work_lost_s)} of work lost"
    return f"{subject} moved to {_node_name(mig.destination)}; {lost}."


def _lost_work(f: Facts, subject: str) -> str | None:
    mig = f.migration
    if mig is None:
        return None
    why = LEFT_BECAUSE.get(str(f.get("reason", "")), "its node left")
    if f.get("from_scratch"):
        return (f"{subject} had to leave {mig.source.name} because {why}. No checkpoint of it was copied off the "
                "node, so it restarts from the beginning.")
    if mig.work_lost_s <= 0:
        return (f"{subject} had to leave {mig.source.name} because {why}. It resumes from a checkpoint copied "
                "just before; no work lost.")
    return (f"{subject} lost {duration(mig.work_lost_s)} of work: it had to leave {mig.source.name} because "
            f"{why}. It resumes from its last copied checkpoint.")


def _failed(f: Facts, subject: str) -> str:
    code = f.get("returncode")
    how = f" (exit code {code})" if code is not None else ""
    return (f"{subject} failed on {_node_name(f.node)}{how}. Its output is on the job page; fix the cause and "
            "submit it again.")


def _finished(f: Facts, subject: str) -> str:
    job = f.job
    took = ""
    if job is not None and job.started_at is not None:
        took = f" after {duration((timezone.now() - job.started_at).total_seconds())}"
    return f"{subject} finished{took}. Its result is on the job page."


def _reclaim_done(f: Facts, subject: str) -> str | None:
    reclaim = f.reclaim
    if reclaim is None or reclaim.kind == "heartbeat_lost":  # a silent node is not back with its lab
        return None
    if reclaim.kind == "window":  # design §9.13: lent again when its next window opens
        return f"{subject} is yours again until its next lending window: {_loss_words(*_moved_off(reclaim))}."
    return f"{subject} is yours again: {_loss_words(*_moved_off(reclaim))}."


def _node_returned(f: Facts, subject: str) -> str:
    return f"{subject} is online and lent: its agent is connected."


def _agent_offline(f: Facts, subject: str) -> str | None:
    if f.node is None:
        return None
    timeout = duration(settings.RECLAIMNET["HEARTBEAT_TIMEOUT_S"])
    jobs = _jobs_on(f.node)
    resumed = f" Its {count(jobs, 'job resumes', 'jobs resume')} elsewhere." if jobs else ""
    return (f"{subject} went offline: its agent has not been heard from for {timeout}.{resumed} Check the "
            "machine and its network, then restart the agent; the node is lent again once it connects.")


def _reclaim_forced(f: Facts, subject: str) -> str | None:
    reclaim = f.reclaim
    if reclaim is None or reclaim.kind == "heartbeat_lost":  # that is "node.lost"
        return None
    how = {"killswitch": "with the kill-switch", "emergency": "without notice",
           "window": "at the end of its lending window, before every job had checkpointed"}.get(
        reclaim.kind, f"at the end of its {duration(reclaim.notice_s)} notice, before every job had checkpointed")
    lab = reclaim.node.provider.name
    return f"{lab} took {subject} back {how}: {_loss_words(*_moved_off(reclaim))}."


def _node_lost(f: Facts, subject: str) -> str | None:
    if f.node is None:
        return None
    jobs = _jobs_on(f.node)
    resumed = f"; {count(jobs, 'job', 'jobs')} on it resume from their copies" if jobs else "; no job was on it"
    timeout = duration(settings.RECLAIMNET["HEARTBEAT_TIMEOUT_S"])
    return f"{subject} was lost: no heartbeat for {timeout}{resumed}."


CATALOGUE: dict[str, EventType] = {e.name: e for e in (
    EventType("job.placed", RESEARCHERS, "info", "A job was given GPUs and is starting.", _placed),
    EventType("job.warned", RESEARCHERS, "warning",
              "A job's node is being taken back with notice: by when it leaves, and where to.", _warned),
    EventType("job.moved", RESEARCHERS, "info", "A job resumed on another node, and how much work it lost.",
              _moved),
    EventType("job.lost_work", RESEARCHERS, "bad",
              "A job had to leave its node without a final checkpoint.", _lost_work),
    EventType("job.failed", RESEARCHERS, "bad", "A job's program exited with an error.", _failed),
    EventType("job.finished", RESEARCHERS, "ok", "A job completed.", _finished),
    EventType("reclaim.done", PROVIDER, "ok", "A node you took back is free of borrowed jobs.", _reclaim_done),
    EventType("node.returned", PROVIDER, "ok", "A node's agent connected: the node is lent.", _node_returned),
    EventType("node.offline", PROVIDER, "warning", "A node's agent stopped answering.", _agent_offline),
    EventType("reclaim.forced", ADMINS, "warning",
              "A node was taken back without notice, or its notice ran out before every job had left.",
              _reclaim_forced),
    EventType("node.lost", ADMINS, "bad", "A lent node stopped answering.", _node_lost),
)}


# --- audience and delivery -------------------------------------------------------------------------------------

def _address(kind: EventType, f: Facts) -> tuple[tuple[str, ...], int | None, str, str, str]:
    """(groups, owner id, owner's subject, others' subject, page url) for this event's audience."""
    if kind.audience == RESEARCHERS:
        job = f.job
        assert job is not None, f"{kind.name} needs a job"
        owner = job.owner.get_username()
        return ((f"group-{job.group_id}",), job.owner_id, f"Your job “{job.name}”", f"Job “{job.name}” of {owner}",
                reverse("web:job-detail", args=[job.pk]))
    node = f.node or (f.reclaim.node if f.reclaim is not None else None)
    assert node is not None, f"{kind.name} needs a node"
    url = reverse("web:node-detail", args=[node.pk])
    if kind.audience == PROVIDER:
        subject = f"Your node {node.name}"
        return (f"provider-{node.provider_id}",), None, subject, subject, url
    if kind.name == "reclaim.forced":  # "Vision Lab took lab-a-03 back …"
        return ("dashboard",), None, node.name, node.name, url
    subject = f"{node.name} ({node.provider.name})"
    return ("dashboard",), None, subject, subject, url


def deliver_live(notice: Notice) -> None:
    """To the browsers of the audience (portal.web.consumers.LiveConsumer); never raises."""
    publish_notice(notice.groups, notice.payload())


# Each is called with every notice after its transaction committed; mail and webhook senders join this list.
DELIVERIES: list[Callable[[Notice], None]] = [deliver_live]


def _model(model: type, value: Any) -> Any:
    if value is None or isinstance(value, model):
        return value
    return model.objects.get(pk=value)


def emit(name: str, *, job: Job | int | None = None, node: Node | int | None = None,
         reclaim: ReclaimEvent | int | None = None, migration: Migration | int | None = None,
         **extra: Any) -> Notice | None:
    """Tell the audience of event ``name`` (a :data:`CATALOGUE` key) what happened; returns the notice, or None
    when these facts are not that event (e.g. a heartbeat loss is no reclaim given back).

    Call it inside the transaction that made the change: the sentence is written now from the rows as they
    stand, and the notice is delivered after commit. A migration is read again from the database (its work lost
    may have been corrected by an UPDATE in this transaction). Never raises: a notice is not worth failing a
    reclaim for."""
    kind = CATALOGUE[name]
    try:
        facts = Facts(job=_model(Job, job), node=_model(Node, node), reclaim=_model(ReclaimEvent, reclaim),
                      extra=extra)
        if migration is not None:
            pk = migration.pk if isinstance(migration, Migration) else migration
            facts.migration = Migration.objects.select_related("source", "destination").get(pk=pk)
        groups, owner_id, owner_subject, others_subject, url = _address(kind, facts)
        text = kind.render(facts, owner_subject)
        if text is None:
            return None
        others = text if others_subject == owner_subject else (kind.render(facts, others_subject) or text)
        notice = Notice(id=uuid.uuid4().hex, name=name, audience=kind.audience, level=kind.level, text=text,
                        text_others=others, groups=groups, owner_id=owner_id, url=url,
                        at=timezone.now().isoformat())
    except Exception:
        log.warning("event %s not emitted", name, exc_info=True)
        return None
    transaction.on_commit(lambda: _deliver(notice))
    return notice


def _deliver(notice: Notice) -> None:
    for deliver in DELIVERIES:
        try:
            deliver(notice)
        except Exception:
            log.warning("event %s not delivered by %s", notice.name, getattr(deliver, "__name__", deliver),
                        exc_info=True)
