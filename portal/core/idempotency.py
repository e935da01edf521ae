"""Safe retries: a create request sent again with the same key gets the first answer, not a second row
(docs/design.md §8).

The API takes an ``Idempotency-Key`` header (``portal.core.api.idempotency``), the web forms a one-time
``submit_token`` (``portal.web.views.common.submit_once``); both land here. The key is reserved with an INSERT
in the same transaction as the change it guards, so the key and the rows it created commit together or not at
all: a concurrent twin waits on the unique index and then replays the committed answer; a request that failed
(4xx, an exception) rolls its key back and may be retried. Keys are kept ``KEEP_S`` (24 h). Stored answers are
encrypted with a key derived from ``SECRET_KEY``: a node registration's answer carries its one-time agent token,
which must not sit in the database in clear.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.core.models.outbox import IdempotencyKey

KEEP_S = 24 * 3600.0
MAX_KEY_LENGTH = 200


class KeyReusedError(Exception):
    """The key was first used with another request (body or path): refused, nothing done."""


class KeyInProgressError(Exception):
    """The key's first request has not finished (it can only be seen from outside its transaction on a
    database without row-level waits); retry shortly."""


@dataclass(frozen=True)
class StoredAnswer:
    status: int
    body: Any
    location: str


def request_digest(scope: str, payload: Any) -> str:
    """SHA-256 over the scope (method and path) and the request body in canonical JSON."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{scope}\n{canonical}".encode()).hexdigest()


def _fernet() -> Fernet:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"reclaimnet idempotency answers", info=b"").derive(
        str(settings.SECRET_KEY).encode())
    return Fernet(base64.urlsafe_b64encode(key))


def reserve(user: Any, key: str, scope: str, digest: str) -> StoredAnswer | None:
    """Inside the caller's transaction: reserve ``key`` for ``user`` (None: go ahead, then :func:`record`), or
    return the answer of the request that used it first. Raises :class:`KeyReusedError` for another request."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("reserve() must run inside the transaction of the change it guards")
    first = None
    for _ in range(3):
        if _insert_if_absent(user, key, scope, digest):
            return None
        first = IdempotencyKey.objects.filter(user=user, key=key).first()
        if first is not None and first.created_at < timezone.now() - dt.timedelta(seconds=KEEP_S):
            IdempotencyKey.objects.filter(pk=first.pk).delete()  # expired: the key is free again
            first = None
        if first is not None:
            break
    if first is None:  # taken and freed under us three times: let the client come back
        raise KeyInProgressError(key)
    if first.request_sha256 != digest:
        raise KeyReusedError(key)
    if first.response_status is None:
        raise KeyInProgressError(key)
    try:
        body = json.loads(_fernet().decrypt(first.response_ciphertext.encode())) if first.response_ciphertext \
            else None
    except InvalidToken:  # SECRET_KEY rotated since: the answer cannot be replayed, the key still holds
        body = {"detail": "This request was already carried out; its answer is no longer available."}
    return StoredAnswer(first.response_status, body, first.response_location)


_INSERT_COLUMNS = ("user", "key", "scope", "request_sha256", "response_status", "response_ciphertext",
                   "response_location", "created_at")


def _insert_if_absent(user: Any, key: str, scope: str, digest: str) -> bool:
    """Insert the key's row unless ``(user, key)`` has one; True when inserted.

    One statement (``INSERT … ON CONFLICT DO NOTHING``) where the ORM took four on every create (delete an
    expired row, savepoint, insert, release; docs/design.md §10). A concurrent twin's insert waits on the unique
    index until the first transaction ends, as before: it then inserts (the first rolled back) or finds the
    committed row. Other databases keep the savepoint and the IntegrityError."""
    conn = transaction.get_connection()
    if conn.vendor not in ("postgresql", "sqlite"):
        try:
            with transaction.atomic():
                IdempotencyKey.objects.create(user=user, key=key, scope=scope[:300], request_sha256=digest)
            return True
        except IntegrityError:
            return False
    values = {"user": user.pk, "key": key, "scope": scope[:300], "request_sha256": digest, "response_status": None,
              "response_ciphertext": "", "response_location": "", "created_at": timezone.now()}
    fields = [IdempotencyKey._meta.get_field(name) for name in _INSERT_COLUMNS]
    quote = conn.ops.quote_name
    sql = (f"INSERT INTO {quote(IdempotencyKey._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
           f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT DO NOTHING")
    with conn.cursor() as cursor:
        cursor.execute(sql, [f.get_db_prep_save(values[f.name], conn) for f in fields])
        return cursor.rowcount == 1


def record(user: Any, key: str, status: int, body: Any = None, location: str = "") -> None:
    """Store the answer for ``key`` (same transaction as :func:`reserve`)."""
    ciphertext = "" if body is None else _fernet().encrypt(
        json.dumps(body, default=str).encode()).decode()
    IdempotencyKey.objects.filter(user=user, key=key).update(
        response_status=status, response_ciphertext=ciphertext, response_location=location[:300])


def prune_expired() -> int:
    deleted, _ = IdempotencyKey.objects.filter(
        created_at__lt=timezone.now() - dt.timedelta(seconds=KEEP_S)).delete()
    return int(deleted)
