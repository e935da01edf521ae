"""Notification pages (included at "/notify/" by portal/urls.py; design §12)."""

from __future__ import annotations

from django.urls import path

from portal.notify import views

app_name = "notify"

urlpatterns = [
    path("", views.settings_page, name="settings"),
    path("preferences/", views.save_preferences, name="preferences"),
    path("webhooks/new/", views.register_webhook, name="webhook-register"),
    path("webhooks/<int:pk>/<str:what>/", views.webhook_action, name="webhook-action"),
    path("test-mail/", views.test_mail, name="test-mail"),
    path("mail/", views.mail_page, name="mail"),
]
