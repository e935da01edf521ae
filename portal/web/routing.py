"""Websocket routes of the pages (live updates to browsers).

Only these routes are wrapped in session authentication and the allowed-hosts origin check: node agents
authenticate by token on their own routes and must not need cookies (see portal/asgi.py).
"""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from portal.web.consumers import LiveConsumer

websocket_urlpatterns = [
    path("ws/live/", AllowedHostsOriginValidator(AuthMiddlewareStack(LiveConsumer.as_asgi()))),
]
