"""Read-model answers computed at most once per few seconds for the whole deployment and shared (design §9.1).

The admin dashboard, ``/api/summary/``, ``/metrics`` and ``/api/campus/topology/`` answer the same question for
everyone who may ask it. Each is computed by one request at most once per ``RECLAIMNET_DASHBOARD_MAX_AGE_S``
and kept whole in Django's cache (Redis in production, shared by every process): within the bound a read costs
no statement, and everything computed from one snapshot agrees with everything else computed from it. When the
snapshot is older than the bound, one request (the holder of a refresh lock) recomputes it while the others
still get the previous one; an entry is dropped ``RECLAIMNET_DASHBOARD_REFRESH_S`` after the bound, so nothing
older than their sum is ever served. A bound of 0 (the test suite's default) computes on every call.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import TypeVar, cast

from django.conf import settings
from django.core.cache import cache

log = logging.getLogger(__name__)
T = TypeVar("T")
_clock = time.time  # the tests inject theirs


def shared(key: str, compute: Callable[[], T]) -> T:
    """``compute()``'s answer, at most ``RECLAIMNET_DASHBOARD_MAX_AGE_S`` old, shared under ``key``. Without a
    cache to share it through (Redis down), computed for this call: the answer never depends on the cache."""
    clock = _clock
    max_age_s = float(settings.RECLAIMNET_DASHBOARD_MAX_AGE_S)
    if max_age_s <= 0:
        return compute()
    lock_key = key + ":refreshing"
    refresh_s = float(settings.RECLAIMNET_DASHBOARD_REFRESH_S)
    now_s = clock()
    try:
        cached = cache.get(key)
        if cached is not None and now_s - cached[0] <= max_age_s:
            return cast(T, cached[1])
        refreshing = cache.add(lock_key, 1, timeout=refresh_s)
    except Exception:  # the cache is unreachable: answer from the database, as with a bound of 0
        log.debug("shared snapshot %s: cache unavailable, computed for this call", key, exc_info=True)
        return compute()
    if cached is not None and not refreshing:
        return cast(T, cached[1])  # another request is refreshing it: this one is still in bounds
    try:
        data = compute()
    except BaseException:
        if refreshing:
            with contextlib.suppress(Exception):
                cache.delete(lock_key)
        raise
    try:
        newest = cache.get(key)
        if newest is None or newest[0] <= now_s:  # a slower, older computation never replaces a newer one
            # Dropped when max_age_s + refresh_s have passed since the numbers were read, whatever the build took.
            cache.set(key, (now_s, data), timeout=max(0.001, max_age_s + refresh_s - (clock() - now_s)))
        if refreshing:
            cache.delete(lock_key)
    except Exception:
        log.debug("shared snapshot %s: not stored", key, exc_info=True)
    return data
