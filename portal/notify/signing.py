"""Webhook signatures (docs/design.md §12): HMAC-SHA256 over ``timestamp + "." + body``.

A receiver reads ``X-ReclaimNet-Timestamp`` and ``X-ReclaimNet-Signature: v1=<hex>``, recomputes the HMAC with
the secret it was shown once, compares in constant time and refuses timestamps older than a few minutes (a
replayed request). Pure: no Django."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

TIMESTAMP_HEADER = "X-ReclaimNet-Timestamp"
SIGNATURE_HEADER = "X-ReclaimNet-Signature"
EVENT_HEADER = "X-ReclaimNet-Event"
DELIVERY_HEADER = "X-ReclaimNet-Delivery"
VERSION = "v1"
DEFAULT_TOLERANCE_S = 300.0


def new_secret() -> str:
    """A fresh webhook secret (shown to its owner once)."""
    return "whsec_" + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``v1=<hex>``: HMAC-SHA256 of ``timestamp.body`` keyed with ``secret``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"{VERSION}={mac.hexdigest()}"


def sign(secret: str, body: bytes, now_s: float | None = None) -> dict[str, str]:
    """The two signature headers for ``body`` sent now."""
    timestamp = str(int(time.time() if now_s is None else now_s))
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: signature(secret, timestamp, body)}


def verify(secret: str, timestamp: str, body: bytes, header: str, *, now_s: float | None = None,
           tolerance_s: float = DEFAULT_TOLERANCE_S) -> bool:
    """Whether ``header`` (one or more comma-separated ``v1=<hex>``) signs ``body`` at ``timestamp`` with
    ``secret``, and the timestamp is within ``tolerance_s`` of now."""
    try:
        sent_at = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs((time.time() if now_s is None else now_s) - sent_at) > tolerance_s:
        return False
    expected = signature(secret, timestamp, body)
    return any(hmac.compare_digest(expected, part.strip()) for part in (header or "").split(","))
