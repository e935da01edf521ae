"""Who receives a notice by mail, webhook and digest, and each person's choices (docs/design.md §12).

Defaults (no ``Preference`` row): warnings and failures (``warning``, ``bad``) by mail at once, good news
(``ok``) in the digest, the rest (``info``) only as a toast; a user's own webhooks get everything but ``info``.
In a research group the job's owner gets these defaults; the other members only what they chose explicitly
(a group of twenty is not mailed every placement). Webhooks of a research group or a lab receive every notice
addressed to that group or lab."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q

from portal.core import events
from portal.core.models import Provider, ResearchGroup
from portal.core.permissions import is_admin
from portal.notify.models import EmailMode, Preference, Webhook


@dataclass(frozen=True)
class Choice:
    """One user's effective choice for one event."""

    toast: bool
    email: str  # EmailMode
    webhook: bool


def default_choice(event: str) -> Choice:
    level = events.CATALOGUE[event].level if event in events.CATALOGUE else "info"
    if level in ("warning", "bad"):
        return Choice(toast=True, email=EmailMode.NOW, webhook=True)
    if level == "ok":
        return Choice(toast=True, email=EmailMode.DIGEST, webhook=True)
    return Choice(toast=True, email=EmailMode.OFF, webhook=False)


def choice_of(row: Preference | None, event: str) -> Choice:
    if row is None:
        return default_choice(event)
    return Choice(toast=row.toast, email=row.email, webhook=row.webhook)


def table_for(user: Any) -> list[tuple[events.EventType, Choice, bool]]:
    """The preferences page: every catalogue event this user can be in the audience of, with the user's
    effective choice and whether it is an explicit one."""
    rows = {p.event: p for p in Preference.objects.filter(user=user)}
    audiences = audiences_of(user)
    return [(kind, choice_of(rows.get(name), name), name in rows) for name, kind in events.CATALOGUE.items()
            if kind.audience in audiences]


def audiences_of(user: Any) -> set[str]:
    """The catalogue audiences ``user`` belongs to: research group members, lab members, admins (all three)."""
    if is_admin(user):
        return {events.RESEARCHERS, events.PROVIDER, events.ADMINS}
    out = set()
    if ResearchGroup.objects.filter(members=user).exists():
        out.add(events.RESEARCHERS)
    if Provider.objects.filter(members=user).exists():
        out.add(events.PROVIDER)
    return out


def muted_toasts(user: Any) -> frozenset[str]:
    """Events this user turned toasts off for (the live consumer skips them)."""
    return frozenset(Preference.objects.filter(user=user, toast=False).values_list("event", flat=True))


@dataclass(frozen=True)
class Recipient:
    user_id: int
    email: str
    text: str
    choice: Choice


def _audience_ids(payload: dict[str, Any]) -> tuple[str, int | None]:
    """(audience kind, the group's or lab's id) from the notice's live groups."""
    for group in payload.get("groups") or ():
        kind, _, pk = str(group).partition("-")
        if kind == "group" and pk.isdigit():
            return "group", int(pk)
        if kind == "provider" and pk.isdigit():
            return "provider", int(pk)
    return "admins", None


def recipients(payload: dict[str, Any]) -> list[Recipient]:
    """The people a notice reaches outside the browser, each with their choice and their sentence."""
    event = payload["name"]
    kind, pk = _audience_ids(payload)
    users = get_user_model().objects.filter(is_active=True)
    if kind == "group":
        users = users.filter(research_groups__pk=pk)
    elif kind == "provider":
        users = users.filter(providers__pk=pk)
    else:
        users = users.filter(is_staff=True)
    people = list(users.distinct().values_list("pk", "email"))
    rows = {p.user_id: p for p in Preference.objects.filter(event=event, user_id__in=[u for u, _ in people])}
    owner = payload.get("owner_id")
    out = []
    for user_id, email in people:
        row = rows.get(user_id)
        if kind == "group" and owner is not None and user_id != owner and row is None:
            continue  # other members of the group: only what they chose
        mine = owner is None or owner == user_id
        out.append(Recipient(user_id, email or "", payload["text"] if mine else payload.get("text_others") or
                             payload["text"], choice_of(row, event)))
    return out


def webhooks_for(payload: dict[str, Any], people: Iterable[Recipient]) -> list[tuple[Webhook, str]]:
    """Enabled webhooks a notice goes to, each with its sentence: the group's or lab's own, and the users'
    own for users whose choice includes webhooks."""
    kind, pk = _audience_ids(payload)
    wanted = {r.user_id: r.text for r in people if r.choice.webhook}
    scope = Q(user_id__in=list(wanted))
    if kind == "group":
        scope |= Q(group_id=pk)
    elif kind == "provider":
        scope |= Q(provider_id=pk)
    out = []
    for hook in Webhook.objects.filter(scope, enabled=True):
        text = wanted.get(hook.user_id) if hook.user_id else payload.get("text_others") or payload["text"]
        out.append((hook, text or payload["text"]))
    return out


def can_manage_group_hooks(user: Any) -> tuple[list[ResearchGroup], list[Provider]]:
    """The research groups and labs whose webhooks ``user`` may register and see (members; admins all)."""
    if is_admin(user):
        return list(ResearchGroup.objects.order_by("name")), list(Provider.objects.order_by("name"))
    return (list(ResearchGroup.objects.filter(members=user).order_by("name")),
            list(Provider.objects.filter(members=user).order_by("name")))


def visible_webhooks(user: Any) -> Any:
    """Webhooks ``user`` sees: their own and their groups' and labs'; admins all."""
    if is_admin(user):
        return Webhook.objects.all()
    return Webhook.objects.filter(Q(user=user) | Q(group__members=user) | Q(provider__members=user)).distinct()
