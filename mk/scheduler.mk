# Scheduler core: `make bench` times one control period of scheduler/ against the literal
# per-job-loop reference at 54, 500, 5,000 and 50,000 nodes; `make bench-drift` measures how fast the
# hazard estimator re-converges after a 1.7x step (design §2).
.PHONY: bench bench-drift

bench: venv
	$(PY) scripts/bench_scheduler.py

bench-drift: venv
	$(PY) scripts/hazard_drift.py

# The control tick with its database: campuses of 54, 500 and 5,000 nodes on PostgreSQL (a database of its own,
# dropped after), the median of 20 whole ticks and their SQL statement count (docs/design.md §9.4).
.PHONY: bench-tick

bench-tick: venv services
	env DATABASE_URL=$(TEST_DATABASE_URL) $(PY) scripts/bench_tick.py
