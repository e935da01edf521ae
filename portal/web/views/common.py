"""Shared view helpers: the home redirect and partial rendering for htmx live refreshes."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.views import LoginView
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from portal.web.access import is_admin, is_provider_member, is_researcher


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
    if is_admin(user):
        return redirect("web:dashboard")
    if is_provider_member(user):
        return redirect("web:provider-home")
    if is_researcher(user):
        return redirect("web:job-list")
    return render(request, "web/no_role.html")
