"""Request-level guards that apply to every page and endpoint."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


class BodySizeLimitMiddleware:
    """A body larger than ``DATA_UPLOAD_MAX_MEMORY_SIZE`` answers 413 before anything reads it (Django alone
    answers an HTML 400 from deep inside the parser). API clients get JSON naming the limit."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if limit is not None and length > limit:
            message = f"Request body of {length} bytes is larger than the {limit} bytes accepted."
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": message}, status=413)
            return HttpResponse(message, status=413, content_type="text/plain; charset=utf-8")
        return self.get_response(request)
