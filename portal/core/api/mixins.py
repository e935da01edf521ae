"""Translate service exceptions into API answers (one place, so every viewset answers alike)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, status
from rest_framework.generics import get_object_or_404
from rest_framework.response import Response

from portal.core.api import rows
from portal.core.lifecycle.base import ConcurrentTransition, InvalidTransition


class ServiceErrorsMixin:
    """Service ``ValidationError`` → 400 ``{field: [message]}``; refused or raced transition → 409."""

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, DjangoValidationError):
            detail: Any = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
            exc = exceptions.ValidationError(detail)
        elif isinstance(exc, InvalidTransition):
            return Response(
                {"detail": str(exc), "state": [str(exc)]},  # plain words (portal.core.lifecycle.labels)
                status=status.HTTP_409_CONFLICT,
            )
        elif isinstance(exc, ConcurrentTransition):
            return Response({"detail": "It changed meanwhile; reload it and try again."},
                            status=status.HTTP_409_CONFLICT)
        return super().handle_exception(exc)  # type: ignore[misc]


class RowListMixin:
    """``list`` and ``retrieve`` answered from plain rows (``portal/core/api/rows.py``) when the action's serializer
    has a row plan: the serializer's JSON without a model instance per object (docs/design.md §10). The object
    permissions of ``retrieve`` still see a model instance of the row (its other fields load on access)."""

    def list(self, request: Any, *args: Any, **kwargs: Any) -> Response:
        view: Any = self  # a GenericAPIView
        planned = rows.PLANS.get(view.get_serializer_class())
        if planned is None:
            return super().list(request, *args, **kwargs)  # type: ignore[misc]
        plan, build = planned
        queryset = plan.values(view.filter_queryset(view.get_queryset()))
        page = view.paginate_queryset(queryset)
        if page is None:
            return Response(build(list(queryset)))
        return view.get_paginated_response(build(page))

    def retrieve(self, request: Any, *args: Any, **kwargs: Any) -> Response:
        view: Any = self
        planned = rows.PLANS.get(view.get_serializer_class())
        if planned is None:
            return super().retrieve(request, *args, **kwargs)  # type: ignore[misc]
        plan, build = planned
        queryset = view.filter_queryset(view.get_queryset())
        lookup = {view.lookup_field: view.kwargs[view.lookup_url_kwarg or view.lookup_field]}
        values = get_object_or_404(plan.values(queryset), **lookup)  # as get_object(): 404 for a bad id too
        view.check_object_permissions(request, rows.instance(queryset.model, values, queryset.db))
        return Response(build([values])[0])
