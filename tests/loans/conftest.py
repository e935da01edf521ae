"""Fixtures for the loans tests (design §15): in-process channel layer, eager Celery, an inline outbox relay,
a fresh read of the ladder for every test, and an injected clock."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest


@pytest.fixture(scope="session")
def django_db_modify_db_settings() -> None:
    """Our own test database name (other suites may use the same server)."""
    from tests.xdist_env import use_own_test_database

    use_own_test_database("loans")


@pytest.fixture(autouse=True)
def in_process(settings: Any) -> Iterator[None]:
    """In-memory channel layer, eager Celery, inline outbox relay; the ladder read afresh."""
    from portal.celery import app
    from portal.control.ladder import clear_cache

    old = app.conf.task_always_eager
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.RECLAIMNET_NO_LOOP = True
    settings.RECLAIMNET_OUTBOX_RELAY = "inline"
    app.conf.task_always_eager = True
    clear_cache()
    yield
    clear_cache()
    app.conf.task_always_eager = old
    from asgiref.sync import sync_to_async
    from django.db import connections

    asyncio.run(sync_to_async(connections.close_all)())


class Clock:
    """The portal's clock in these tests: ``django.utils.timezone.now`` answers ``t``."""

    def __init__(self) -> None:
        self.t = dt.datetime(2026, 12, 2, 9, 0, tzinfo=dt.UTC)

    def advance(self, seconds: float) -> dt.datetime:
        self.t += dt.timedelta(seconds=seconds)
        return self.t


@pytest.fixture
def clock() -> Iterator[Clock]:
    c = Clock()
    with mock.patch("django.utils.timezone.now", new=lambda: c.t):
        yield c


@pytest.fixture
def ladder(db: Any) -> None:
    """The ladder as the migration seeds it (a transactional test's flush empties every table between tests)."""
    from portal.control.ladder import DEFAULTS, clear_cache
    from portal.control.models import ClassPolicy

    for priority_class, row in DEFAULTS.items():
        ClassPolicy.objects.get_or_create(priority_class=priority_class, defaults=row)
    clear_cache()
