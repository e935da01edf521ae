# Concurrent writes (tests/load, scripts/loaddriver.py): 1,000 mixed writes from 6 clients against the embedded
# default and against the production setup (PostgreSQL, Redis, prefork Celery worker, beat, daphne); 0 answers
# >= 500, 0 duplicate rows. Part of `make test`; RECLAIMNET_LOAD_WRITES=100 for a quick look.
.PHONY: load-writes

load-writes: venv services
	env $(RECLAIMNET_TESTING_ENV) $(PYTEST) -q -s tests/load
