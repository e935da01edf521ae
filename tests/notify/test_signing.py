"""Webhook signatures (design §12): HMAC-SHA256 over ``timestamp.body``, checked in constant time."""

from __future__ import annotations

import hashlib
import hmac

from portal.notify import signing


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body_with_the_secret() -> None:
    headers = signing.sign("whsec_x", b'{"text":"hi"}', now_s=1_700_000_000)
    expected = hmac.new(b"whsec_x", b'1700000000.{"text":"hi"}', hashlib.sha256).hexdigest()
    assert headers == {"X-ReclaimNet-Timestamp": "1700000000", "X-ReclaimNet-Signature": f"v1={expected}"}


def test_a_receiver_accepts_the_signed_body_and_refuses_a_changed_one_or_another_secret() -> None:
    body = b'{"text":"Your job moved"}'
    h = signing.sign("s3cret", body, now_s=1000)
    ts, sig = h[signing.TIMESTAMP_HEADER], h[signing.SIGNATURE_HEADER]
    assert signing.verify("s3cret", ts, body, sig, now_s=1000)
    assert not signing.verify("s3cret", ts, body + b" ", sig, now_s=1000)
    assert not signing.verify("other", ts, body, sig, now_s=1000)
    assert not signing.verify("s3cret", str(int(ts) + 1), body, sig, now_s=1000)  # the timestamp is signed too


def test_an_old_timestamp_is_refused_as_a_replay_and_a_rotated_list_of_signatures_is_accepted() -> None:
    body = b"{}"
    h = signing.sign("k", body, now_s=1000)
    ts, sig = h[signing.TIMESTAMP_HEADER], h[signing.SIGNATURE_HEADER]
    assert not signing.verify("k", ts, body, sig, now_s=1000 + 301)
    assert signing.verify("k", ts, body, f"v1=deadbeef, {sig}", now_s=1001)
    assert not signing.verify("k", "not-a-number", body, sig, now_s=1000)


def test_secrets_are_fresh_and_long() -> None:
    a, b = signing.new_secret(), signing.new_secret()
    assert a != b and a.startswith("whsec_") and len(a) > 40
