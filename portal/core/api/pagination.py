"""List pagination with bounds: ``?limit=`` and ``?offset=`` beyond what the database can hold are clamped,
never passed on (a bigint overflow answered 500 on every list endpoint)."""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

MAX_OFFSET = 2**62


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000

    def get_offset(self, request: Request) -> int:
        return min(super().get_offset(request), MAX_OFFSET)
