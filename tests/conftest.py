"""Suite-wide fixtures, the report header that says which database the suite runs against, and how the suite
is split over pytest-xdist workers (``make test``; README "Tests")."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Tests that start a whole stack (daphne, Celery workers, agents: ``e2e``) or shape real traffic in network
# namespaces (``net``) run one after another within a serial group: several stacks at once on a 2-core machine
# starve each other's heartbeats. There are two such groups, which share nothing and so may run side by side on
# two workers: ``stack`` (tests/e2e, on Redis databases 3, 4, 6, 9 and 10 and the worker's PostgreSQL database;
# tests/net in namespaces of its own) and ``stack-b`` (tests/load on Redis database 5 and a database of its own;
# chaos with its private PostgreSQL and Redis; the PyTorch stack on no Redis; the notify stack on the worker's
# Redis database). tests/build/test_serial_groups.py checks that no Redis database is named in both. Measured
# 2026-12-07 (--durations, 3 workers): 362 s and 351 s of the 714 s that one group took. Every other module is a
# group of its own, so module-scoped fixtures are built once, on the worker that runs the module.
SERIAL_MARKERS = ("e2e", "net")
SERIAL_GROUP = "stack"
SECOND_SERIAL_GROUP = "stack-b"
SECOND_SERIAL_PATHS = ("tests/load/", "tests/chaos/", "tests/torch/", "tests/notify/")


def pytest_report_header(config: pytest.Config) -> list[str]:
    url = os.environ.get("DATABASE_URL", "")
    engine = "PostgreSQL" if url.startswith(("postgres://", "postgresql://")) else "SQLite (embedded default)"
    redis = os.environ.get("REDIS_URL") or "none (in-memory channel layer, eager Celery)"
    return [f"reclaimnet: database {engine} ({url or 'sqlite file'}), redis {redis}"]


def xdist_group_of(item: pytest.Item) -> str:
    """The xdist group of a test under ``--dist loadgroup``: one of the two serial stack groups, or its module's
    path."""
    module = item.nodeid.split("::", 1)[0]
    if any(item.get_closest_marker(name) for name in SERIAL_MARKERS):
        return serial_group_of(module)
    return module


def serial_group_of(module: str) -> str:
    """Which serial group a stack test module (``tests/…/test_x.py``) runs in."""
    return SECOND_SERIAL_GROUP if module.startswith(SECOND_SERIAL_PATHS) else SERIAL_GROUP


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: xdist's worker hook, which reads the group mark into the test's id (``nodeid@group``), is a plain
    # hookimpl registered after this conftest, so without it xdist would run first and see no group at all.
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))


# The longest groups, which xdist hands out first (longest first: the rest of the run fills in around them
# instead of two workers finishing them alone at the end, the third idle).
LONG_GROUPS = (SERIAL_GROUP, SECOND_SERIAL_GROUP, "tests/portal/test_fuzz_api.py")


class _LongGroupsFirst:
    @pytest.hookimpl(trylast=True)  # after pytest-django's own ordering
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        def rank(item: pytest.Item) -> int:
            marker = item.get_closest_marker("xdist_group")
            name = (marker.args[0] if marker.args else marker.kwargs.get("name")) if marker else None
            return LONG_GROUPS.index(name) if name in LONG_GROUPS else len(LONG_GROUPS)

        items.sort(key=rank)  # stable: each group keeps its own order


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_LongGroupsFirst(), "reclaimnet-long-groups-first")


@pytest.fixture(scope="module", autouse=True)
def _empty_the_database_after_a_stack_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """A stack module's fixture commits its campus outside any test's transaction (its processes must see it),
    and pytest-django empties the database only after a transactional test, so whatever module ran next on the
    worker counted those rows (tests/control/test_estimates.py found 14 links). Once the module's own fixtures
    are torn down (an autouse fixture is set up first, so torn down last), the worker's test database is emptied
    as a transactional test's is. Only a test database (pytest-django renames it to ``test_…`` when it sets it
    up) is touched."""
    yield
    if not any(request.node.get_closest_marker(name) for name in SERIAL_MARKERS):
        return
    from django.conf import settings

    if not settings.configured or not str(settings.DATABASES["default"].get("NAME", "")).startswith("test_"):
        return
    from django.core.management import call_command

    with request.getfixturevalue("django_db_blocker").unblock():
        call_command("flush", interactive=False, verbosity=0)
        _reseed_data_migrations()


def _reseed_data_migrations() -> None:
    """What the data migrations put in an empty database, which ``flush`` took out: the class ladder's published
    rows (portal/control/migrations/0010_loans.py; without them every ladder read falls back to its defaults)."""
    import importlib

    from portal.control import ladder
    from portal.control.models import ClassPolicy

    for row in importlib.import_module("portal.control.migrations.0010_loans").DEFAULT_POLICIES:
        ClassPolicy.objects.get_or_create(priority_class=row["priority_class"], defaults=row)
    ladder.clear_cache()
