from django.apps import AppConfig


class WebConfig(AppConfig):
    """Server-rendered pages for providers, researchers and admins."""

    name = "portal.web"
    label = "web"
