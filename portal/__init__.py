"""ReclaimNet portal: the Django project (settings, URLs, ASGI, Celery app)."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]
