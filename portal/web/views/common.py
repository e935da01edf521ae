"""Shared view helpers: the home redirect, partial rendering for htmx live refreshes, one-time form tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.views import LoginView
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from portal.core import idempotency
from portal.web.access import page_roles


def render_page(
    request: HttpRequest, template: str, context: dict[str, Any], fragments: dict[str, str] | None = None
) -> HttpResponse:
    """Render the page, or only one of its fragments when asked with ``?fragment=NAME`` (live refresh)."""
    name = request.GET.get("fragment")
    if name:
        if not fragments or name not in fragments:
            raise Http404("no such fragment")
        return render(request, fragments[name], context)
    return render(request, template, context)


def home(request: HttpRequest) -> HttpResponse:
    """``/``: the sign-in form for visitors (the only public page); then admins to the dashboard, providers
    to their nodes, researchers to their jobs."""
    user = request.user
    if not user.is_authenticated:
        return LoginView.as_view()(request)
    roles = page_roles(request)
    if roles.admin:
        return redirect("web:dashboard")
    if roles.provider:
        return redirect("web:provider-home")
    if roles.researcher:
        return redirect("web:job-list")
    return render(request, "web/no_role.html")


SUBMIT_TOKEN_FIELD = "submit_token"  # rendered by {% submit_token %} beside {% csrf_token %}


def submit_once(request: HttpRequest, action: Callable[[], HttpResponse],
                location_of: Callable[[HttpResponse], str] | None = None) -> HttpResponse:
    """Run a form's POST ``action`` once per rendered form (docs/design.md §8).

    The form carries a one-time ``submit_token``; the first POST reserves it in the transaction of the change
    it makes, so a double click or a browser retry lands on the page the first one led to instead of creating
    a second row. Answers of 400 and above keep no token (the user fixes the form and sends it again).
    ``location_of`` names that page for answers that are not redirects (a node's one-time token page).
    """
    token = request.POST.get(SUBMIT_TOKEN_FIELD, "").strip()
    if not token or len(token) > 100 or not request.user.is_authenticated:
        return action()
    key = f"form:{request.path}:{token}"[: idempotency.MAX_KEY_LENGTH]
    scope = f"{request.method} {request.path}"
    with transaction.atomic():
        try:
            stored = idempotency.reserve(request.user, key, scope, idempotency.request_digest(scope, None))
        except (idempotency.KeyReusedError, idempotency.KeyInProgressError):
            messages.info(request, "This form was already sent.")
            return redirect("/")
        if stored is not None:
            messages.info(request, "This form was already sent; here is what it did.")
            return redirect(stored.location or "/")
        response = action()
        if response.status_code >= 400:
            transaction.set_rollback(True)
            return response
        location = response["Location"] if response.has_header("Location") else (
            location_of(response) if location_of else request.path)
        idempotency.record(request.user, key, response.status_code, None, location)
    return response
