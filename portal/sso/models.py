"""Claim rules, campus identities and the memberships the rules granted (docs/design.md §20)."""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from portal.core.models import Provider, ResearchGroup

CLAIM_NAME = re.compile(r"^[A-Za-z0-9_:/.\-]{1,200}$")


class MatchKind(models.TextChoices):
    EQUALS = "equals", "equals"
    CONTAINS = "contains", "contains"
    REGEX = "regex", "matches the regular expression"


class GrantKind(models.TextChoices):
    LAB = "lab", "member of a lab (provider)"
    GROUP = "group", "member of a research group"
    STAFF = "staff", "campus staff (sees and does everything)"


class ClaimRule(models.Model):
    """If the identity provider's claim ``claim`` has a value that ``match``es ``value``, grant ``action``.

    A claim holding a list (``groups``) matches when any of its items does; numbers and booleans are compared as
    text (``true``/``false``). ``equals`` compares whole values, ``contains`` looks for ``value`` inside one, ``regex``
    needs the whole value to match. Every enabled rule that matches applies (the order is the order admins read
    them in); a sign-in that no rule matches is refused."""

    position = models.PositiveIntegerField(default=0, db_index=True, help_text="Rules are listed in this order.")
    enabled = models.BooleanField(default=True)
    claim = models.CharField(
        max_length=200, help_text="Claim name as the provider sends it, e.g. groups, email, eduperson_affiliation; "
                                  "a dotted path reaches into a nested claim (realm_access.roles).")
    match = models.CharField(max_length=16, choices=MatchKind.choices, default=MatchKind.EQUALS)
    value = models.CharField(max_length=500, help_text="Text to compare with, or a Python regular expression.")
    ignore_case = models.BooleanField(default=False)
    action = models.CharField(max_length=16, choices=GrantKind.choices)
    provider = models.ForeignKey(Provider, null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="claim_rules", help_text="The lab, for the lab action.")
    research_group = models.ForeignKey(ResearchGroup, null=True, blank=True, on_delete=models.CASCADE,
                                       related_name="claim_rules", help_text="The group, for the group action.")
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["position", "id"]

    def __str__(self) -> str:
        target = {GrantKind.LAB: self.provider, GrantKind.GROUP: self.research_group}.get(self.action, "staff")
        return f"{self.claim} {self.match} {self.value!r} → {self.action} {target}"

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if not CLAIM_NAME.match(self.claim or ""):
            errors["claim"] = "A claim name: letters, digits and _ : / . - only, at most 200 characters."
        if self.match == MatchKind.REGEX:
            try:
                re.compile(self.value or "", re.IGNORECASE if self.ignore_case else 0)
            except re.error as exc:
                errors["value"] = f"Not a valid regular expression: {exc}."
        elif not self.value:
            errors["value"] = "Say what the claim must equal or contain."
        if self.action == GrantKind.LAB:
            if self.provider_id is None:
                errors["provider"] = "Choose the lab this rule makes people members of."
            if self.research_group_id is not None:
                errors["research_group"] = "A lab rule names no research group."
        elif self.action == GrantKind.GROUP:
            if self.research_group_id is None:
                errors["research_group"] = "Choose the research group this rule makes people members of."
            if self.provider_id is not None:
                errors["provider"] = "A research-group rule names no lab."
        elif self.action == GrantKind.STAFF:
            if self.provider_id is not None:
                errors["provider"] = "A staff rule names no lab."
            if self.research_group_id is not None:
                errors["research_group"] = "A staff rule names no research group."
        if errors:
            raise ValidationError(errors)

    def target(self) -> tuple[str, int | None]:
        """What this rule grants: (kind, provider or group id; None for staff)."""
        if self.action == GrantKind.LAB:
            return (GrantKind.LAB, self.provider_id)
        if self.action == GrantKind.GROUP:
            return (GrantKind.GROUP, self.research_group_id)
        return (GrantKind.STAFF, None)


class CampusIdentity(models.Model):
    """One account at the identity provider (issuer + subject, never the e-mail, which can change hands) and the
    portal account it signs in to. The last claims received are kept for admins writing rules."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="campus_identities")
    issuer = models.CharField(max_length=300)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)
    last_claims = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique_subject")]
        verbose_name_plural = "campus identities"

    def __str__(self) -> str:
        return f"{self.subject} @ {self.issuer} → {self.user}"


class RuleGrant(models.Model):
    """A membership (or the staff flag) that claim rules gave a user. It is withdrawn at a later sign-in where no
    rule grants it any more; memberships without a row here were given by hand and are never touched."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="rule_grants")
    kind = models.CharField(max_length=16, choices=GrantKind.choices)
    provider = models.ForeignKey(Provider, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    research_group = models.ForeignKey(ResearchGroup, null=True, blank=True, on_delete=models.CASCADE,
                                       related_name="+")
    granted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "provider"], condition=models.Q(kind="lab"),
                                    name="sso_grant_unique_lab"),
            models.UniqueConstraint(fields=["user", "research_group"], condition=models.Q(kind="group"),
                                    name="sso_grant_unique_group"),
            models.UniqueConstraint(fields=["user"], condition=models.Q(kind="staff"), name="sso_grant_unique_staff"),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.kind} {self.provider or self.research_group or ''}".strip()

    def target(self) -> tuple[str, int | None]:
        if self.kind == GrantKind.LAB:
            return (GrantKind.LAB, self.provider_id)
        if self.kind == GrantKind.GROUP:
            return (GrantKind.GROUP, self.research_group_id)
        return (GrantKind.STAFF, None)
