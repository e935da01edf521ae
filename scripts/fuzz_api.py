"""``make fuzz-api``: schemathesis against the portal's own ``/api/schema/``, in process (Django's WSGI handler).

Every operation in the schema is fuzzed as admin, provider and researcher (token auth), and a quarter as many
times anonymously, with schema-valid (positive) and schema-violating (negative) data, on a seeded campus
(``manage.py seed_campus --demo-users`` plus jobs, placements, checkpoints, reclaims and a migration) so that
detail routes hit real objects as well as unknown ones. Each answer is checked: no 5xx; the status code, the
content type, the headers and the body are the ones the schema documents; schema-violating input is refused
with a 4xx. Runs are reproducible (a fixed Hypothesis seed; ``--seed`` picks another).

Run as a script it creates a throwaway test database (``test_<name>_fuzz``), seeds it, fuzzes and drops it; the
last line is ``fuzz-api: N requests, E server errors, V schema violations``. ``tests/portal/test_fuzz_api.py``
runs the same ``fuzz`` (bounded, ≤ 1,000 requests) inside pytest-django's test database.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import logging
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

import django  # noqa: E402
from django.apps import apps  # noqa: E402

if not apps.ready:
    django.setup()

import schemathesis  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.signals import request_finished, request_started  # noqa: E402
from django.db import close_old_connections, connection  # noqa: E402
from django.test.utils import setup_databases, setup_test_environment, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from rest_framework.authtoken.models import Token  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.core.failures import FailureGroup, ServerError  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from portal.control.models import AgentSession  # noqa: E402
from portal.core.lifecycle import jobs as job_lifecycle  # noqa: E402
from portal.core.models import (  # noqa: E402
    Building,
    Checkpoint,
    Job,
    Link,
    Migration,
    MigrationMode,
    Node,
    Placement,
    Provider,
    ReclaimEvent,
    ResearchGroup,
    Switch,
)
from portal.core.services import jobs as job_services  # noqa: E402
from portal.core.services import reclaims as reclaim_services  # noqa: E402

SCHEMA_PATH = "/api/schema/"
ROLES = ("admin", "provider", "researcher")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection]
IDS_PER_KIND = 6
# As daphne over TCP sets it (the WSGI test client sets no address; the lockout counters key on it).
CLIENT_ENVIRON = {"REMOTE_ADDR": "127.0.0.1"}
FULL_EXAMPLES = 15  # per operation, role and mode: > 3,000 requests over the schema's 39 operations
BOUNDED_EXAMPLES = 3  # the pytest form (``make test``): < 1,000 requests


@dataclass
class Campus:
    """What the fuzzer needs from the seeded database: an API token per role (None = anonymous) and, per
    detail-route prefix, ids of real objects (some visible to a role, some not)."""

    tokens: dict[str, str | None]
    ids: dict[str, list[int]]
    users: dict[str, int] = field(default_factory=dict)  # role → user id (to give back a token signed out)


@dataclass
class Report:
    requests: int = 0
    server_errors: int = 0
    violations: int = 0
    by_check: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)  # answers by status code
    first_seen: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (kind, operation, status) → text

    def record(self, operation: str, role: str, failure: Exception, case: Any, response: Any) -> None:
        kind = type(failure).__name__
        if isinstance(failure, ServerError):
            self.server_errors += 1
        else:
            self.violations += 1
        self.by_check[kind] += 1
        key = (kind, operation, str(response.status_code))
        if key not in self.first_seen:
            body = response.text[:300] if hasattr(response, "text") else ""
            self.first_seen[key] = (f"{kind} as {role}: {case.as_curl_command()}\n    -> {response.status_code} "
                                    f"{response.headers.get('Content-Type', [''])}: {body}\n    {failure}")

    def clean(self) -> bool:
        return self.server_errors == 0 and self.violations == 0

    def details(self) -> str:
        return "\n".join(self.first_seen.values())

    def line(self) -> str:
        return (f"fuzz-api: {self.requests} requests, {self.server_errors} server errors, "
                f"{self.violations} schema violations")


# --- the campus ----------------------------------------------------------------------------------------------------


def seed() -> Campus:
    """The paper's campus with demo users, a few nodes online, jobs in several states (one group's jobs are
    invisible to the researcher), checkpoints with replicas, placements, reclaims (one by the control plane
    itself, with no requester) and a migration."""
    call_command("seed_campus", "--demo-users", stdout=io.StringIO())
    users = {role: get_user_model().objects.get(username=role) for role in ROLES}
    nodes = list(Node.objects.order_by("name"))
    online = nodes[:24]
    Node.objects.filter(pk__in=[node.pk for node in online]).update(state="online")
    for port, node in enumerate(online, start=9100):
        AgentSession.objects.create(node=node, channel_name=f"fuzz-{node.pk}", data_host="127.0.0.1",
                                    data_port=port)
    nlp = ResearchGroup.objects.get(name="NLP Group")
    other_group = ResearchGroup.objects.exclude(pk=nlp.pk).order_by("name").first()
    assert other_group is not None
    jobs = []
    for index in range(8):
        group, owner = (nlp, users["researcher"]) if index % 2 == 0 else (other_group, users["admin"])
        jobs.append(job_services.submit_job(owner, group=group, name=f"fuzz-job-{index}", gpu_count=1,
                                            expected_runtime_s=3600.0, ckpt_bytes_estimate=2_000_000_000,
                                            command="python train.py"))
    now = timezone.now()
    for job, node in zip(jobs[:4], online[:4], strict=True):
        Placement.objects.create(job=job, node=node, gpu_indices=[0])
        job_lifecycle.start(job)
        checkpoint = Checkpoint.objects.create(
            job=job, node=node, sequence=1, step=100, size_bytes=1_000_000_000, sha256="0" * 64,
            taken_at=now - dt.timedelta(seconds=70), completed_at=now - dt.timedelta(seconds=60))
        checkpoint.replica_nodes.add(online[10])
    reclaims = [
        reclaim_services.request_reclaim(online[4], users["admin"], 600.0),
        reclaim_services.emergency_reclaim(online[5], users["admin"]),
        reclaim_services.request_reclaim(online[0], None, 0.0),  # the control plane's own (no requester)
    ]
    Migration.objects.create(job=jobs[0], reclaim=reclaims[2], source=online[0], destination=online[6],
                             checkpoint=jobs[0].checkpoints.first(), mode=MigrationMode.PLANNED, bytes=1_000_000_000,
                             work_lost_s=3.5)
    tokens: dict[str, str | None] = {role: Token.objects.get_or_create(user=users[role])[0].key for role in ROLES}
    tokens["anonymous"] = None

    def some(queryset: Any) -> list[int]:
        ids = list(queryset.order_by("pk").values_list("pk", flat=True))
        step = max(1, len(ids) // IDS_PER_KIND)
        return ids[::step][:IDS_PER_KIND]

    ids = {
        "/api/nodes/": some(Node.objects.all()),
        "/api/jobs/": some(Job.objects.all()),
        "/api/reclaims/": some(ReclaimEvent.objects.all()),
        "/api/providers/": some(Provider.objects.all()),
        "/api/groups/": some(ResearchGroup.objects.all()),
        "/api/campus/buildings/": some(Building.objects.all()),
        "/api/campus/switches/": some(Switch.objects.all()),
        "/api/campus/links/": some(Link.objects.all()),
    }
    return Campus(tokens, ids, {role: users[role].pk for role in ROLES})


# --- the fuzzer ----------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def connections_kept_open() -> Iterator[None]:
    """Requests served in this thread keep its database connection (Django's test client does the same):
    closing it at each request's end would end pytest-django's test transaction."""
    signals = [signal for signal in (request_started, request_finished) if signal.disconnect(close_old_connections)]
    try:
        yield
    finally:
        for signal in signals:
            signal.connect(close_old_connections)


def _real_ids(campus: Campus, path: str) -> list[int]:
    if "{id}" not in path:
        return []
    return next((ids for prefix, ids in campus.ids.items() if path.startswith(prefix)), [])


def _strategy(operation: Any, mode: GenerationMode, ids: list[int]) -> Any:
    """Cases for ``operation``: with a generated id (mostly unknown objects) or one of ``ids`` (real ones)."""
    strategies = [operation.as_strategy(generation_mode=mode)]
    takes_input = bool(operation.body) or any(p.location != "path" for p in operation.iter_parameters())
    if mode is GenerationMode.POSITIVE or takes_input:
        strategies += [operation.as_strategy(generation_mode=mode, path_parameters={"id": i}) for i in ids]
    return st.one_of(strategies)


def _fuzz_one(operation: Any, strategy: Any, role: str, token: str | None, examples: int, seed_value: int,
              report: Report) -> None:
    headers = {"Authorization": f"Token {token}"} if token else {}

    @hypothesis_seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case: Any) -> None:
        if token is None:
            case.headers.pop("Authorization", None)
        response = case.call(headers=headers, environ_base=CLIENT_ENVIRON)
        report.requests += 1
        report.statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except FailureGroup as group:
            for failure in group.exceptions:
                report.record(operation.label, role, failure, case, response)

    with contextlib.suppress(Unsatisfiable):  # negative mode on an operation with nothing to violate
        run()


def _restore_token(campus: Campus, role: str, key: str) -> None:
    if not Token.objects.filter(key=key).exists():
        Token.objects.filter(user_id=campus.users[role]).delete()
        Token.objects.create(user_id=campus.users[role], key=key)


def fuzz(campus: Campus, *, examples: int, seed_value: int = 0, log: Callable[[str], None] | None = None
         ) -> Report:
    """Fuzz every operation of the served schema as each role, ``examples`` cases per operation, role and
    generation mode (a quarter as many anonymously)."""
    report = Report()
    for name in ("django.request", "axes"):  # 4xx and refused logins are expected here; 5xx still log
        logging.getLogger(name).setLevel(logging.ERROR)
    with connections_kept_open():
        app = WSGIHandler()
        schema = schemathesis.openapi.from_wsgi(SCHEMA_PATH, app)
        operations = [result.ok() for result in schema.get_all_operations()]
        for operation in operations:
            ids = _real_ids(campus, operation.path)
            for role, token in campus.tokens.items():
                count = examples if token is not None else max(1, examples // 4)
                for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                    before = report.requests
                    # Schema-violating cases are refused early and alike: two fewer of them than valid ones.
                    cases = count if mode is GenerationMode.POSITIVE else max(1, count - 2)
                    _fuzz_one(operation, _strategy(operation, mode, ids), role, token, cases, seed_value, report)
                    if token is not None:  # signing out (POST /api/auth/token/revoke/) deletes the role's token
                        _restore_token(campus, role, token)
                    if log is not None:
                        log(f"{operation.label} as {role} ({mode.value}): {report.requests - before} requests")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=FULL_EXAMPLES,
                        help="cases per operation, role and generation mode")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed (runs with one seed repeat)")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per operation, role and mode")
    args = parser.parse_args(argv)
    setup_test_environment()
    name = connection.settings_dict["NAME"]
    connection.settings_dict.setdefault("TEST", {})["NAME"] = f"test_{name}_fuzz"
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        report = fuzz(seed(), examples=args.examples, seed_value=args.seed,
                      log=print if args.verbose else None)
    finally:
        connection.close()
        teardown_databases(old_config, verbosity=0)
    print("answers by status:", dict(sorted(report.statuses.items())))
    if report.first_seen:
        print(report.details())
        print("failures by check:", dict(report.by_check))
    print(report.line())
    return 0 if report.clean() else 1


if __name__ == "__main__":
    sys.exit(main())
