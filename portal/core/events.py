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

import json
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
    # What it is about, as JSON-safe ids and names (mail and webhooks, design §12); not sent to browsers.
    facts: dict[str, Any] = field(default_factory=dict)

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
    # What the notice allows (design §12): the plan's expected loss and how long leaving takes (C/b + T_r).
    loss_s, leave_s = f.get("expected_loss_s"), f.get("leave_s")
    away = f", about {duration(leave_s)} to checkpoint, copy and restart" if leave_s else ""
    if loss_s:
        allows = f"expected loss {duration(loss_s)}{away}"
    else:
        allows = "no work should be lost" + (f" (expected loss 0 s{away})" if loss_s is not None else "")
    return (f"{subject} must leave {reclaim.node.name} by {clock(reclaim.deadline_at)}: {why}. It will "
            f"checkpoint and {where}; {allows}.")


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


def _dependency_cancelled(f: Facts, subject: str) -> str:
    parent = f"job {f.get('parent')} “{f.get('parent_name', '')}”"
    how = "failed" if f.get("parent_state") == "failed" else "was cancelled"
    return f"{subject} was cancelled: it was to run after {parent} completed, and that job {how}."


def _array_subject(f: Facts, subject: str) -> str:
    """"Your array “sweep” (50 tasks)" / "Array “sweep” (50 tasks) of alice" (the fair queue's arrays, §16.6)."""
    size = count(int(f.get("array_size") or 0), "task", "tasks")
    if subject.startswith("Your ") or f.job is None:
        return f"{'Your array' if subject.startswith('Your ') else 'Array'} “{f.get('array_name', '')}” ({size})"
    return f"Array “{f.get('array_name', '')}” ({size}) of {f.job.owner.get_username()}"


def _array_counts(counts: dict[str, int]) -> str:
    order = ("completed", "failed", "cancelled")
    parts = [f"{counts[s]} {s}" for s in order if counts.get(s)]
    parts += [f"{n} {s}" for s, n in sorted(counts.items()) if s not in order and n]
    return ", ".join(parts) or "no tasks"


def _array_dependency_cancelled(f: Facts, subject: str) -> str:
    how = "failed" if f.get("parent_state") == "failed" else "was cancelled"
    text = (f"{_array_subject(f, subject)}: {f.get('cancelled')} cancelled because job {f.get('parent')} "
            f"“{f.get('parent_name', '')}” {how}")
    if f.get("others"):
        text += f" (and {count(int(f.get('others')), 'other job', 'other jobs')} they needed did not complete)"
    ended = f.get("ended_counts")
    return text + (f". The array has ended: {_array_counts(ended)}." if ended else ".")


def _array_finished(f: Facts, subject: str) -> str:
    return f"{_array_subject(f, subject)} has ended: {_array_counts(f.get('counts') or {})}."


def _preempted(f: Facts, subject: str) -> str:
    return (f"{subject} was checkpointed and put back in the queue: its group is over its quota and a job "
            "within its own group's quota needed the GPUs. It resumes from the checkpoint when it fits again.")


def _budget_at_risk(f: Facts, subject: str) -> str | None:
    job = f.job
    if job is None or not job.loss_budget_s:
        return None
    return (f"Job “{job.name}” of {job.owner.get_username()} on {subject} may lose more than its loss budget of "
            f"{duration(job.loss_budget_s)}: its node's checkpoint bandwidth cannot checkpoint it often enough "
            "(it checkpoints as often as the bandwidth allows).")


def _owner_using_gpu(f: Facts, subject: str) -> str | None:
    gpus = f.get("gpus") or []
    if not gpus:
        return None
    if "processes" in gpus[0]:  # the agent's process list (design §1 "Owner activity and MIG")
        return _owner_processes(gpus, subject, str(f.get("action") or "notify"))
    which = ", ".join(f"GPU {g['index']} ({g['util_pct']:.0f}%)" for g in gpus)
    return (f"{subject} is lent, but {which} {'is' if len(gpus) == 1 else 'are'} busy with no borrowed job on "
            "it: someone at the lab is using a lent GPU. Jobs placed there would compete for it; take the node "
            "back first (a reclaim with notice moves its jobs off).")


