"""Campus sign-in views (docs/design.md §20): start (``/oidc/authenticate/``), callback (``/oidc/callback/``) and
the portal's sign-out, which also ends the provider's session when it has an end-session endpoint.

All answer 404 while campus sign-in is off. A refused or failed sign-in goes back to the login page with the
reason as a message; nothing is created for it.
"""

from __future__ import annotations

import logging
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import resolve_url
from mozilla_django_oidc import views as oidc_views

from portal.sso import discovery

log = logging.getLogger(__name__)

UNAVAILABLE = "Campus sign-in is unavailable right now (the campus sign-in service did not answer). Try again later."
FAILED = "Campus sign-in failed a security check. Start again from this page."
CANCELLED = "Campus sign-in was cancelled or refused by the campus sign-in service."
DISABLED = "This portal account is disabled. Ask a campus admin."


def enabled() -> bool:
    return bool(getattr(settings, "RECLAIMNET_OIDC_ENABLED", False))


def _back_to_login(request: HttpRequest, message: str) -> HttpResponse:
    messages.error(request, message)
    return HttpResponseRedirect(resolve_url(settings.LOGIN_URL))


class AuthenticateView(oidc_views.OIDCAuthenticationRequestView):
    """Sends the browser to the provider with a fresh state, nonce and PKCE challenge (kept in the session)."""

    get_settings = staticmethod(discovery.oidc_setting)

    def __init__(self, *args: object, **kwargs: object) -> None:  # mozilla reads the endpoint here: not yet
        super(oidc_views.OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not enabled():
            raise Http404("campus sign-in is off")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = self.get_settings("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except discovery.ProviderUnavailableError as exc:
            log.warning("campus sign-in unavailable: %s", exc)
            return _back_to_login(request, UNAVAILABLE)
        self.OIDC_RP_CLIENT_ID = self.get_settings("OIDC_RP_CLIENT_ID")
        return super().get(request)


class CallbackView(oidc_views.OIDCAuthenticationCallbackView):
    """The provider's answer: the code is exchanged, the ID token checked, the rules applied."""

    get_settings = staticmethod(discovery.oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not enabled():
            raise Http404("campus sign-in is off")
        try:
            return super().get(request)
        except (requests.RequestException, discovery.ProviderUnavailableError) as exc:
            log.warning("campus sign-in: the provider did not answer: %s", exc)
            return _back_to_login(request, UNAVAILABLE)
        except SuspiciousOperation as exc:
            log.warning("campus sign-in refused: %s", exc)
            return _back_to_login(request, FAILED)

    def login_failure(self) -> HttpResponse:
        request = self.request
        if getattr(request, "sso_refusal", None):
            message = request.sso_refusal  # type: ignore[attr-defined]
        elif getattr(self, "user", None) is not None and not self.user.is_active:
            message = DISABLED
        elif request.GET.get("error"):
            message = CANCELLED
        else:
            message = FAILED
        return _back_to_login(request, message)


def provider_logout_url(request: HttpRequest) -> str:
    """``OIDC_OP_LOGOUT_URL_METHOD``: the provider's end-session URL (RP-initiated logout) with the ID token as
    hint and the portal's login page to come back to; the portal's own page when the provider has none."""
    back = request.build_absolute_uri(resolve_url(settings.LOGOUT_REDIRECT_URL or settings.LOGIN_URL))
    id_token = request.session.get("oidc_id_token")
    try:
        end_session = discovery.oidc_setting("RECLAIMNET_OIDC_END_SESSION_ENDPOINT", "")
    except discovery.ProviderUnavailableError as exc:
        log.warning("campus sign-out: provider unavailable, portal session ended only: %s", exc)
        end_session = ""
    if not end_session or not id_token:
        return resolve_url(settings.LOGOUT_REDIRECT_URL or settings.LOGIN_URL)
    query = urlencode({"id_token_hint": id_token, "post_logout_redirect_uri": back,
                       "client_id": settings.OIDC_RP_CLIENT_ID})
    return f"{end_session}{'&' if '?' in end_session else '?'}{query}"


class LogoutView(auth_views.LogoutView):
    """``/accounts/logout/`` (POST): Django's sign-out; a session that signed in through the campus is then sent
    to the provider's end-session endpoint so the campus session ends too."""

    def post(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        target = None
        if enabled() and request.user.is_authenticated and request.session.get("oidc_id_token"):
            target = provider_logout_url(request)
        response = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(target) if target else response
