"""From a notice to mail and webhooks, never on the path of a reclaim, a placement or a request (design §12).

1. :func:`queue_notice` is an entry of ``events.DELIVERIES``: after the emitting transaction committed it writes
   one outbox row (``notify.fan_out``) and nothing else — no lookup of recipients, no network.
2. ``notify.fan_out`` (queue ``notifications``) works out who receives it by which channel (preferences), writes
   one ``Delivery`` row per target and queues ``notify.deliver`` for each.
3. ``notify.deliver`` claims its attempt (a conditional update on ``attempts``: a duplicated task does nothing)
   and hands the network part to a small thread pool of the process that runs it, so neither a Celery worker's
   task slot nor the embedded relay waits for a mail server or a receiver, and the thread gives its database
   connection back while it waits on the network. Each attempt is bounded by a timeout and logged (``Attempt``); a failure is retried with exponential backoff through a delayed outbox row
   (durable: a process that dies loses no retry; :func:`requeue_stuck` re-drives an attempt lost with its
   thread). A receiver's 4xx other than 408 and 429 is final, and so is a webhook target that resolves to a
   private address (``targets``: vetted before each attempt, the connection pinned to the vetted address).
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.core.cache import cache
from django.db import OperationalError, close_old_connections, connections, transaction
from django.utils import timezone

from portal.core import events, outbox
from portal.core.lifecycle.jobs import JobState
from portal.core.models import Job, Placement
from portal.notify import mail, preferences, signing, targets
from portal.notify.models import (
    Attempt,
    BudgetRiskSeen,
    Channel,
    Delivery,
    DeliveryStatus,
    EmailMode,
    Webhook,
)

log = logging.getLogger(__name__)

FAN_OUT = "notify.fan_out"
DELIVER = "notify.deliver"
POOL_THREADS = 4
STUCK_AFTER_S = 120.0  # an attempt claimed this long ago without a result lost its thread
REFUSED = "refused: "  # a target the portal will not post to (design §12): logged, never retried


def conf(name: str) -> Any:
    return settings.RECLAIMNET_NOTIFY[name]


# --- 1. after commit -------------------------------------------------------------------------------------------

def queue_notice(notice: events.Notice) -> None:
    """``events.DELIVERIES`` entry: one outbox row; the rest happens on the notifications queue."""
    outbox.enqueue(FAN_OUT, {**notice.payload(), "facts": notice.facts})


# --- 2. fan out ------------------------------------------------------------------------------------------------

def fan_out(payload: dict[str, Any]) -> int:
    """Write the deliveries of one notice and queue them; returns how many are to be sent now. Idempotent (one
    delivery per notice and target)."""
    people = preferences.recipients(payload)
    base = {"notice_id": payload["id"], "event": payload["name"], "level": payload.get("level", "info"),
            "url": payload.get("url", ""), "facts": payload.get("facts") or {}}
    rows = []
    for person in people:
        if not person.email or person.choice.email == EmailMode.OFF:
            continue
        digest = person.choice.email == EmailMode.DIGEST
        rows.append(Delivery(**base, channel=Channel.DIGEST if digest else Channel.EMAIL, user_id=person.user_id,
                             key=f"{'digest' if digest else 'email'}:{person.user_id}", target=person.email,
                             text=person.text,
                             status=DeliveryStatus.IN_DIGEST if digest else DeliveryStatus.PENDING))
    for hook, text in preferences.webhooks_for(payload, people):
        rows.append(Delivery(**base, channel=Channel.WEBHOOK, webhook=hook, user_id=hook.user_id,
                             key=f"webhook:{hook.pk}", target=hook.url, text=text))
    if not rows:
        return 0
    with transaction.atomic():
        known = set(Delivery.objects.filter(notice_id=payload["id"]).values_list("key", flat=True))
        rows = [row for row in rows if row.key not in known]  # a second delivery of this task adds nothing
        if not rows:
            return 0
        Delivery.objects.bulk_create(rows, ignore_conflicts=True)
        due = list(Delivery.objects.filter(notice_id=payload["id"], key__in=[r.key for r in rows], attempts=0,
                                           status=DeliveryStatus.PENDING).values_list("pk", flat=True))
        for pk in due:
            outbox.enqueue(DELIVER, pk, 1)
    return len(due)

T = TypeVar("T")

# --- 3. deliver ------------------------------------------------------------------------------------------------

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_in_flight: set[concurrent.futures.Future[Any]] = set()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="notify")
        return _pool


def deliver(delivery_id: int, attempt: int) -> None:
    """The ``notify.deliver`` task body: start attempt ``attempt`` in the background and return at once."""
    future = _executor().submit(_in_thread, delivery_id, attempt)
    with _pool_lock:
        _in_flight.add(future)
    future.add_done_callback(_forget)


def _forget(future: concurrent.futures.Future[Any]) -> None:
    with _pool_lock:
        _in_flight.discard(future)


def drain(timeout_s: float = 30.0) -> bool:
    """Wait until this process's attempts under way are done (tests, shutdown); True when none is left."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with _pool_lock:
            pending = list(_in_flight)
        if not pending:
            return True
        concurrent.futures.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
    with _pool_lock:
        return not _in_flight


