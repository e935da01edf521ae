"""Campus sign-in without a provider running (docs/design.md §20): the settings read from the environment, the
claim rules' matching and validation, and the ID token checks mozilla-django-oidc leaves to us."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation, ValidationError
from django.test import override_settings

from portal.sso.backend import CampusOIDCBackend, unique_username, username_from
from portal.sso.config import oidc_settings
from portal.sso.models import ClaimRule, GrantKind, MatchKind
from portal.sso.rules import claim_values, decide, rule_matches

ROOT = Path(__file__).resolve().parents[2]
BASE_ENV = {"RECLAIMNET_OIDC_CLIENT_ID": "portal", "RECLAIMNET_OIDC_CLIENT_SECRET": "s3cret"}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in list(os.environ):
        if name.startswith("RECLAIMNET_OIDC_"):
            monkeypatch.delenv(name)

    def set_env(**values: str) -> dict[str, Any]:
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        return oidc_settings()
    return set_env


def test_off_unless_configured(env: Any) -> None:
    assert env()["RECLAIMNET_OIDC_ENABLED"] is False


def test_issuer_must_be_https(env: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="RECLAIMNET_OIDC_ISSUER must use https"):
        env(**BASE_ENV, RECLAIMNET_OIDC_ISSUER="http://127.0.0.1:9000/o")


def test_http_only_on_loopback_and_only_when_allowed(env: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="loopback host only"):
        env(**BASE_ENV, RECLAIMNET_OIDC_ISSUER="http://idp.campus.example/o", RECLAIMNET_OIDC_ALLOW_HTTP="1")
    assert env(RECLAIMNET_OIDC_ISSUER="http://127.0.0.1:9000/o")["RECLAIMNET_OIDC_ENABLED"] is True


def test_half_configured_names_what_is_missing(env: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="RECLAIMNET_OIDC_CLIENT_SECRET"):
        env(RECLAIMNET_OIDC_ISSUER="https://idp.campus.example", RECLAIMNET_OIDC_CLIENT_ID="portal")
    with pytest.raises(ImproperlyConfigured, match="RECLAIMNET_OIDC_JWKS_ENDPOINT"):
        env(**BASE_ENV, RECLAIMNET_OIDC_ISSUER="",
            RECLAIMNET_OIDC_AUTHORIZATION_ENDPOINT="https://idp.campus.example/authorize",
            RECLAIMNET_OIDC_TOKEN_ENDPOINT="https://idp.campus.example/token",
            RECLAIMNET_OIDC_USERINFO_ENDPOINT="https://idp.campus.example/userinfo")


def test_secret_from_a_file(env: Any, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("from-file\n")
    values = env(RECLAIMNET_OIDC_ISSUER="https://idp.campus.example/", RECLAIMNET_OIDC_CLIENT_ID="portal",
                 RECLAIMNET_OIDC_CLIENT_SECRET_FILE=str(secret))
    assert values["OIDC_RP_CLIENT_SECRET"] == "from-file"
    assert values["RECLAIMNET_OIDC_ISSUER"] == "https://idp.campus.example"
    assert values["OIDC_RP_SIGN_ALGO"] == "RS256" and values["OIDC_USE_PKCE"] and values["OIDC_USE_NONCE"]


def test_settings_module_turns_it_on() -> None:
    """The real settings module in a fresh process: the backend after the password ones, and the provider's
    origin allowed as a form target (the sign-out redirects there); no network at start-up."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RECLAIMNET_OIDC_")},
           "RECLAIMNET_OIDC_ISSUER": "https://idp.campus.example/realms/campus", **BASE_ENV,
           "DJANGO_SETTINGS_MODULE": "portal.settings"}
    code = ("import json; from django.conf import settings as s; print(json.dumps([s.AUTHENTICATION_BACKENDS, "
            "s.CONTENT_SECURITY_POLICY['DIRECTIVES']['form-action'], 'portal.sso' in s.INSTALLED_APPS]))")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    backends, form_action, installed = json.loads(done.stdout.strip().splitlines()[-1])
    assert backends[-1] == "portal.sso.backend.CampusOIDCBackend" and "ModelBackend" in backends[-2]
    assert form_action == ["'self'", "https://idp.campus.example"] and installed


def rule(**fields: Any) -> ClaimRule:
    return ClaimRule(**{"claim": "groups", "match": MatchKind.EQUALS, "value": "nlp", "action": GrantKind.STAFF,
                        **fields})


