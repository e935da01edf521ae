"""Websocket routes of the control plane (agents, live page updates)."""

from __future__ import annotations

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
