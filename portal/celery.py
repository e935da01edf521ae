"""The Celery app. With no REDIS_URL, tasks run eagerly in-process (the embedded default)."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("reclaimnet")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
