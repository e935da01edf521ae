"""Login lockout and bad-token throttling (docs/design.md §11).

Passwords: django-axes counts failed sign-ins in the database (``axes_accessattempt``), per account and per
address. ``RECLAIMNET_LOGIN_FAILURE_LIMIT`` failures (default 10) within the cool-off
(``RECLAIMNET_LOGIN_COOLOFF_S``, default 15 minutes) lock that account *and* that address until the cool-off has
passed since the last counted failure; attempts during a lockout are refused without being counted, so the
time the answer names stays true. This covers every caller of ``django.contrib.auth.authenticate`` with a
request: the sign-in page, the Django admin and ``/api/auth/token/``. The web answer is a 429 page that says
until when; an ``/api/`` answer is 429 JSON; both carry ``Retry-After``.

API tokens: ``ThrottledTokenAuthentication`` counts wrong ``Authorization: Token …`` values per address in
Django's cache (Redis when ``REDIS_URL`` is set, so every process shares the counts); past the same limit the
address gets 429 with ``Retry-After`` for the cool-off, whatever token it sends.

``RECLAIMNET_LOGIN_LOCKOUT=0`` (``AXES_ENABLED``) turns both off.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timedelta
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username
from axes.models import AccessAttempt
from django.conf import settings
from django.core.cache import cache
from django.db.models import Max, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from redis.exceptions import RedisError
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed, Throttled
from rest_framework.request import Request

from portal.core.security import client_address

log = logging.getLogger(__name__)

LOCKED_OUT = "Too many failed sign-ins for this account or from this address."
TOKENS_LOCKED_OUT = "Too many requests with a wrong API token from this address."


def failure_limit(request: Any = None, credentials: Any = None) -> int:
    """``AXES_FAILURE_LIMIT``: failures that lock an account or an address (and bad tokens an address)."""
    return int(settings.RECLAIMNET_LOGIN_FAILURE_LIMIT)


def cooloff(request: Any = None) -> timedelta:
    """``AXES_COOLOFF_TIME``: how long failures count, and how long a lockout lasts."""
    return timedelta(seconds=float(settings.RECLAIMNET_LOGIN_COOLOFF_S))


class LockoutBackend(AxesStandaloneBackend):
    """Axes' check before the password is tried. ``authenticate()`` without a request (management commands,
    scripts on the server) has no address to count by and is not network-reachable: it is let through."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     password: str | None = None, **kwargs: Any) -> None:
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)


class LockoutHandler(AxesDatabaseHandler):
    """Axes' database handler, also flagging Django's request when DRF's wrapped it (``/api/auth/token/``):
    axes flags the request it was given and ``AxesMiddleware`` only sees Django's."""

    def user_login_failed(self, sender: Any, credentials: dict[str, Any], request: Any = None,
                          **kwargs: Any) -> None:
        super().user_login_failed(sender, credentials, request, **kwargs)
        if isinstance(request, Request):
            inner = request._request
            inner.axes_locked_out = getattr(request, "axes_locked_out", False)
            inner.axes_credentials = getattr(request, "axes_credentials", None)


def locked_until(request: HttpRequest, credentials: dict[str, Any] | None) -> datetime:
    """When the lockout on this request's account or address lifts: the last counted failure of each locked
    one plus the cool-off (the later of the two when both are locked)."""
    window = cooloff(request)
    counted = AccessAttempt.objects.filter(attempt_time__gte=timezone.now() - window)
    username = get_client_username(request, credentials)
    lasts = []
    for rows in (counted.filter(username=username) if username else None,
                 counted.filter(ip_address=client_address(request))):
        if rows is None:
            continue
        agg = rows.aggregate(failures=Sum("failures_since_start"), last=Max("attempt_time"))
        if (agg["failures"] or 0) >= failure_limit() and agg["last"] is not None:
            lasts.append(agg["last"])
    return max(lasts, default=timezone.now()) + window


def lockout_response(request: HttpRequest, original_response: Any = None, credentials: Any = None) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: 429 with ``Retry-After`` and the time the lockout lifts; JSON under
    ``/api/``, the sign-in page's locked variant elsewhere. (Axes' async middleware passes the credentials
    in the second place: they are read from the request instead.)"""
    until = locked_until(request, getattr(request, "axes_credentials", None))
    retry_after_s = max(1, math.ceil((until - timezone.now()).total_seconds()))
    minutes = max(1, math.ceil(retry_after_s / 60))
    when = f"{until:%H:%M} UTC"
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({
            "detail": f"{LOCKED_OUT} Try again after {when} (in {minutes} min).",
            "retry_after_s": retry_after_s,
        }, status=429)
    else:
        response = render(request, "registration/locked_out.html",
                          {"message": LOCKED_OUT, "until": when, "minutes": minutes}, status=429)
    response["Retry-After"] = str(retry_after_s)
    return response


# --- Bad API tokens ---------------------------------------------------------------------------------------

def _now_s() -> float:
    """The clock of the token counters (tests move it)."""
    return time.time()


def _token_keys(address: str, now_s: float) -> tuple[str, str, str]:
    window_s = float(settings.RECLAIMNET_LOGIN_COOLOFF_S)
    bucket = int(now_s // window_s)
    return (f"rn:badtoken:{address}:{bucket}", f"rn:badtoken:{address}:{bucket - 1}",
            f"rn:badtoken-lock:{address}")


def token_lock_remaining_s(address: str) -> float:
    """Seconds until ``address`` may try tokens again (0 when it may now)."""
    now_s = _now_s()
    try:
        until_s = cache.get(_token_keys(address, now_s)[2])
    except (RedisError, OSError):
        log.warning("bad-token counters unreachable: not throttling %s", address)
        return 0.0
    return max(0.0, float(until_s) - now_s) if until_s is not None else 0.0


def note_token_failure(address: str) -> float:
    """Count one wrong token from ``address``; lock it for the cool-off once the failures of this and the
    previous cool-off-long bucket reach the limit. Returns the seconds the address is now locked for."""
    now_s = _now_s()
    window_s = float(settings.RECLAIMNET_LOGIN_COOLOFF_S)
    current, previous, lock = _token_keys(address, now_s)
    try:
        cache.add(current, 0, timeout=int(2 * window_s) + 60)
        failures = cache.incr(current) + int(cache.get(previous) or 0)
        if failures >= failure_limit():
            cache.add(lock, now_s + window_s, timeout=int(window_s) + 60)
    except (RedisError, OSError, ValueError):
        log.warning("bad-token counters unreachable: not counting %s", address)
        return 0.0
    return token_lock_remaining_s(address)


class ThrottledTokenAuthentication(TokenAuthentication):
    """DRF's ``Authorization: Token …`` authentication, answering 429 + ``Retry-After`` to an address that
    sent too many wrong tokens (a client spraying guesses). Requests without a token header are untouched."""

    def authenticate(self, request: Request) -> Any:
        sends_token = request.META.get("HTTP_AUTHORIZATION", "").lower().startswith(self.keyword.lower() + " ")
        if not sends_token or not settings.AXES_ENABLED:  # RECLAIMNET_LOGIN_LOCKOUT=0 turns both off
            return super().authenticate(request)
        address = client_address(request)
        wait_s = token_lock_remaining_s(address)
        if wait_s > 0:
            raise Throttled(wait=math.ceil(wait_s), detail=TOKENS_LOCKED_OUT)
        try:
            return super().authenticate(request)
        except AuthenticationFailed:
            wait_s = note_token_failure(address)
            if wait_s > 0:
                raise Throttled(wait=math.ceil(wait_s), detail=TOKENS_LOCKED_OUT) from None
            raise
