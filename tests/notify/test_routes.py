"""Every notify task runs on the ``notifications`` queue (design §12, §10): a slow mail server or receiver only
ever holds that queue's workers."""

from __future__ import annotations

from portal.celery import app


def test_every_notify_task_is_registered_and_routed_to_the_notifications_queue() -> None:
    app.loader.import_default_modules()
    names = {name for name in app.tasks if name.startswith("notify.")}
    assert names == {"notify.fan_out", "notify.deliver", "notify.send_digests", "notify.watch"}
    assert {str(app.amqp.router.route({}, name)["queue"].name) for name in names} == {"notifications"}


def test_the_digest_and_the_watcher_are_on_the_beat_schedule() -> None:
    from django.conf import settings

    tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"notify.send_digests", "notify.watch"} <= tasks
