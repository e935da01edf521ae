"""List pagination with bounds: ``?limit=`` and ``?offset=`` must be whole numbers (anything else answers 400
naming the parameter, as the schema says); values beyond what the database can hold are clamped, never passed
on (a bigint overflow answered 500 on every list endpoint). The page is read first and ``count`` is counted
only when the page does not already tell it (a full page, or an empty one past the start): most lists fit in
one page, and their ``SELECT COUNT(*)`` was a query per request for a number the page holds (design §10)."""

from __future__ import annotations

import re
from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

MAX_OFFSET = 2**62
_WHOLE_NUMBER = re.compile(r"^[0-9]+$")


def query_integer(request: Request, name: str, *, minimum: int) -> int | None:
    """The query parameter ``name`` as an integer ≥ ``minimum`` (None when absent); otherwise a 400 naming it."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not _WHOLE_NUMBER.match(raw) or int(raw) < minimum:
        raise ValidationError({name: [f"A whole number of at least {minimum} is required."]})
    return int(raw)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1000

    def get_limit(self, request: Request) -> int:
        limit = query_integer(request, self.limit_query_param, minimum=1)
        return self.default_limit if limit is None else min(limit, self.max_limit)

    def get_offset(self, request: Request) -> int:
        offset = query_integer(request, self.offset_query_param, minimum=0)
        return 0 if offset is None else min(offset, MAX_OFFSET)

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any] | None:
        """DRF's, but ``count`` comes from the page when the page is neither full nor empty past the start."""
        self.request = request
        self.limit = self.get_limit(request)
        if self.limit is None:
            return None
        self.offset = self.get_offset(request)
        page = list(queryset[self.offset:self.offset + self.limit])
        if len(page) < self.limit and (page or self.offset == 0):
            self.count = self.offset + len(page)
        else:
            self.count = self.get_count(queryset)
        if self.count > self.limit and self.template is not None:
            self.display_page_controls = True
        return page

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {"name": self.limit_query_param, "required": False, "in": "query",
             "description": f"Number of results to return per page (default {self.default_limit}; larger values "
                            f"are clamped to {self.max_limit}).",
             "schema": {"type": "integer", "minimum": 1}},
            {"name": self.offset_query_param, "required": False, "in": "query",
             "description": "The initial index from which to return the results.",
             "schema": {"type": "integer", "minimum": 0}},
        ]
