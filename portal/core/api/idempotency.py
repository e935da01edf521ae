"""``Idempotency-Key`` on the API's create endpoints (docs/design.md §8; the rules live in
``portal.core.idempotency``).

The same key with the same method, path and body answers the first answer again (same status and body, header
``Idempotent-Replayed: true``) and creates nothing; the same key with another request answers 422 naming the
header. Keys are per user and kept 24 hours; a request that failed (4xx) keeps no key, so it may be retried.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from portal.core import idempotency

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MARKER = "reclaimnet_idempotent"  # set on wrapped view methods; the schema documents the header from it

PARAMETER = OpenApiParameter(
    HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    description="Makes the request safe to retry: the same key and body within 24 h replay the first answer "
                "and create nothing; the same key with another body answers 422.")


def _problem(message: str, code: int) -> Response:
    return Response({HEADER: [message]}, status=code)


def idempotent(view: Callable[..., Response]) -> Callable[..., Response]:
    """Wrap a DRF view method (``create`` or a POST ``@action``)."""

    @functools.wraps(view)
    def wrapper(self: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.headers.get(HEADER)
        if key is None:
            return view(self, request, *args, **kwargs)
        key = key.strip()
        if not key or len(key) > idempotency.MAX_KEY_LENGTH or not key.isascii() or not key.isprintable():
            return _problem(f"Send 1 to {idempotency.MAX_KEY_LENGTH} printable ASCII characters.",
                            status.HTTP_400_BAD_REQUEST)
        scope = f"{request.method} {request.path}"
        digest = idempotency.request_digest(scope, request.data)
        with transaction.atomic():
            try:
                stored = idempotency.reserve(request.user, key, scope, digest)
            except idempotency.KeyReusedError:
                return _problem(f"Key {key!r} was already used with a different request; use a new key for a "
                                "new request.", status.HTTP_422_UNPROCESSABLE_ENTITY)
            except idempotency.KeyInProgressError:
                response = _problem("A request with this key is still being carried out; retry shortly.",
                                    status.HTTP_409_CONFLICT)
                response["Retry-After"] = "1"
                return response
            if stored is not None:
                return Response(stored.body, status=stored.status,
                                headers={REPLAYED_HEADER: "true", HEADER: key})
            response = view(self, request, *args, **kwargs)
            if response.status_code >= 400:
                transaction.set_rollback(True)  # nothing was created; the key is not kept either
                return response
            idempotency.record(request.user, key, response.status_code, response.data)
        response[HEADER] = key
        return response

    setattr(wrapper, MARKER, True)
    return wrapper
