"""Mail (docs/design.md §12): the notice's message, and the database backend used when no SMTP server is set.

``make demo`` has no mail server: with ``EMAIL_HOST`` unset, ``EMAIL_BACKEND`` is :class:`DatabaseBackend`,
which stores each message as a ``StoredMail`` row that admins read on /notify/mail/ — a newcomer sees the mail
the portal would have sent."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.core.mail.backends.base import BaseEmailBackend

from portal.notify.models import StoredMail

KEEP_STORED = 500  # the demo's mail page shows the newest; older rows are deleted


class DatabaseBackend(BaseEmailBackend):
    """Stores messages instead of sending them."""

    def send_messages(self, email_messages: Sequence[EmailMessage]) -> int:
        rows = [StoredMail(from_email=m.from_email or "", to=", ".join(m.to), subject=str(m.subject)[:300],
                           body=str(m.body)) for m in email_messages]
        StoredMail.objects.bulk_create(rows)
        newest = StoredMail.objects.order_by("-pk").values_list("pk", flat=True)[KEEP_STORED:KEEP_STORED + 1]
        if newest:
            StoredMail.objects.filter(pk__lte=newest[0]).delete()
        return len(rows)


def link(path: str) -> str:
    """An absolute link when RECLAIMNET_PUBLIC_URL is set, else the path."""
    return f"{settings.RECLAIMNET_NOTIFY['PUBLIC_URL']}{path}" if path else ""


def subject_of(event: str, text: str) -> str:
    first = text.split(". ")[0].split(": ")[0]
    return f"[ReclaimNet] {first}"[:200]


def notice_body(text: str, url: str, facts: dict[str, Any]) -> str:
    lines = [text, ""]
    deadline = (facts.get("reclaim") or {}).get("deadline_at")
    if facts.get("job"):
        lines.append(f"Job: {facts['job']['name']} (#{facts['job']['id']}, {facts['job']['owner']})")
    if facts.get("node"):
        lines.append(f"Node: {facts['node']['name']}")
    if deadline:
        lines.append(f"Deadline: {deadline}")
    if facts.get("expected_loss_s") is not None:
        lines.append(f"Expected loss: {float(facts['expected_loss_s']):.0f} s")
    if url:
        lines += ["", f"Details: {link(url)}"]
    lines += ["", "Choose which events reach you, and how, on your notification settings page: "
              f"{link('/notify/')}"]
    return "\n".join(lines)


def send(to: str, subject: str, body: str) -> None:
    """Send one message now (raises on failure: the caller records it and retries)."""
    connection = get_connection(timeout=settings.RECLAIMNET_NOTIFY["SMTP_TIMEOUT_S"]) \
        if settings.EMAIL_BACKEND.endswith("smtp.EmailBackend") else get_connection()
    EmailMessage(subject, body, settings.DEFAULT_FROM_EMAIL, [to], connection=connection).send()
