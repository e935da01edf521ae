"""Security by default (docs/design.md §11): the client's address and the Content-Security-Policy.

The settings themselves (``SECURE_*``, HSTS, cookies, the policy) are read from the environment in the
``Security`` block at the end of ``portal/settings.py``.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from csp.constants import NONCE, SELF
from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase

# The API docs pages (drf-spectacular's Swagger UI and ReDoc) are served entirely by the portal: their scripts and
# styles from its static files (drf-spectacular-sidecar), their inline <script>/<style> carrying this request's
# nonce (portal/templates/drf_spectacular/). They get the strict policy plus the nonce, and ReDoc its search worker
# (a blob: URL) — no 'unsafe-inline' script, no other origin. Only these two pages get it.
DOCS_POLICIES: dict[str, dict[str, list[str]]] = {
    "api-docs": {
        "script-src": [SELF, NONCE],
        "style-src": [SELF, NONCE],
    },
    "api-redoc": {
        "script-src": [SELF, NONCE],
        "style-src": [SELF, NONCE],
        "worker-src": [SELF, "blob:"],
    },
}
DOCS_URL_NAMES = frozenset(DOCS_POLICIES)


NO_ADDRESS = "0.0.0.0"  # a request with no address at all (daphne on a Unix socket sets no REMOTE_ADDR)


def client_address(request: Any) -> str:
    """The address a request came from: ``REMOTE_ADDR``, or, behind ``RECLAIMNET_TRUSTED_PROXY_COUNT``
    reverse proxies, the address the outermost of them saw (the entry that many places from the right of
    ``X-Forwarded-For``; entries further left are whatever the client wrote and are never trusted).

    Accepts Django's request or DRF's (which proxies ``META``). Login lockout and bad-token throttling key
    their counters on this.
    """
    remote = _ip_or_none(request.META.get("REMOTE_ADDR")) or NO_ADDRESS
    proxies = int(getattr(settings, "RECLAIMNET_TRUSTED_PROXY_COUNT", 0))
    if proxies <= 0:
        return remote
    hops = [hop.strip() for hop in str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",") if hop.strip()]
    if len(hops) < proxies:
        return remote  # fewer hops than proxies: the request did not come through them all
    return _ip_or_none(hops[-proxies]) or remote  # a proxy that wrote no address vouches for nothing


def _ip_or_none(text: Any) -> str | None:
    """``text`` as a normalised IP address, or None if it is not one (lockout counters are keyed on it)."""
    try:
        return str(ipaddress.ip_address(str(text).strip()))
    except ValueError:
        return None


class PortalCSPMiddleware(CSPMiddleware):
    """django-csp's middleware with one exception: the API docs pages get ``DOCS_POLICIES`` (see above)."""

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        match = getattr(request, "resolver_match", None)
        if match is not None and match.url_name in DOCS_URL_NAMES:
            parts.replace = {**(parts.replace or {}), **DOCS_POLICIES[match.url_name]}
        return parts
