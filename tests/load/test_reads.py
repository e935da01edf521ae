"""Reads under load, in the bounded form ``make test`` runs (``make load`` is the full one, with latencies).

The production setup as the README starts it (``production_env``; PostgreSQL, Redis, a Celery worker per queue
group, beat, two daphne processes as behind the reverse proxy, three agents), the demo campus with two days of
history. 30 closed-loop clients with no
think time (admins, researchers, providers: ``scripts/loaddriver.py READ_MIX``) read for 15 s while 50 job
submits arrive at the same instant. Every read must answer 200 and every submit 201: no 5xx, no 503 from an
exhausted connection pool, no client left without an answer. No latency is asserted here.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.load.conftest import CREDENTIALS, Deployment, loaddriver, production_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

CLIENTS = 30
DURATION_S = 15.0
SUBMITS = 50
AGENTS = 3


def test_reads_and_a_burst_of_submits_get_no_error_from_the_production_setup(
    workdir: Path, postgres_url: str, redis_url: str
) -> None:
    deployment = Deployment(workdir, production_env(postgres_url, redis_url))
    burst: list[loaddriver.ReadResult] = []
    try:
        t0 = time.monotonic()
        deployment.prepare()
        deployment.manage("seed_history", "--past-only")
        deployment.start_production(daphne_processes=2)
        deployment.start_agents(AGENTS)
        t_ready = time.monotonic()
        tokens = loaddriver.submit_tokens(deployment.base_url, CREDENTIALS)
        burster = threading.Thread(target=lambda: (time.sleep(DURATION_S / 3), burst.append(
            loaddriver.run_submit_burst(deployment.base_urls, SUBMITS, tokens))), daemon=True)
        burster.start()
        reads = loaddriver.run_reads(deployment.base_urls, CLIENTS, DURATION_S, CREDENTIALS, seed=2)
        burster.join(120)
        deployment.check_alive()
    finally:
        deployment.stop_all()
    print(f"setup {t_ready - t0:.1f} s\n{reads.report()}")
    assert burst, "the submit burst did not finish"
    print(burst[0].report())
    assert reads.errors == 0, f"{reads.report()}\n{deployment.errors()}"
    assert burst[0].errors == 0 and burst[0].requests == SUBMITS, f"{burst[0].report()}\n{deployment.errors()}"
    roles = {key.split()[0] for key in reads.by_path}
    assert roles == {"admin", "researcher", "provider"} and reads.requests > CLIENTS, reads.report()