def _owner_processes(gpus: list[dict[str, Any]], subject: str, action: str) -> str:
    """Owner use seen in the GPUs' process lists: which GPUs, how many processes and how much memory."""
    which = ", ".join(f"GPU {g['index']} ({g['processes']} process{'es' if g['processes'] != 1 else ''}, "
                      f"{g['memory_bytes'] / 1e9:.1f} GB)" for g in gpus)
    text = f"{subject} is lent, but the lab is using it: {which}."
    if any(g.get("borrowed") for g in gpus):
        text += " A borrowed job runs on the same GPU."
    if action == "reclaim":
        return text + " As this node's policy asks, it is being taken back (a reclaim with notice moves its jobs off)."
    return text + " Jobs placed there compete for it; take the node back first, or set the node to be reclaimed " \
                  "automatically when this happens."


# Loans (design §15): the idle watchdog, the loan timer, the release and the owner's resume.
RELEASED_BECAUSE: dict[str, str] = {
    "idle": "it did not use its GPUs",
    "loan": "its loan ended",
    "preempted": "its group is over its quota",
}


def _release_what(f: Facts) -> str:
    if f.get("then") == "requeue":
        return "it goes back to the queue and resumes from its checkpoint when placed"
    return "it is suspended: resume it from its page when you need it"


def _idle_warning(f: Facts, subject: str) -> str | None:
    release_at = f.get("release_at")
    if release_at is None:
        return None
    return (f"{subject} has not used its GPUs for {duration(float(f.get('idle_s', 0)))}. Unless it uses them "
            f"again, it will be checkpointed and released at {clock(release_at)}, and {_release_what(f)}.")


def _loan_ending(f: Facts, subject: str) -> str | None:
    release_at = f.get("release_at")
    if release_at is None:
        return None
    loan = f" {duration(float(f.get('max_loan_s')))}" if f.get("max_loan_s") else ""
    return (f"{subject} reaches the end of its{loan} loan at {clock(release_at)}: it will be checkpointed and "
            f"released then, and {_release_what(f)}.")


def _released(f: Facts, subject: str) -> str:
    why = RELEASED_BECAUSE.get(str(f.get("reason", "")), str(f.get("reason", "")).replace("_", " "))
    step = f.get("step")
    where = f" from {_node_name(f.node)}" if f.node is not None else ""
    if f.get("forced"):
        lost = float(f.get("work_lost_s") or 0.0)
        start = f"step {step}" if step is not None else "the beginning"
        lost_words = f"; {duration(lost)} of work lost" if lost > 0 else ""
        return (f"{subject} was released{where} because {why}; it wrote no final checkpoint in time, so it will "
                f"resume from {start}{lost_words}. Its GPUs are back in the pool, and {_release_what(f)}.")
    at = f" at step {step}" if step is not None else ""
    return (f"{subject} was checkpointed{at} and released{where} because {why}. Its GPUs are back in the pool, "
            f"and {_release_what(f)}.")


