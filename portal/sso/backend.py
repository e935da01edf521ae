"""The OpenID Connect authentication backend (docs/design.md §20): mozilla-django-oidc's code flow (state, nonce,
PKCE, RS256 ID token checked against the provider's JWKS) with the checks it leaves out (the ID token's ``aud``
and ``iss``, the userinfo ``sub``), accounts keyed by issuer + subject, and the claim rules.

A sign-in that no enabled rule admits is refused before any account is created; the reason is left on the request
(``request.sso_refusal``) for the login page.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, NoReturn

import jwt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.core.exceptions import SuspiciousOperation
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from portal.core.services.audit import audit
from portal.sso import discovery, rules
from portal.sso.models import CampusIdentity

log = logging.getLogger(__name__)

NOT_ADMITTED = ("Your campus account signed in, but it gives no access to this portal: no sign-in rule matches "
                "your affiliation or groups. Ask a campus admin to add you.")
NO_SUBJECT = "The campus sign-in service sent no subject (sub) for your account."
USERNAME_CHARS = re.compile(r"[^\w.@+-]")
USERNAME_MAX = 150


class SignInRefused(SuspiciousOperation):
    """The provider vouched for the person, but the portal does not let them in (no rule admits them)."""


def issuer_of(payload: Mapping[str, Any]) -> str:
    """The issuer accounts are keyed by: the configured one, else the ID token's own ``iss``."""
    return getattr(settings, "RECLAIMNET_OIDC_ISSUER", "") or str(payload.get("iss") or "")


def username_from(claims: Mapping[str, Any]) -> str:
    """``preferred_username``, else the e-mail, else ``campus-user``, cut to Django's username characters."""
    raw = str(claims.get("preferred_username") or claims.get("email") or "campus-user")
    name = USERNAME_CHARS.sub("", unicodedata.normalize("NFKC", raw).replace(" ", "-")).lower()
    return (name or "campus-user")[: USERNAME_MAX - 8]


def unique_username(base: str) -> str:
    """``base``, or ``base-2``, ``base-3`` … : the first that no account has (local accounts are never taken
    over by a campus identity that happens to share their name)."""
    users = get_user_model().objects
    if not users.filter(username__iexact=base).exists():
        return base
    suffix = 2
    while users.filter(username__iexact=f"{base}-{suffix}").exists():
        suffix += 1
    return f"{base}-{suffix}"


