"""End-to-end fixtures: one stack (daphne, Celery worker + beat, three agents) per module, on the test database.

The e2e tests are not wrapped in per-test transactions (other processes must see the rows), so the module
fixture unblocks database access for the whole module; pytest-django destroys the test database at the end.
Outcomes are written to ``reports/e2e_results.json`` for ``make e2e``'s summary line.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import harness
import pytest

RESULTS = harness.REPO / "reports" / "e2e_results.json"
_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "tests/e2e/" not in report.nodeid:
        return
    name = report.nodeid.split("::")[-1]
    if report.failed:
        _outcomes[name] = "FAIL"
    elif report.when == "call" and report.passed:
        _outcomes.setdefault(name, "PASS")
    elif report.skipped:
        _outcomes[name] = "SKIP"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _outcomes:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(_outcomes, indent=1, sort_keys=True))


@pytest.fixture(scope="session")
def django_db_modify_db_settings() -> None:
    """Our own test database, named after the configured one (as tests/control/conftest.py does): other suites
    and parallel runs on the same server (each with its own DATABASE_URL) do not share it."""
    from tests.xdist_env import use_own_test_database

    use_own_test_database("e2e")


def _services_available() -> str | None:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return "e2e needs DATABASE_URL=postgres://…"
    if not os.environ.get("REDIS_URL"):
        return "e2e needs REDIS_URL"
    return None


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, django_db_setup: Any, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    """Start the stack with three agents on loopback; yield {"stack", "nodes": {name: (id, token)}}.

    Several modules use it against one test database, so each names its nodes after itself (``e2e-<module>-a1``):
    a later module's campus never collides with, or counts, an earlier one's nodes."""
    reason = _services_available()
    if reason:
        pytest.skip(reason)
    database_url = harness.stack_database_url()
    workdir = Path(tempfile.mkdtemp(prefix="reclaimnet-e2e-"))
    redis_url = harness.redis_db(os.environ["REDIS_URL"], 3)  # other suites may queue tasks in db 0
    restore_broker = harness.use_broker(redis_url)
    with django_db_blocker.unblock():
        st = harness.Stack(workdir, database_url, redis_url)
        st.flush_redis()
        prefix = "e2e-" + request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-") + "-"
        nodes = harness.make_campus([(f"{prefix}a1", "A"), (f"{prefix}a2", "A"), (f"{prefix}b1", "B")])
        try:
            st.start_portal()
            st.start_worker()
            for name, (_, token) in nodes.items():
                st.start_agent(name, token)
            from portal.core.models import Node

            harness.wait_for(lambda: Node.objects.filter(state="online", name__startswith=prefix).count() == 3,
                             30, what="three agents online")
            yield {"stack": st, "nodes": nodes, "workdir": workdir}
        finally:
            st.stop_all()
            restore_broker()
            if os.environ.get("RECLAIMNET_E2E_KEEP"):
                print(f"e2e logs kept in {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