def _in_thread(delivery_id: int, attempt: int) -> str:
    close_old_connections()
    try:
        return attempt_delivery(delivery_id, attempt, release_db=True)
    except Exception:
        log.exception("notify: delivery %s attempt %s failed unexpectedly", delivery_id, attempt)
        return "error"
    finally:
        connections.close_all()


def backoff_s(attempt: int) -> float:
    """Wait after failed attempt ``attempt`` (1-based): RETRY_BASE_S doubling, capped at RETRY_MAX_S."""
    return float(min(conf("RETRY_MAX_S"), conf("RETRY_BASE_S") * 2 ** max(0, attempt - 1)))


def retryable(status_code: int | None, error: str) -> bool:
    """A network error, a timeout, 5xx, 408 and 429 are worth retrying; another 4xx is the receiver's "no"."""
    if status_code is None:
        return bool(error)
    return status_code >= 500 or status_code in (408, 429)


def attempt_delivery(delivery_id: int, attempt: int, *, release_db: bool = False) -> str:
    """Claim and make attempt ``attempt`` of a delivery; record it; schedule the next one or give up.

    ``release_db`` (the pool threads): hand this thread's database connection back while waiting on the network,
    so slow receivers never hold connections of the process's pool (design §10) that control tasks need."""
    def claim() -> Delivery | None:
        with transaction.atomic():
            claimed = Delivery.objects.filter(pk=delivery_id, attempts=attempt - 1, status__in=[
                DeliveryStatus.PENDING, DeliveryStatus.RETRYING]).update(attempts=attempt, claimed_at=timezone.now())
            return Delivery.objects.select_related("webhook").get(pk=delivery_id) if claimed else None

    delivery = _with_connection(claim) if release_db else claim()
    if delivery is None:
        return "not mine"
    if release_db:
        connections.close_all()
    code, error, took_ms = _send(delivery, attempt)
    if release_db:
        return _with_connection(lambda: _record(delivery, attempt, code, error, took_ms))
    return _record(delivery, attempt, code, error, took_ms)


# A pool thread outlives the Celery task that started it, and in a prefork worker Celery's Django fixup closes the
# process's connection pool before and after every task: a thread that asks for a connection while the pool is
# being closed, or before its successor is open, is refused. Such a refusal happens before any statement runs, so
# the step (one transaction) is tried again on a fresh connection.
_CONNECTION_REFUSALS = ("is closed", "couldn't get a connection")
CONNECTION_TRIES = 5


def _with_connection(step: Callable[[], T]) -> T:
    """Run ``step`` (one transaction), again on a fresh connection when the pool refused one (up to
    ``CONNECTION_TRIES`` times, 0.2 s doubling between tries)."""
    for tries in range(1, CONNECTION_TRIES + 1):
        try:
            return step()
        except OperationalError as exc:
            if tries == CONNECTION_TRIES or not any(text in str(exc) for text in _CONNECTION_REFUSALS):
                raise
            log.info("notify: no database connection (%s); trying again", exc)
            connections.close_all()
            time.sleep(0.2 * 2 ** (tries - 1))
    raise AssertionError("unreachable")


def _send(delivery: Delivery, attempt: int) -> tuple[int | None, str, float]:
    """One try over the network: (status code, error, milliseconds). Never raises."""
    started = time.monotonic()
    code: int | None = None
    error = ""
    try:
        if delivery.channel == Channel.WEBHOOK:
            hook = delivery.webhook
            if hook is None or not hook.enabled:
                error = "webhook disabled or deleted"
            else:
                code = post_webhook(hook, webhook_body(delivery, attempt), delivery)
                if not 200 <= code < 300:
                    error = f"HTTP {code}"
        else:
            subject = (delivery.facts or {}).get("subject") or mail.subject_of(delivery.event, delivery.text)
            mail.send(delivery.target, subject, mail.notice_body(delivery.text, delivery.url, delivery.facts or {}))
    except targets.RefusedTargetError as exc:
        error = f"{REFUSED}{exc}"[:300]
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    return code, error, 1000.0 * (time.monotonic() - started)


