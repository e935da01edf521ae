from __future__ import annotations

from django.apps import AppConfig


class QueueConfig(AppConfig):
    """The fair queue (design §16.6). ``ready`` registers what happens to a job's dependants when it ends, and
    folds an array task's own notices into its array's (design §16.6)."""

    name = "portal.queue"
    label = "queue"
    verbose_name = "Fair queue"

    def ready(self) -> None:
        from portal.core import events
        from portal.core.lifecycle import jobs as job_lifecycle
        from portal.queue import dependencies

        if dependencies.job_ended not in job_lifecycle.END_HOOKS:
            job_lifecycle.END_HOOKS.append(dependencies.job_ended)
        if dependencies.fold_array_task_event not in events.FOLDED:
            events.FOLDED.append(dependencies.fold_array_task_event)
