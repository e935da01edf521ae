# `make e2e`: the end-to-end scenarios (daphne, Celery, three agents on loopback; tests/e2e) and the benchmark
# (downtime split, control-plane latency with 500 simulated agents in 3 runs: each run's p50/p99 and the hops of
# its path, the spread; scripts/bench_e2e.py). The line before the last lists the three runs' p99; the last reads:
# e2e: scheduled PASS|FAIL, emergency PASS|FAIL, sigkill PASS|FAIL, control p99 X ms, multiportal PASS|FAIL
# (X: the worst run's; multiportal: two daphnes and two workers, tests/e2e/test_multiportal.py, design §18)
.PHONY: e2e

e2e: venv services
	@mkdir -p reports && rm -f reports/e2e_results.json
	-env $(RECLAIMNET_TESTING_ENV) $(PYTEST) -q -m e2e tests/e2e
	env $(RECLAIMNET_TESTING_ENV) $(PY) scripts/bench_e2e.py
