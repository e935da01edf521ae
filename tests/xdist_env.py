"""A pytest plugin (pyproject's addopts, ``-p tests.xdist_env``) for runs over pytest-xdist workers. Each worker talks to
a Redis database of its own, as pytest-django gives each a PostgreSQL test database of its own
(``test_<name>_gw<N>``). Two workers' channel groups, Celery queues and cache counters (login lock-outs) never
meet. It runs when the plugin is imported, before pytest-django reads the settings, and sets ``REDIS_URL`` in the
environment, so the servers a test starts use the worker's database too."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import pytest

# Database 0 is a run without xdist's; 3-10 belong to the e2e and load stacks (tests/e2e, tests/load), which pick
# theirs by number and run one module at a time in the two serial groups (tests/conftest.py), which never name the
# same one (tests/build/test_serial_groups.py). Redis has 16 by default.
FIRST_WORKER_REDIS_DB = 11
LAST_REDIS_DB = 15


def worker_redis_url(url: str, worker: str) -> str:
    """``url`` on the Redis database of xdist worker ``worker`` (``gw0`` -> 11, ``gw1`` -> 12, ...)."""
    index = int(worker.removeprefix("gw"))
    db = FIRST_WORKER_REDIS_DB + index
    if db > LAST_REDIS_DB:
        raise RuntimeError(f"{worker}: at most {LAST_REDIS_DB - FIRST_WORKER_REDIS_DB + 1} xdist workers "
                           f"have a Redis database of their own (make test TEST_WORKERS=...)")
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", "", ""))


_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER and os.environ.get("REDIS_URL"):
    os.environ["REDIS_URL"] = worker_redis_url(os.environ["REDIS_URL"], _WORKER)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Make ``--dist loadgroup`` group again under pytest 9. xdist 3.8's worker hook marks a test of a group by
    writing ``item._nodeid = "<nodeid>@<group>"``, which pytest 8 read back as ``item.nodeid``; pytest 9 derives
    ``nodeid`` from ``item._id`` and ignores it, so every test was scheduled alone and the stack tests
    (tests/conftest.py SERIAL_GROUP) ran at once on several workers. Runs after xdist's hook (trylast) and copies
    the suffixed id into ``_id``; a no-op where xdist wrote nothing or pytest still reads ``_nodeid``."""
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # pytest < 9: nodeid is _nodeid
        return
    for item in items:
        suffixed = item.__dict__.get("_nodeid")
        if isinstance(suffixed, str) and suffixed != item.nodeid:
            item._id = coerce_node_id(suffixed)


def use_own_test_database(label: str) -> None:
    """Name the Django test database ``test_<configured name>_<label>``, plus ``_<worker>`` under pytest-xdist
    (for a suite's ``django_db_modify_db_settings`` fixture: such an override replaces pytest-django's, which is
    the one that adds the worker suffix, so without it two workers would create the same database)."""
    from django.conf import settings

    base = settings.DATABASES["default"].get("NAME") or "reclaimnet"
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    name = f"test_{base}_{label}" + (f"_{worker}" if worker else "")
    settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = name
