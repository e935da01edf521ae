"""Campus sign-in URLs, under ``/oidc/`` (docs/design.md §20). They answer 404 while campus sign-in is off."""

from __future__ import annotations

from django.urls import path

from portal.sso import views

urlpatterns = [
    path("authenticate/", views.AuthenticateView.as_view(), name="oidc_authentication_init"),
    path("callback/", views.CallbackView.as_view(), name="oidc_authentication_callback"),
]
