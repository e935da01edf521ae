# Scheduler core: `make bench` times one control period of scheduler/ against the literal
# per-job-loop reference at 54, 500, 5,000 and 50,000 nodes; `make bench-drift` measures how fast the
# hazard estimator re-converges after a 1.7x step (design §2).
.PHONY: bench bench-drift

bench: venv
	$(PY) scripts/bench_scheduler.py

bench-drift: venv
	$(PY) scripts/hazard_drift.py