def _record(delivery: Delivery, attempt: int, code: int | None, error: str, took_ms: float) -> str:
    if not error:
        with transaction.atomic():
            Attempt.objects.create(delivery_id=delivery.pk, number=attempt, status_code=code, error=error,
                                   duration_ms=took_ms)
            Delivery.objects.filter(pk=delivery.pk).update(status=DeliveryStatus.SENT, sent_at=timezone.now(),
                                                           last_status_code=code, last_error="")
        return "sent"
    final = attempt >= conf("MAX_ATTEMPTS") or not retryable(code, error) \
        or error.startswith(("webhook disabled", REFUSED))
    with transaction.atomic():
        Attempt.objects.create(delivery_id=delivery.pk, number=attempt, status_code=code, error=error,
                               duration_ms=took_ms)
        Delivery.objects.filter(pk=delivery.pk).update(
            status=DeliveryStatus.GAVE_UP if final else DeliveryStatus.RETRYING, last_status_code=code,
            last_error=error)
        if not final:
            outbox.enqueue(DELIVER, delivery.pk, attempt + 1, delay_s=backoff_s(attempt))
    log.info("notify: %s to %s attempt %d failed (%s)%s", delivery.channel, delivery.target, attempt, error,
             "; giving up" if final else "")
    return "gave up" if final else "retrying"


def webhook_body(delivery: Delivery, attempt: int) -> bytes:
    """Slack-compatible ``text`` plus the structured fields."""
    return json.dumps({
        "text": delivery.text, "event": delivery.event, "level": delivery.level, "notice_id": delivery.notice_id,
        "delivery_id": delivery.pk, "attempt": attempt, "url": mail.link(delivery.url),
        "at": delivery.created_at.isoformat(), **{k: v for k, v in (delivery.facts or {}).items()
                                                  if k not in ("text", "event")},
    }, separators=(",", ":")).encode()


def post_webhook(hook: Webhook, body: bytes, delivery: Delivery | None = None) -> int:
    """POST ``body`` signed with the hook's secret to the hook's vetted address (``targets.post``: a private
    target is refused, a redirect is not followed); returns the status code. Raises ``targets.RefusedTargetError``,
    and ``OSError`` on network errors and timeouts (``WEBHOOK_TIMEOUT_S`` per connect and per read)."""
    headers = {"Content-Type": "application/json", "User-Agent": "ReclaimNet-Webhook/1",
               **signing.sign(hook.secret, body)}
    if delivery is not None:
        headers[signing.EVENT_HEADER] = delivery.event
        headers[signing.DELIVERY_HEADER] = str(delivery.pk)
    return targets.post(hook.url, body, headers, conf("WEBHOOK_TIMEOUT_S"))


def send_test(hook: Webhook | None, user: Any, channel: str) -> Delivery:
    """A "send test" delivery to one webhook or to the user's own address, queued like any other."""
    notice_id = f"test-{int(time.time() * 1000)}"
    text = (f"Test notification from ReclaimNet for {user.get_username()}: if you read this, "
            f"{'the webhook' if hook else 'mail'} works.")
    with transaction.atomic():
        delivery = Delivery.objects.create(
            notice_id=notice_id, event="test", level="info", channel=channel, user=user, webhook=hook,
            key=f"{channel}:{hook.pk if hook else user.pk}", target=hook.url if hook else user.email, text=text,
            url="/notify/", facts={"subject": "[ReclaimNet] Test notification"})
        outbox.enqueue(DELIVER, delivery.pk, 1)
    return delivery


# --- digest, watchers ------------------------------------------------------------------------------------------

def send_digests() -> int:
    """One mail per user gathering the notices they chose to read in bulk; returns how many mails."""
    waiting: dict[int, list[Delivery]] = defaultdict(list)
    for row in Delivery.objects.filter(channel=Channel.DIGEST, status=DeliveryStatus.IN_DIGEST).order_by("pk"):
        waiting[row.user_id].append(row)
    sent = 0
    for user_id, rows in waiting.items():
        now = timezone.now()
        lines = [f"{timezone.localtime(r.created_at).strftime('%Y-%m-%d %H:%M')}  {r.text}" for r in rows]
        text = f"{len(rows)} {'event' if len(rows) == 1 else 'events'} since your last digest:\n\n" + "\n".join(lines)
        with transaction.atomic():
            claimed = Delivery.objects.filter(pk__in=[r.pk for r in rows], status=DeliveryStatus.IN_DIGEST).update(
                status=DeliveryStatus.DIGESTED, sent_at=now)
            if not claimed:
                continue
            mail_row = Delivery.objects.create(
                notice_id=f"digest-{rows[-1].pk}", event="digest", level="info", channel=Channel.EMAIL,
                user_id=user_id, key=f"email:{user_id}", target=rows[-1].target, text=text, url="",
                facts={"subject": f"[ReclaimNet] Digest: {len(rows)} {'event' if len(rows) == 1 else 'events'}"})
            outbox.enqueue(DELIVER, mail_row.pk, 1)
        sent += 1
    return sent


