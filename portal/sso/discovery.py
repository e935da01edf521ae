"""The identity provider's endpoints: explicit settings first, else its OpenID discovery document
(``<issuer>/.well-known/openid-configuration``), fetched on first use and kept per process for
``RECLAIMNET_OIDC_DISCOVERY_MAX_AGE_S`` (docs/design.md §20). The document's ``issuer`` must be the configured one
and every endpoint in it must pass the same https rule as the settings.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from mozilla_django_oidc.utils import import_from_settings

from portal.sso.config import check_url

# mozilla-django-oidc setting (or ours) -> the discovery document's key.
DISCOVERED = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
    "RECLAIMNET_OIDC_END_SESSION_ENDPOINT": "end_session_endpoint",
}
OPTIONAL = {"RECLAIMNET_OIDC_END_SESSION_ENDPOINT"}


class ProviderUnavailableError(Exception):
    """The identity provider's discovery document could not be read or is not acceptable."""


_lock = threading.Lock()
_cache: dict[str, tuple[float, dict[str, Any]]] = {}  # issuer -> (fetched at, document)


def forget() -> None:
    """Drop the cached documents (tests that start a new provider)."""
    with _lock:
        _cache.clear()


def document(issuer: str) -> dict[str, Any]:
    """The discovery document of ``issuer``, from the process cache while younger than the max age. A refresh that
    fails keeps serving the previous document; a first fetch that fails raises ``ProviderUnavailableError``."""
    max_age_s = float(getattr(settings, "RECLAIMNET_OIDC_DISCOVERY_MAX_AGE_S", 3600.0))
    with _lock:
        cached = _cache.get(issuer)
    if cached and time.monotonic() - cached[0] < max_age_s:
        return cached[1]
    try:
        doc = _fetch(issuer)
    except ProviderUnavailableError:
        if cached:
            return cached[1]
        raise
    with _lock:
        _cache[issuer] = (time.monotonic(), doc)
    return doc


def _fetch(issuer: str) -> dict[str, Any]:
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=float(getattr(settings, "OIDC_TIMEOUT", 10.0)))
        response.raise_for_status()
        doc = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailableError(f"discovery document {url}: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("issuer", "").rstrip("/") != issuer:
        raise ProviderUnavailableError(f"discovery document {url} names issuer {doc.get('issuer')!r}, not {issuer!r}")
    allow_http = bool(getattr(settings, "RECLAIMNET_OIDC_ALLOW_HTTP", False))
    for setting, key in DISCOVERED.items():
        value = doc.get(key)
        if not value:
            if setting not in OPTIONAL:
                raise ProviderUnavailableError(f"discovery document {url} has no {key}")
            continue
        try:
            check_url(f"{key} of {url}", str(value), allow_http)
        except ImproperlyConfigured as exc:
            raise ProviderUnavailableError(str(exc)) from exc
    algorithms = doc.get("id_token_signing_alg_values_supported") or []
    if "RS256" not in algorithms:
        raise ProviderUnavailableError(f"{url}: the provider does not sign ID tokens with RS256 ({algorithms})")
    return doc


def oidc_setting(attr: str, *default: Any) -> Any:
    """mozilla-django-oidc's ``get_settings``, with the endpoints left empty in the settings read from the
    issuer's discovery document."""
    if attr in DISCOVERED and not getattr(settings, attr, ""):
        issuer = getattr(settings, "RECLAIMNET_OIDC_ISSUER", "")
        if issuer:
            value = document(issuer).get(DISCOVERED[attr]) or ""
            if value or attr in OPTIONAL:
                return value
        if attr in OPTIONAL:
            return ""
    return import_from_settings(attr, *default)
