"""Bounded database connections (docs/design.md §10): a burst that finds the pool exhausted, or PostgreSQL out of
connection slots, is answered 503 + Retry-After, never 500, and the portal answers normally once a connection
is free again. Against the real PostgreSQL server: the pool is shrunk to one connection, held by another thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool
import pytest
from django.core.handlers.exception import convert_exception_to_response
from django.db import OperationalError, connection
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory
from rest_framework.authtoken.models import Token

from portal.core.middleware import DatabaseBusyMiddleware, database_busy_reason
from tests.portal import factories as f

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="connection pooling needs PostgreSQL")

TINY_POOL = {"min_size": 1, "max_size": 1, "timeout": 0.2}


@pytest.fixture
def tiny_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's pool, rebuilt with one connection and a 0.2 s wait; the configured pool afterwards."""
    connection.close()
    connection.close_pool()
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "pool", TINY_POOL)
    yield
    connection.close()
    connection.close_pool()


class HeldConnection:
    """Another thread takes the pool's one connection and keeps it until :meth:`release`."""

    def __init__(self) -> None:
        self.taken = threading.Event()
        self.released = threading.Event()
        self.thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        try:
            connection.ensure_connection()
            self.taken.set()
            self.released.wait(30)
        finally:
            connection.close()  # back to the pool

    def __enter__(self) -> HeldConnection:
        self.thread.start()
        assert self.taken.wait(10), "the holder thread never got a connection"
        return self

    def release(self) -> None:
        self.released.set()
        self.thread.join(10)

    def __exit__(self, *exc: Any) -> None:
        self.release()


@pytest.mark.django_db(transaction=True)
def test_exhausted_pool_answers_503_with_retry_after_then_200_once_released(tiny_pool: None) -> None:
    two = f.make_two_labs()
    researcher = two.users["researcher"]
    token = Token.objects.create(user=researcher).key
    api = Client(HTTP_AUTHORIZATION=f"Token {token}")
    page = Client()
    page.force_login(researcher)
    connection.close()  # the test's own thread gives its connection back: the holder takes the only one

    with HeldConnection() as held:
        busy_api = api.get("/api/jobs/")
        busy_page = page.get("/jobs/")
        held.release()
        api_after = api.get("/api/jobs/")
        connection.close()
        page_after = page.get("/jobs/")

    assert busy_api.status_code == 503
    assert int(busy_api["Retry-After"]) > 0
    assert busy_api.json()["reason"] == "database_pool_exhausted"
    assert busy_page.status_code == 503
    assert int(busy_page["Retry-After"]) > 0
    assert busy_page["Content-Type"].startswith("text/plain")
    assert (api_after.status_code, page_after.status_code) == (200, 200)


@pytest.mark.django_db(transaction=True)
def test_postgresql_refusing_connections_answers_503_not_500(monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL's own refusal ("too many connections"): a scratch database that admits no connection."""
    two = f.make_two_labs()
    token = Token.objects.create(user=two.users["researcher"]).key
    scratch = f"{connection.settings_dict['NAME']}_full"
    with connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{scratch}"')
        cursor.execute(f'CREATE DATABASE "{scratch}" CONNECTION LIMIT 0')
    connection.close()
    connection.close_pool()
    try:
        monkeypatch.setitem(connection.settings_dict, "NAME", scratch)
        monkeypatch.delitem(connection.settings_dict["OPTIONS"], "pool", raising=False)  # PostgreSQL answers
        response = Client(HTTP_AUTHORIZATION=f"Token {token}").get("/api/jobs/")
    finally:
        connection.close()
        monkeypatch.undo()
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{scratch}"')
        connection.close()
        connection.close_pool()
    assert response.status_code == 503
    assert response.json()["reason"] == "database_connection_limit"
    assert "Retry-After" in response


def _raises_pool_timeout(request: HttpRequest) -> HttpResponse:
    try:
        raise psycopg_pool.PoolTimeout("couldn't get a connection after 0.20 sec")
    except psycopg_pool.PoolTimeout as exc:
        raise OperationalError(str(exc)) from exc  # as Django's DatabaseErrorWrapper raises it


def test_busy_database_in_another_middleware_answers_503_not_500() -> None:
    """An error Django turned into a 500 before this middleware saw it (raised by an inner middleware)."""
    inner = convert_exception_to_response(_raises_pool_timeout)
    response = DatabaseBusyMiddleware(inner)(RequestFactory().get("/api/nodes/"))
    assert response.status_code == 503
    assert response["Retry-After"]


def test_only_errors_of_a_busy_database_count_as_busy() -> None:
    assert database_busy_reason(psycopg.errors.SerializationFailure("could not serialize access")) is None
    assert database_busy_reason(ValueError("too many connections")) is None
    limit = psycopg.OperationalError('connection failed: FATAL:  remaining connection slots are reserved for '
                                     'non-replication superuser connections')
    assert database_busy_reason(limit) == "database_connection_limit"