def watch_budgets() -> int:
    """Announce each running job whose loss budget turned at risk (``Job.loss_budget_at_risk``, set by P1 in
    the control tick) once, to admins; a job no longer at risk is re-armed."""
    BudgetRiskSeen.objects.exclude(job__loss_budget_at_risk=True, job__state=JobState.RUNNING).delete()
    fresh = list(Job.objects.filter(loss_budget_at_risk=True, state=JobState.RUNNING)
                 .exclude(pk__in=BudgetRiskSeen.objects.values("job_id")).values_list("pk", flat=True)[:100])
    announced = 0
    for job_id in fresh:
        with transaction.atomic():
            _, created = BudgetRiskSeen.objects.get_or_create(job_id=job_id)
            node_id = (Placement.objects.filter(job_id=job_id, ended_at__isnull=True)
                       .values_list("node_id", flat=True).first())
            if created and node_id is not None and events.emit("job.budget_at_risk", job=job_id, node=node_id):
                announced += 1
    return announced


def requeue_stuck(now: dt.datetime | None = None) -> int:
    """Attempts claimed but never finished (their process died mid-send): queue the next attempt."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(seconds=STUCK_AFTER_S)
    stuck = 0
    for pk, attempts in (Delivery.objects.filter(status__in=[DeliveryStatus.PENDING, DeliveryStatus.RETRYING],
                                                 attempts__gt=0, claimed_at__lt=cutoff)
                         .values_list("pk", "attempts")[:100]):
        if Attempt.objects.filter(delivery_id=pk, number=attempts).exists():
            continue  # that attempt finished; its retry is waiting in the outbox
        with transaction.atomic():
            if Delivery.objects.filter(pk=pk, attempts=attempts, claimed_at__lt=cutoff).update(claimed_at=now):
                outbox.enqueue(DELIVER, pk, attempts + 1)
                stuck += 1
    return stuck


def watch() -> dict[str, int]:
    """The ``notify.watch`` beat task: loss budgets at risk, stuck attempts."""
    return {"budgets": watch_budgets(), "requeued": requeue_stuck()}


_last_digest_s = time.monotonic()


def periodic() -> None:
    """The embedded loop's share of the beat tasks (``make demo`` runs no beat): watch every tick, the digest
    every ``RECLAIMNET_NOTIFY_DIGEST_PERIOD_S``."""
    global _last_digest_s
    watch()
    period_s = settings.CELERY_BEAT_SCHEDULE.get("notify-digest", {}).get("schedule", 3600.0)
    if time.monotonic() - _last_digest_s >= float(period_s):
        _last_digest_s = time.monotonic()
        send_digests()


# --- a lent GPU used by its owner ------------------------------------------------------------------------------

SEEN_TTL_S = 30.0
ANNOUNCE_EVERY_S = 3600.0


def busy_gpus(gpu_util: Any, threshold_pct: float) -> list[tuple[int, float]]:
    """(index, percent) of the GPUs a heartbeat reports at or above ``threshold_pct``."""
    if not isinstance(gpu_util, list):
        return []
    return [(i, float(u)) for i, u in enumerate(gpu_util)
            if isinstance(u, int | float) and not isinstance(u, bool) and float(u) >= threshold_pct]


def foreign_use(busy: list[tuple[int, float]], held: set[int]) -> list[tuple[int, float]]:
    """The busy GPUs no borrowed job holds: someone else (the lab) is using them."""
    return [(i, u) for i, u in busy if i not in held]


def observe_heartbeats(beats: list[tuple[int, Any]], lent: set[int]) -> None:
    """Called by the heartbeat batch (inside its transaction) with (node id, gpu_util) of each heartbeat and
    the ids of nodes that are lent: a GPU busy twice in a row (within ``SEEN_TTL_S``) with no open placement of
    ours on it raises ``node.owner_using_gpu``, at most once an hour per node. No statement unless a lent
    node reports a busy GPU; then one."""
    threshold = float(conf("OWNER_USE_UTIL_PCT"))
    busy = {node: b for node, util in beats if node in lent and (b := busy_gpus(util, threshold))}
    if not busy:
        return
    held: dict[int, set[int]] = defaultdict(set)
    for node_id, indices in Placement.objects.filter(node_id__in=list(busy), ended_at__isnull=True).values_list(
            "node_id", "gpu_indices"):
        held[node_id].update(int(i) for i in indices or ())
    for node_id, gpus in busy.items():
        foreign = foreign_use(gpus, held[node_id])
        if not foreign:
            continue
        seen_key = f"notify:owner-use-seen:{node_id}"
        if cache.get(seen_key) is None:
            cache.set(seen_key, 1, SEEN_TTL_S)
            continue
        if cache.add(f"notify:owner-use-told:{node_id}", 1, ANNOUNCE_EVERY_S):
            events.emit("node.owner_using_gpu", node=node_id,
                        gpus=[{"index": i, "util_pct": u} for i, u in foreign])
