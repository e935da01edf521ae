"""Suite-wide fixtures, the report header that says which database the suite runs against, and how the suite
is split over pytest-xdist workers (``make test``; README "Tests")."""

from __future__ import annotations

import os

import pytest

# Tests that start a whole stack (daphne, Celery workers, agents: ``e2e``) or shape real traffic in network
# namespaces (``net``) run one after another on one worker: two at once on a 2-core machine starve each other's
# heartbeats and skew the measured rates. Every other module is a group of its own, so module-scoped fixtures
# are built once, on the worker that runs the module.
SERIAL_MARKERS = ("e2e", "net")
SERIAL_GROUP = "stack"


def pytest_report_header(config: pytest.Config) -> list[str]:
    url = os.environ.get("DATABASE_URL", "")
    engine = "PostgreSQL" if url.startswith(("postgres://", "postgresql://")) else "SQLite (embedded default)"
    redis = os.environ.get("REDIS_URL") or "none (in-memory channel layer, eager Celery)"
    return [f"reclaimnet: database {engine} ({url or 'sqlite file'}), redis {redis}"]


def xdist_group_of(item: pytest.Item) -> str:
    """The xdist group of a test under ``--dist loadgroup``: the serial stack group, or its module's path."""
    if any(item.get_closest_marker(name) for name in SERIAL_MARKERS):
        return SERIAL_GROUP
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: xdist's worker hook, which reads the group mark into the test's id (``nodeid@group``), is a plain
    # hookimpl registered after this conftest, so without it xdist would run first and see no group at all.
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))
