"""The bounded API fuzz of ``make test``: schemathesis (``scripts/fuzz_api.py``, the code ``make fuzz-api`` runs
with more cases) against the served ``/api/schema/`` as admin, provider, researcher and anonymous, on a seeded
campus in the test database: no answer is a server error, and every answer is one the schema documents."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fuzz_api.py"


def _load_script() -> ModuleType:
    if "fuzz_api" not in sys.modules:
        spec = importlib.util.spec_from_file_location("fuzz_api", SCRIPT)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["fuzz_api"] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules["fuzz_api"]


fuzz_api = _load_script()


@pytest.mark.django_db
def test_fuzzed_requests_get_no_server_error_and_only_documented_answers() -> None:
    campus = fuzz_api.seed()
    report = fuzz_api.fuzz(campus, examples=fuzz_api.BOUNDED_EXAMPLES)
    print(report.line())
    assert 500 <= report.requests <= 1000, report.line()
    assert report.clean(), f"{report.details()}\n{report.line()}"
    # The cases reach real objects and every kind of answer, not only refusals.
    assert {200, 201, 400, 401, 404, 409} <= set(report.statuses), report.statuses


@pytest.mark.django_db
def test_fuzz_campus_gives_every_detail_route_real_objects() -> None:
    campus = fuzz_api.seed()
    assert set(campus.tokens) == {"admin", "provider", "researcher", "anonymous"}
    assert campus.tokens["anonymous"] is None
    for prefix, ids in campus.ids.items():
        assert ids, prefix


@pytest.mark.django_db
def test_fuzz_report_counts_server_errors_apart_from_schema_violations() -> None:
    class FakeResponse:
        status_code = 500
        text = "boom"
        headers: dict[str, Any] = {"Content-Type": ["text/html"]}

    class FakeCase:
        def as_curl_command(self) -> str:
            return "curl http://localhost/api/x/"

    report = fuzz_api.Report(requests=2)
    report.record("GET /api/x/", "admin", fuzz_api.ServerError(operation="GET /api/x/", status_code=500),
                  FakeCase(), FakeResponse())
    report.record("GET /api/x/", "admin", AssertionError("undocumented"), FakeCase(), FakeResponse())
    assert (report.server_errors, report.violations) == (1, 1)
    assert not report.clean()
    assert report.line() == "fuzz-api: 2 requests, 1 server errors, 1 schema violations"