def _resumed(f: Facts, subject: str) -> str:
    step = f.get("step")
    where = f"from step {step}" if step else "from its latest checkpoint"
    return f"{subject} was resumed: it is queued and continues {where} when placed."


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
    EventType("job.dependency_cancelled", RESEARCHERS, "bad",
              "A job was cancelled because a job it depends on failed or was cancelled.", _dependency_cancelled),
    EventType("array.dependency_cancelled", RESEARCHERS, "bad",
              "Tasks of an array were cancelled because a job they depend on failed or was cancelled (one notice "
              "per array, with the count).", _array_dependency_cancelled),
    EventType("array.finished", RESEARCHERS, "info",
              "Every task of an array has ended: how many completed, failed or were cancelled (one notice per "
              "array instead of one per task).", _array_finished),
    EventType("job.preempted", RESEARCHERS, "warning",
              "A job beyond its group's quota was checkpointed and requeued for a job within quota.", _preempted),
    EventType("job.idle_warning", RESEARCHERS, "warning",
              "A job has not used its GPUs for its class's idle limit: when it will be released.", _idle_warning),
    EventType("job.loan_ending", RESEARCHERS, "warning",
              "A job's loan is ending: when it will be checkpointed and released.", _loan_ending),
    EventType("job.released", RESEARCHERS, "warning",
              "A job was checkpointed and taken off its GPUs (idle, loan ended), and whether it waits for you.",
              _released),
    EventType("job.resumed", RESEARCHERS, "info", "A released job was resumed and is queued again.", _resumed),
    EventType("reclaim.done", PROVIDER, "ok", "A node you took back is free of borrowed jobs.", _reclaim_done),
    EventType("node.returned", PROVIDER, "ok", "A node's agent connected: the node is lent.", _node_returned),
    EventType("node.offline", PROVIDER, "warning", "A node's agent stopped answering.", _agent_offline),
    EventType("reclaim.forced", ADMINS, "warning",
              "A node was taken back without notice, or its notice ran out before every job had left.",
              _reclaim_forced),
    EventType("node.lost", ADMINS, "bad", "A lent node stopped answering.", _node_lost),
    EventType("node.owner_using_gpu", PROVIDER, "warning",
              "A lent GPU is busy with a process that is not a borrowed job (the lab using it).", _owner_using_gpu),
    EventType("job.budget_at_risk", ADMINS, "warning",
              "A job's loss budget is at risk: its node cannot checkpoint it often enough.", _budget_at_risk),
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


# Each is called with every notice after its transaction committed; mail and webhook senders join this list
# (portal.notify appends its own when the app is ready: design §12).
DELIVERIES: list[Callable[[Notice], None]] = [deliver_live]

# Each is asked about every event before it is written; one answering True folds the event into a summary its
# app sends itself, and it is not sent on its own (the fair queue folds an array task's finished, failed and
# dependency_cancelled into one notice per array, design §16.6).
FOLDED: list[Callable[[str, Facts], bool]] = []


def _model(model: type, value: Any) -> Any:
    if value is None or isinstance(value, model):
        return value
    return model.objects.get(pk=value)


def _fact_fields(f: Facts) -> dict[str, Any]:
    """The structured side of a notice (webhook fields): ids and names of what it is about, plain extras."""
    out: dict[str, Any] = {}
    if f.job is not None:
        out["job"] = {"id": f.job.pk, "name": f.job.name, "owner": f.job.owner.get_username(),
                      "group_id": f.job.group_id}
    node = f.node or (f.reclaim.node if f.reclaim is not None else None)
    if node is not None:
        out["node"] = {"id": node.pk, "name": node.name, "provider_id": node.provider_id}
    if f.reclaim is not None:
        out["reclaim"] = {"id": f.reclaim.pk, "kind": f.reclaim.kind, "notice_s": f.reclaim.notice_s,
                          "deadline_at": f.reclaim.deadline_at.isoformat() if f.reclaim.deadline_at else None}
    if f.migration is not None:
        out["migration"] = {"id": f.migration.pk, "work_lost_s": f.migration.work_lost_s,
                            "destination": f.migration.destination.name if f.migration.destination else None}
    for key, value in f.extra.items():
        if isinstance(value, datetime):
            out.setdefault(key, value.isoformat())
        elif value is None or isinstance(value, str | int | float | bool | list | dict):
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue
            out.setdefault(key, value)
    return out


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
        if any(fold(name, facts) for fold in FOLDED):
            return None
        url = str(extra.get("page_url") or url)  # e.g. an array's page rather than its first task's
        text = kind.render(facts, owner_subject)
        if text is None:
            return None
        others = text if others_subject == owner_subject else (kind.render(facts, others_subject) or text)
        notice = Notice(id=uuid.uuid4().hex, name=name, audience=kind.audience, level=kind.level, text=text,
                        text_others=others, groups=groups, owner_id=owner_id, url=url,
                        at=timezone.now().isoformat(), facts=_fact_fields(facts))
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
