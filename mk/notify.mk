# Notifications (design §12): `make bench-notify` times reclaim request -> agent command (kill-switch) with the
# webhook receiver sleeping 30 s and the mail server silent, against both healthy, in alternating blocks of one run
# on one stack (daphne + one solo Celery worker with beat consuming every queue; its own database and Redis db 4).
# The last line: notify: reclaim -> agent command p99 healthy X ms, ... unhealthy Y ms (ratio R; goal <= 1.20) PASS|FAIL
.PHONY: bench-notify

bench-notify: venv services
	env $(RECLAIMNET_TESTING_ENV) $(PY) scripts/bench_notify.py
