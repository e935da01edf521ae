"""Fixtures for control-plane tests: in-memory channel layer, eager Celery, a small campus, fake agents.

A "fake agent" is a ``WebsocketCommunicator`` speaking the agent protocol, so the portal side is exercised
without processes (the real agent is covered by tests/e2e).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def django_db_modify_db_settings() -> None:
    """Our own test database name, derived from the configured one: other suites (and other checkouts' runs of
    this one, the e2e suite's ``test_reclaimnet_e2e``) may be using the same server."""
    from tests.xdist_env import use_own_test_database

    use_own_test_database("control")


@pytest.fixture(autouse=True)
def in_process(settings: Any) -> Iterator[None]:
    """In-memory channel layer, eager Celery and an inline outbox relay (these tests are about the portal
    logic, not Redis)."""
    from portal.celery import app

    old = app.conf.task_always_eager  # read before the settings change (app.conf reads settings lazily)
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.RECLAIMNET_NO_LOOP = True  # tests call control_tick themselves
    settings.RECLAIMNET_OUTBOX_RELAY = "inline"  # queued work runs right after the commit that queued it
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = old
    # Consumers touched the database from asgiref's sync thread: close that thread's connection too, or the
    # test database cannot be dropped at the end of the session.
    from asgiref.sync import sync_to_async
    from django.db import connections

    asyncio.run(sync_to_async(connections.close_all)())
