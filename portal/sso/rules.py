"""Claims to roles: which rules match a set of claims, and bringing a user's rule-granted memberships in line with
them (docs/design.md §20).

Granted memberships are tracked (``RuleGrant``): a later sign-in adds what the rules now grant and withdraws what
they granted before and no longer do; a membership an admin gave by hand (no ``RuleGrant``) is left alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractUser
from django.db import transaction

from portal.core.models import Provider, ResearchGroup
from portal.sso.models import ClaimRule, GrantKind, MatchKind, RuleGrant

Target = tuple[str, int | None]


def claim_values(claims: Mapping[str, Any], name: str) -> list[str]:
    """The claim's values as text: a list gives its scalar items, a scalar itself (booleans as ``true``/``false``);
    an absent claim, an object or null gives nothing. A dotted name walks nested objects when no claim has that
    exact name."""
    value: Any = claims.get(name) if name in claims else _walk(claims, name)
    items = value if isinstance(value, list | tuple) else [value]
    out = []
    for item in items:
        if isinstance(item, bool):
            out.append("true" if item else "false")
        elif isinstance(item, str | int | float):
            out.append(str(item))
    return out


def _walk(claims: Mapping[str, Any], name: str) -> Any:
    node: Any = claims
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def rule_matches(rule: ClaimRule, claims: Mapping[str, Any]) -> bool:
    values = claim_values(claims, rule.claim)
    if rule.match == MatchKind.REGEX:
        pattern = re.compile(rule.value, re.IGNORECASE if rule.ignore_case else 0)
        return any(pattern.fullmatch(v) for v in values)
    wanted = rule.value.casefold() if rule.ignore_case else rule.value
    values = [v.casefold() for v in values] if rule.ignore_case else values
    if rule.match == MatchKind.CONTAINS:
        return any(wanted in v for v in values)
    return wanted in values


@dataclass
class Decision:
    """What the enabled rules grant for one set of claims."""

    matched: list[ClaimRule] = field(default_factory=list)
    targets: set[Target] = field(default_factory=set)

    @property
    def admitted(self) -> bool:
        return bool(self.matched)


def decide(claims: Mapping[str, Any], rules: Iterable[ClaimRule] | None = None) -> Decision:
    """Every enabled rule whose claim matches, in rule order, and the union of what they grant."""
    if rules is None:
        rules = ClaimRule.objects.filter(enabled=True).order_by("position", "id")
    decision = Decision()
    for rule in rules:
        if rule.enabled and rule_matches(rule, claims):
            decision.matched.append(rule)
            decision.targets.add(rule.target())
    return decision


@dataclass
class Applied:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def _label(target: Target) -> str:
    kind, pk = target
    if kind == GrantKind.LAB:
        return f"lab:{Provider.objects.filter(pk=pk).values_list('slug', flat=True).first()}"
    if kind == GrantKind.GROUP:
        return f"group:{ResearchGroup.objects.filter(pk=pk).values_list('slug', flat=True).first()}"
    return "staff"


def _is_member(user: AbstractUser, target: Target) -> bool:
    kind, pk = target
    if kind == GrantKind.LAB:
        return Provider.members.through.objects.filter(provider_id=pk, user_id=user.pk).exists()
    if kind == GrantKind.GROUP:
        return ResearchGroup.members.through.objects.filter(researchgroup_id=pk, user_id=user.pk).exists()
    return bool(user.is_staff)


def _set_member(user: AbstractUser, target: Target, member: bool) -> None:
    kind, pk = target
    if kind == GrantKind.LAB:
        provider = Provider.objects.get(pk=pk)
        (provider.members.add if member else provider.members.remove)(user)
    elif kind == GrantKind.GROUP:
        group = ResearchGroup.objects.get(pk=pk)
        (group.members.add if member else group.members.remove)(user)
    else:
        user.is_staff = member
        user.save(update_fields=["is_staff"])


def apply(user: AbstractUser, targets: set[Target]) -> Applied:
    """Make ``user``'s rule-granted memberships exactly ``targets`` (manual memberships untouched). Call inside a
    transaction that holds the user's row (``select_for_update``): two sign-ins of one person apply one by one."""
    assert transaction.get_connection().in_atomic_block, "apply() runs inside the sign-in's transaction"
    applied = Applied()
    grants = {grant.target(): grant for grant in RuleGrant.objects.filter(user=user)}
    for target in sorted(targets, key=lambda t: (t[0], t[1] or 0)):
        kind, pk = target
        if not _is_member(user, target):
            _set_member(user, target, True)
            applied.added.append(_label(target))
            if target not in grants:
                RuleGrant.objects.create(user=user, kind=kind, provider_id=pk if kind == GrantKind.LAB else None,
                                         research_group_id=pk if kind == GrantKind.GROUP else None)
    for target, grant in grants.items():
        if target not in targets:
            if _is_member(user, target):
                _set_member(user, target, False)
                applied.removed.append(_label(target))
            grant.delete()
    return applied
