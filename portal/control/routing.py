"""Websocket routes of the control plane (design §1): node agents authenticate by token, no cookies."""

from __future__ import annotations

from django.urls import URLPattern, path

from portal.control.link.consumers import AgentConsumer

websocket_urlpatterns: list[URLPattern] = [path("ws/agent/", AgentConsumer.as_asgi())]
