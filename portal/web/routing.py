"""Websocket routes of the pages (live updates to browsers)."""

from __future__ import annotations

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