@pytest.mark.parametrize(("fields", "claims", "matches"), [
    ({}, {"groups": ["bio", "nlp"]}, True),
    ({}, {"groups": ["nlp-2026"]}, False),  # equals is the whole value
    ({}, {"groups": "nlp"}, True),  # a single value
    ({"match": MatchKind.CONTAINS}, {"groups": ["cs-nlp-lab"]}, True),
    ({"match": MatchKind.REGEX, "value": "nlp-[0-9]+"}, {"groups": ["nlp-2026"]}, True),
    ({"match": MatchKind.REGEX, "value": "nlp"}, {"groups": ["nlp-2026"]}, False),  # the whole value must match
    ({"value": "NLP"}, {"groups": ["nlp"]}, False),
    ({"value": "NLP", "ignore_case": True}, {"groups": ["nlp"]}, True),
    ({"claim": "email", "match": MatchKind.REGEX, "value": r".*@cs\.campus\.edu"}, {"email": "a@cs.campus.edu"}, True),
    ({"claim": "realm_access.roles"}, {"realm_access": {"roles": ["nlp"]}}, True),  # a nested claim
    ({"claim": "email_verified", "value": "true"}, {"email_verified": True}, True),
    ({}, {"other": ["nlp"]}, False),
    ({}, {"groups": {"nlp": 1}}, False),  # an object is no value
    ({"enabled": False}, {"groups": ["nlp"]}, False),
])
def test_rule_matching(fields: dict[str, Any], claims: dict[str, Any], matches: bool) -> None:
    one = rule(**fields)
    assert decide(claims, [one]).admitted is matches
    if one.enabled:
        assert rule_matches(one, claims) is matches


def test_claim_values_are_text() -> None:
    assert claim_values({"n": [1, True, None, "x", {"a": 1}]}, "n") == ["1", "true", "x"]


@pytest.mark.parametrize(("fields", "field"), [
    ({"match": MatchKind.REGEX, "value": "(unclosed"}, "value"),
    ({"claim": "has space"}, "claim"),
    ({"value": ""}, "value"),
    ({"action": GrantKind.LAB}, "provider"),
    ({"action": GrantKind.GROUP}, "research_group"),
    ({"action": GrantKind.STAFF, "provider_id": 1}, "provider"),
])
def test_rule_validation_names_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        rule(**fields).clean()
    assert list(caught.value.message_dict) == [field]


def test_username_is_sanitised() -> None:
    assert username_from({"preferred_username": "Ada Lovelace/../x", "email": "a@x"}) == "ada-lovelace..x"
    assert username_from({"email": "Bob@Campus.test"}) == "bob@campus.test"
    assert username_from({"preferred_username": "ü" * 300}).startswith("ü") and len(
        username_from({"preferred_username": "ü" * 300})) <= 142
    assert username_from({}) == "campus-user"


def test_unique_username(db: None) -> None:
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("ada")
    get_user_model().objects.create_user("ada-2")
    assert unique_username("ada") == "ada-3" and unique_username("zoe") == "zoe"


KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PUBLIC_PEM = KEY.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
ISSUER = "https://idp.campus.example"


def id_token(**claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": "portal", "sub": "42", "nonce": "n-1", "iat": now, "exp": now + 300, **claims}
    return jwt.encode(body, KEY, algorithm="RS256")


@pytest.mark.parametrize(("claims", "ok"), [
    ({}, True),
    ({"aud": ["portal", "other"], "azp": "portal"}, True),
    ({"aud": "another-client"}, False),
    ({"aud": ["portal", "other"]}, False),  # several audiences need azp = this client
    ({"iss": "https://evil.example"}, False),
    ({"nonce": "replayed"}, False),
    ({"exp": int(time.time()) - 60}, False),
])
def test_id_token_checks(claims: dict[str, Any], ok: bool) -> None:
    with override_settings(RECLAIMNET_OIDC_ENABLED=True, RECLAIMNET_OIDC_ISSUER=ISSUER, OIDC_RP_CLIENT_ID="portal",
                           OIDC_RP_CLIENT_SECRET="s", OIDC_RP_SIGN_ALGO="RS256", OIDC_RP_IDP_SIGN_KEY=PUBLIC_PEM,
                           OIDC_OP_TOKEN_ENDPOINT="https://idp.campus.example/token",
                           OIDC_OP_USER_ENDPOINT="https://idp.campus.example/userinfo",
                           OIDC_OP_JWKS_ENDPOINT="https://idp.campus.example/jwks"):
        backend = CampusOIDCBackend()
        if ok:
            assert backend.verify_token(id_token(**claims), nonce="n-1")["sub"] == "42"
        else:
            with pytest.raises(SuspiciousOperation):
                backend.verify_token(id_token(**claims), nonce="n-1")


def test_hs256_token_is_refused() -> None:
    secret = "a-client-secret-of-forty-characters-long"
    with override_settings(RECLAIMNET_OIDC_ISSUER=ISSUER, OIDC_RP_CLIENT_ID="portal", OIDC_RP_CLIENT_SECRET=secret,
                           OIDC_RP_SIGN_ALGO="RS256", OIDC_RP_IDP_SIGN_KEY=PUBLIC_PEM,
                           OIDC_OP_TOKEN_ENDPOINT="https://x/token", OIDC_OP_USER_ENDPOINT="https://x/userinfo",
                           OIDC_OP_JWKS_ENDPOINT="https://x/jwks"):
        forged = jwt.encode({"iss": ISSUER, "aud": "portal", "sub": "42", "nonce": "n-1"}, secret, algorithm="HS256")
        with pytest.raises(SuspiciousOperation, match="does not match"):
            CampusOIDCBackend().verify_token(forged, nonce="n-1")
