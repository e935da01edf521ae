"""Fixtures for the owner-activity tests (design §1 "Owner activity and MIG"): their own test database, an
in-memory channel layer, eager Celery and an inline outbox relay, as tests/control does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def django_db_modify_db_settings() -> None:
    from tests.xdist_env import use_own_test_database

    use_own_test_database("nvml")


@pytest.fixture
def in_process(settings: Any) -> Iterator[None]:
    """The portal tests' setting (``usefixtures``); the agent's tests (test_inventory.py) need no Django."""
    from portal.celery import app

    old = app.conf.task_always_eager
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.RECLAIMNET_NO_LOOP = True
    settings.RECLAIMNET_OUTBOX_RELAY = "inline"
    settings.RECLAIMNET = {**settings.RECLAIMNET, "OWNER_USE_HEARTBEATS": 3, "OWNER_USE_NOTICE_S": 300.0}
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = old
    from asgiref.sync import sync_to_async
    from django.db import connections

    asyncio.run(sync_to_async(connections.close_all)())
