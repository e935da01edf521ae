# `make chaos`: a system of its own (private PostgreSQL cluster and redis-server on spare ports, daphne, a
# prefork Celery worker with concurrency 2, beat, six agents, training jobs), injected in turn with ten faults
# and checked after each with no human step (scripts/chaos.py, tests/chaos). `make test` runs a bounded form
# (worker SIGKILL, Redis restart, hostile agent: tests/chaos/test_chaos.py). RECLAIMNET_CHAOS_KEEP=1 keeps the
# logs, the step ledger and the database files. The last line reads:
# chaos: F of F faults survived, stuck S, lost L, duplicated D, misrecorded M
.PHONY: chaos

chaos: venv services
	$(PY) scripts/chaos.py
