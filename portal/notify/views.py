"""Notification pages (docs/design.md §12): settings for every signed-in user, the demo's stored mail for admins."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from portal.core.permissions import is_admin
from portal.notify import dispatch, preferences
from portal.notify.api import WebhookSerializer, create_webhook, visible_deliveries
from portal.notify.models import Channel, EmailMode, Preference, StoredMail, Webhook
from portal.web.views.common import submit_once

LOG_ROWS = 50


def _page(request: HttpRequest, status: int = 200, **extra: Any) -> HttpResponse:
    user = request.user
    groups, labs = preferences.can_manage_group_hooks(user)
    deliveries = list(visible_deliveries(user).select_related("webhook").prefetch_related("attempt_log")
                      .order_by("-pk")[:LOG_ROWS])
    return render(request, "notify/settings.html", {
        "rows": preferences.table_for(user), "email_modes": EmailMode.choices,
        "webhooks": list(preferences.visible_webhooks(user).select_related("group", "provider").order_by("pk")),
        "groups": groups, "labs": labs, "deliveries": deliveries, "has_email": bool(user.email),
        "form_errors": {}, "form_values": {}, **extra,
    }, status=status)


@never_cache
@login_required
def settings_page(request: HttpRequest) -> HttpResponse:
    """Preferences, webhooks and the delivery log."""
    return _page(request)


@login_required
@require_POST
def save_preferences(request: HttpRequest) -> HttpResponse:
    """One form for the whole table: a row that equals the defaults is stored as no row."""
    user = request.user
    modes = {value for value, _ in EmailMode.choices}
    for kind, _, _ in preferences.table_for(user):  # the events the page showed this user
        name = kind.name
        email = request.POST.get(f"{name}:email", "")
        if email not in modes:
            messages.error(request, f"{name}: choose off, at once or digest for mail.")
            return redirect("notify:settings")
        choice = preferences.Choice(toast=f"{name}:toast" in request.POST, email=email,
                                    webhook=f"{name}:webhook" in request.POST)
        if choice == preferences.default_choice(name):
            Preference.objects.filter(user=user, event=name).delete()
        else:
            Preference.objects.update_or_create(user=user, event=name, defaults={
                "toast": choice.toast, "email": choice.email, "webhook": choice.webhook})
    messages.success(request, "Notification preferences saved.")
    return redirect("notify:settings")


@never_cache
@login_required
@require_POST
def register_webhook(request: HttpRequest) -> HttpResponse:
    """Register a webhook; its secret is shown once, on this answer."""
    owner = request.POST.get("owner", "me")
    data = {"name": request.POST.get("name", ""), "url": request.POST.get("url", "")}
    kind, _, pk = owner.partition(":")
    if kind in ("group", "provider") and pk.isdigit():
        data[kind] = int(pk)
    created: list[Webhook] = []

    def register() -> HttpResponse:
        form = WebhookSerializer(data=data, context={"request": request})
        if not form.is_valid():
            errors = {k: " ".join(str(e) for e in v) for k, v in form.errors.items()}
            return _page(request, status=400, form_errors=errors, form_values=request.POST)
        hook = create_webhook(request.user, **form.validated_data)
        created.append(hook)
        return render(request, "notify/webhook_created.html", {"hook": hook})

    return submit_once(request, register, lambda _: reverse("notify:settings"))


def _hook(request: HttpRequest, pk: int) -> Webhook:
    return get_object_or_404(preferences.visible_webhooks(request.user), pk=pk)


@login_required
@require_POST
def webhook_action(request: HttpRequest, pk: int, what: str) -> HttpResponse:
    """enable, disable, delete or test one webhook."""
    hook = _hook(request, pk)
    if what == "test":
        dispatch.send_test(hook, request.user, Channel.WEBHOOK)
        messages.success(request, f"A test was queued to {hook.url}; see the delivery log below.")
    elif what in ("enable", "disable"):
        Webhook.objects.filter(pk=hook.pk).update(enabled=what == "enable")
        messages.success(request, f"Webhook {hook.url} {what}d.")
    elif what == "delete":
        hook.delete()
        messages.success(request, f"Webhook {hook.url} deleted.")
    else:
        raise PermissionDenied
    return redirect("notify:settings")


@login_required
@require_POST
def test_mail(request: HttpRequest) -> HttpResponse:
    if not request.user.email:
        messages.error(request, "Your account has no email address.")
    else:
        dispatch.send_test(None, request.user, Channel.EMAIL)
        messages.success(request, f"A test mail was queued to {request.user.email}; see the delivery log below.")
    return redirect("notify:settings")


@never_cache
@login_required
def mail_page(request: HttpRequest) -> HttpResponse:
    """Admins: the mail the portal stored instead of sending (no SMTP server configured, e.g. ``make demo``)."""
    if not is_admin(request.user):
        raise PermissionDenied
    from django.conf import settings

    return render(request, "notify/mail.html", {"mails": StoredMail.objects.all()[:100],
                                                "smtp": bool(settings.EMAIL_HOST)})
