"""Websocket routes, collected from the apps that own consumers."""

from __future__ import annotations

from portal.control.routing import websocket_urlpatterns as control_routes
from portal.web.routing import websocket_urlpatterns as web_routes

websocket_urlpatterns = [*control_routes, *web_routes]
