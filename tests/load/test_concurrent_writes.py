"""1000 concurrent mixed writes (API and web pages) against a running portal must not answer one 5xx.

Six client threads (2 researchers, 4 providers; ``scripts/loaddriver.py``) submit and cancel jobs, reclaim,
lend again, register and reconfigure nodes while real agents heartbeat and the control loop ticks every second.
~10 % of the API creates are retried with the same ``Idempotency-Key`` and must replay the first answer; every
job and node has a unique name and must exist exactly once afterwards. Two deployments:

- the embedded default (``make demo``): SQLite file, no Redis, Celery tasks in-process, the control loop in
  daphne, agents from ``manage.py demo_agents``;
- the production setup: PostgreSQL, Redis, a prefork Celery worker (``--concurrency 2``), Celery beat, daphne
  and the same agents.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.load.conftest import (
    CREDENTIALS,
    Deployment,
    base_env,
    check_run,
    loaddriver,
    name_counts_postgres,
    name_counts_sqlite,
    outbox_postgres,
    outbox_sqlite,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

TOTAL = int(os.environ.get("RECLAIMNET_LOAD_WRITES", "1000"))  # fewer for a quick look; the tests say 1000
CLIENTS = 6
AGENTS = 3


def _drive(deployment: Deployment) -> tuple[object, float]:
    started = time.monotonic()
    result = loaddriver.run_writes(deployment.base_url, total=TOTAL, clients=CLIENTS, credentials=CREDENTIALS,
                                   seed=1)
    elapsed = time.monotonic() - started
    print(result.report())
    deployment.check_alive()  # a portal process gone mid-run would show as connection errors only
    return result, elapsed


def test_embedded_default_takes_1000_mixed_writes_without_server_errors(workdir: Path) -> None:
    db = workdir / "db.sqlite3"
    deployment = Deployment(workdir, base_env(DATABASE_URL=f"sqlite:///{db}"))
    t0 = time.monotonic()
    try:
        deployment.prepare()
        deployment.start_daphne()
        deployment.start_agents(AGENTS)
        t_ready = time.monotonic()
        result, drive_s = _drive(deployment)
    finally:
        deployment.stop_all()
    print(f"embedded: setup {t_ready - t0:.1f} s, {TOTAL} writes in {drive_s:.1f} s; {outbox_sqlite(db)}")
    check_run(result, TOTAL, name_counts_sqlite(db, result.run), deployment)


def test_production_setup_takes_1000_mixed_writes_without_server_errors(
    workdir: Path, postgres_url: str, redis_url: str
) -> None:
    deployment = Deployment(workdir, base_env(DATABASE_URL=postgres_url, REDIS_URL=redis_url))
    t0 = time.monotonic()
    try:
        deployment.prepare()
        deployment.start_celery(concurrency=2)
        deployment.start_daphne()
        deployment.wait_celery()
        deployment.start_agents(AGENTS)
        t_ready = time.monotonic()
        result, drive_s = _drive(deployment)
    finally:
        deployment.stop_all()
    print(f"production: setup {t_ready - t0:.1f} s, {TOTAL} writes in {drive_s:.1f} s; "
          f"{outbox_postgres(postgres_url)}")
    check_run(result, TOTAL, name_counts_postgres(postgres_url, result.run), deployment)
