"""The app configuration of the control plane."""

from django.apps import AppConfig


class ControlConfig(AppConfig):
    """Control plane: agent websockets, live updates, Celery tasks running the scheduler core."""

    name = "portal.control"
    label = "control"

    def ready(self) -> None:
        """Hold every ``submit_job`` caller to the ladder's per-class GPU limit (design §15.1)."""
        from portal.control.ladder import class_gpu_limit_rule
        from portal.core.services import jobs

        if class_gpu_limit_rule not in jobs.SUBMIT_RULES:
            jobs.SUBMIT_RULES.append(class_gpu_limit_rule)