class CampusOIDCBackend(OIDCAuthenticationBackend):
    """Signs in with the campus identity provider; see the module docstring."""

    get_settings = staticmethod(discovery.oidc_setting)
    request: HttpRequest

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> AbstractUser | None:
        # Only the callback view passes a nonce: a password sign-in that happens to carry ?code=&state= is not ours.
        if request is None or "nonce" not in kwargs:
            return None
        return super().authenticate(request, **kwargs)

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        """mozilla-django-oidc checks the signature, expiry and nonce; the audience must also be this client
        (OpenID Connect Core §3.1.3.7) and the issuer the configured one."""
        try:
            payload = super().verify_token(token, **kwargs)
        except jwt.InvalidTokenError as exc:  # expired, not yet valid, malformed: mozilla lets these through
            raise SuspiciousOperation(f"ID token refused: {exc}") from exc
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation(f"ID token audience {audience!r} is not this client")
        if len(audiences) > 1 and payload.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation("ID token with several audiences is not authorised for this client (azp)")
        issuer = getattr(settings, "RECLAIMNET_OIDC_ISSUER", "")
        if issuer and str(payload.get("iss", "")).rstrip("/") != issuer:
            raise SuspiciousOperation(f"ID token issuer {payload.get('iss')!r} is not {issuer!r}")
        return payload

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The ID token's claims updated with the userinfo endpoint's, whose ``sub`` must be the ID token's
        (OpenID Connect Core §5.3.2)."""
        userinfo = super().get_userinfo(access_token, id_token, payload)
        if str(userinfo.get("sub")) != str(payload.get("sub")):
            raise SuspiciousOperation("userinfo sub differs from the ID token's")
        return {**payload, **userinfo, "iss": payload.get("iss")}

    def refuse(self, message: str) -> NoReturn:
        self.request.sso_refusal = message  # type: ignore[attr-defined]
        raise SignInRefused(message)

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> AbstractUser | None:
        return self.sign_in(self.get_userinfo(access_token, id_token, payload))

    def sign_in(self, claims: dict[str, Any]) -> AbstractUser:
        """The account these verified claims sign in to, created at the first sign-in, its memberships brought in
        line with the rules; ``SignInRefused`` when no rule admits them."""
        subject = str(claims.get("sub") or "")
        if not subject:
            self.refuse(NO_SUBJECT)
        issuer = issuer_of(claims)
        decision = rules.decide(claims)
        try:
            user = self._sign_in(claims, issuer, subject, decision)
        except IntegrityError:
            # A first sign-in of the same person (or of a namesake) committed between our read and our insert:
            # the second pass finds that identity, or the next free username.
            log.info("campus sign-in of %s @ %s raced another: trying once more", subject, issuer)
            user = self._sign_in(claims, issuer, subject, decision)
        if user is None or not decision.admitted:
            log.info("campus sign-in refused for %s @ %s: no rule matches claims %s", subject, issuer, sorted(claims))
            self.refuse(NOT_ADMITTED)
        return user

    def _sign_in(self, claims: dict[str, Any], issuer: str, subject: str,
                 decision: rules.Decision) -> AbstractUser | None:
        """One transaction: find (or, when admitted, create) the account of issuer + subject and bring its
        rule-granted memberships in line with ``decision``; ``None`` when nobody is signed in."""
        with transaction.atomic():
            identity = (CampusIdentity.objects.select_for_update()
                        .filter(issuer=issuer, subject=subject).first())
            if identity is not None:
                user = get_user_model().objects.select_for_update().get(pk=identity.user_id)
                applied = rules.apply(user, decision.targets)  # nothing admitted: every rule grant is withdrawn
                identity.last_claims = _keepable(claims)
                if decision.admitted:
                    identity.last_login_at = timezone.now()
                    self.update_user(user, claims)
                identity.save()
                audit(user, "sso.login" if decision.admitted else "sso.refused", user, subject=subject,
                      rules=[rule.pk for rule in decision.matched], added=applied.added, removed=applied.removed)
                return user
            if not decision.admitted:
                return None
            user = self.create_user(claims)
            CampusIdentity.objects.create(user=user, issuer=issuer, subject=subject,
                                          last_login_at=timezone.now(), last_claims=_keepable(claims))
            applied = rules.apply(user, decision.targets)
            audit(user, "sso.account_created", user, subject=subject,
                  rules=[rule.pk for rule in decision.matched], added=applied.added)
            return user

    def create_user(self, claims: Mapping[str, Any]) -> AbstractUser:
        user = get_user_model().objects.create_user(
            unique_username(username_from(claims)), email=str(claims.get("email") or ""),
            first_name=str(claims.get("given_name") or "")[:150], last_name=str(claims.get("family_name") or "")[:150])
        user.set_unusable_password()  # signs in through the campus only (an admin may set a password)
        user.save(update_fields=["password"])
        return user

    def update_user(self, user: AbstractUser, claims: Mapping[str, Any]) -> AbstractUser:
        """Keep the e-mail and names the provider sends (the username never changes)."""
        fields = {"email": str(claims.get("email") or ""), "first_name": str(claims.get("given_name") or "")[:150],
                  "last_name": str(claims.get("family_name") or "")[:150]}
        changed = [name for name, value in fields.items() if value and getattr(user, name) != value]
        for name in changed:
            setattr(user, name, fields[name])
        if changed:
            user.save(update_fields=changed)
        return user

    def filter_users_by_claims(self, claims: Mapping[str, Any]) -> Any:
        """Accounts are found by issuer + subject (``get_or_create_user``), never by e-mail."""
        return get_user_model().objects.filter(
            campus_identities__issuer=issuer_of(claims), campus_identities__subject=str(claims.get("sub") or ""))

    def verify_claims(self, claims: Mapping[str, Any]) -> bool:
        return bool(claims.get("sub")) and rules.decide(claims).admitted


def _keepable(claims: Mapping[str, Any]) -> dict[str, Any]:
    """The claims minus token bookkeeping, for the admin page of the identity."""
    skip = {"nonce", "at_hash", "c_hash", "auth_time", "iat", "exp", "nbf", "jti", "sid"}
    return {key: value for key, value in claims.items() if key not in skip}
