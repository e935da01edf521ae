"""The app configuration of the control plane."""

from django.apps import AppConfig


class ControlConfig(AppConfig):
    """Control plane: agent websockets, live updates, Celery tasks running the scheduler core."""

    name = "portal.control"
    label = "control"

