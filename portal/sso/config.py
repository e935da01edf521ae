"""Campus sign-in settings from the environment (docs/design.md §20). Imported by ``portal/settings.py``: it reads
the environment only (no models, no network) and fails loudly on a half or unsafe configuration.

OpenID Connect is off unless configured: a client id and secret, plus either ``RECLAIMNET_OIDC_ISSUER`` (the
endpoints are then read from its discovery document on first use, ``portal/sso/discovery.py``) or the explicit
authorization, token, userinfo and JWKS endpoints. Every URL must be https; plain http is accepted only with
``RECLAIMNET_OIDC_ALLOW_HTTP=1`` and only on a loopback host (the test suite's identity provider).
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from portal.env import env_bool, env_float, env_str

# Environment variable of each endpoint -> the mozilla-django-oidc setting it fills (None: our own setting).
ENDPOINT_VARIABLES = {
    "RECLAIMNET_OIDC_AUTHORIZATION_ENDPOINT": "OIDC_OP_AUTHORIZATION_ENDPOINT",
    "RECLAIMNET_OIDC_TOKEN_ENDPOINT": "OIDC_OP_TOKEN_ENDPOINT",
    "RECLAIMNET_OIDC_USERINFO_ENDPOINT": "OIDC_OP_USER_ENDPOINT",
    "RECLAIMNET_OIDC_JWKS_ENDPOINT": "OIDC_OP_JWKS_ENDPOINT",
    "RECLAIMNET_OIDC_END_SESSION_ENDPOINT": "RECLAIMNET_OIDC_END_SESSION_ENDPOINT",
}
REQUIRED_WITHOUT_ISSUER = ("RECLAIMNET_OIDC_AUTHORIZATION_ENDPOINT", "RECLAIMNET_OIDC_TOKEN_ENDPOINT",
                           "RECLAIMNET_OIDC_USERINFO_ENDPOINT", "RECLAIMNET_OIDC_JWKS_ENDPOINT")
LOOPBACK_NAMES = {"localhost"}


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_url(name: str, url: str, allow_http: bool) -> str:
    """``url`` if it is an absolute https URL (or http on a loopback host with ``allow_http``), else raise
    ``ImproperlyConfigured`` naming the variable."""
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ImproperlyConfigured(f"{name} must be an absolute https URL, got {url!r}")
    if parts.scheme == "http":
        if not allow_http:
            raise ImproperlyConfigured(
                f"{name} must use https, got {url!r} (RECLAIMNET_OIDC_ALLOW_HTTP=1 allows http on loopback, for tests)")
        if not is_loopback(parts.hostname):
            raise ImproperlyConfigured(f"{name}: plain http is allowed on a loopback host only, got {url!r}")
    return url


def oidc_settings() -> dict[str, Any]:
    """The Django settings for campus sign-in: ``RECLAIMNET_OIDC_ENABLED`` and, when on, mozilla-django-oidc's
    ``OIDC_*`` settings and ours (``RECLAIMNET_OIDC_*``)."""
    issuer = (env_str("RECLAIMNET_OIDC_ISSUER", "") or "").rstrip("/")
    client_id = env_str("RECLAIMNET_OIDC_CLIENT_ID", "") or ""
    client_secret = env_str("RECLAIMNET_OIDC_CLIENT_SECRET", "") or ""
    endpoints = {name: env_str(name, "") or "" for name in ENDPOINT_VARIABLES}
    allow_http = env_bool("RECLAIMNET_OIDC_ALLOW_HTTP", False)
    configured = bool(issuer or client_id or client_secret or any(endpoints.values()))
    out: dict[str, Any] = {"RECLAIMNET_OIDC_ENABLED": False, "RECLAIMNET_OIDC_CAMPUS_NAME": "",
                           "RECLAIMNET_OIDC_ISSUER": "", "RECLAIMNET_OIDC_FORM_ACTION_ORIGINS": []}
    if not configured:
        return out
    missing = [name for name, value in (("RECLAIMNET_OIDC_CLIENT_ID", client_id),
                                        ("RECLAIMNET_OIDC_CLIENT_SECRET", client_secret)) if not value]
    if not issuer:
        missing += [name for name in REQUIRED_WITHOUT_ISSUER if not endpoints[name]]
    if missing:
        raise ImproperlyConfigured(
            "campus sign-in is half configured: set " + ", ".join(missing)
            + " (or unset every RECLAIMNET_OIDC_* variable to turn it off)")
    if issuer:
        check_url("RECLAIMNET_OIDC_ISSUER", issuer, allow_http)
    for name, value in endpoints.items():
        if value:
            check_url(name, value, allow_http)
    timeout_s = env_float("RECLAIMNET_OIDC_TIMEOUT_S", 5.0)
    if not 0 < timeout_s <= 120:
        raise ImproperlyConfigured(f"RECLAIMNET_OIDC_TIMEOUT_S must be in (0, 120], got {timeout_s}")
    scopes = (env_str("RECLAIMNET_OIDC_SCOPES", "") or "openid email profile").split()
    if "openid" not in scopes:
        raise ImproperlyConfigured(f"RECLAIMNET_OIDC_SCOPES must include openid, got {' '.join(scopes)!r}")
    out.update({
        "RECLAIMNET_OIDC_ENABLED": True,
        "RECLAIMNET_OIDC_ISSUER": issuer,  # "" with explicit endpoints: the ID token's iss is then not compared
        "RECLAIMNET_OIDC_ALLOW_HTTP": allow_http,
        "RECLAIMNET_OIDC_CAMPUS_NAME": env_str("RECLAIMNET_OIDC_CAMPUS_NAME", "") or "your campus account",
        "RECLAIMNET_OIDC_DISCOVERY_MAX_AGE_S": env_float("RECLAIMNET_OIDC_DISCOVERY_MAX_AGE_S", 3600.0),
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": client_secret,
        "OIDC_RP_SIGN_ALGO": "RS256",  # asymmetric only: the key comes from the provider's JWKS
        "OIDC_RP_SCOPES": " ".join(scopes),
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": env_bool("RECLAIMNET_OIDC_USE_PKCE", True),
        "OIDC_TIMEOUT": timeout_s,
        "OIDC_VERIFY_SSL": True,
        "OIDC_STORE_ID_TOKEN": True,  # the id_token_hint of the provider's end-session request
        "OIDC_CREATE_USER": True,
        "OIDC_OP_LOGOUT_URL_METHOD": "portal.sso.views.provider_logout_url",
        "OIDC_CALLBACK_CLASS": "portal.sso.views.CallbackView",
        "OIDC_AUTHENTICATE_CLASS": "portal.sso.views.AuthenticateView",
        "LOGIN_REDIRECT_URL_FAILURE": "/accounts/login/",
        "OIDC_REDIRECT_ALLOWED_HOSTS": [],
    })
    for name, value in endpoints.items():
        out[ENDPOINT_VARIABLES[name]] = value  # "" = read from the issuer's discovery document
    # The sign-out form's answer redirects to the provider's end-session endpoint: CSP form-action must allow it.
    origins = {_origin(url) for url in (issuer, endpoints["RECLAIMNET_OIDC_END_SESSION_ENDPOINT"]) if url}
    out["RECLAIMNET_OIDC_FORM_ACTION_ORIGINS"] = sorted(origins)
    return out


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
