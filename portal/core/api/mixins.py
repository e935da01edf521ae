"""Translate service exceptions into API answers (one place, so every viewset answers alike)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, status
from rest_framework.response import Response

from portal.core.lifecycle.base import ConcurrentTransition, InvalidTransition


class ServiceErrorsMixin:
    """Service ``ValidationError`` → 400 ``{field: [message]}``; refused or raced transition → 409."""

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, DjangoValidationError):
            detail: Any = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
            exc = exceptions.ValidationError(detail)
        elif isinstance(exc, InvalidTransition):
            return Response(
                {"detail": str(exc), "state": [f"Cannot go from {exc.current!r} to {exc.target!r}."]},
                status=status.HTTP_409_CONFLICT,
            )
        elif isinstance(exc, ConcurrentTransition):
            return Response({"detail": "The object changed meanwhile; reload and retry."},
                            status=status.HTTP_409_CONFLICT)
        return super().handle_exception(exc)  # type: ignore[misc]
