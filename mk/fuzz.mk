# API fuzzing (scripts/fuzz_api.py): schemathesis against the portal's own /api/schema/, in process, as admin,
# provider, researcher and anonymous, on a seeded campus in a throwaway test database: 0 server errors and 0
# schema violations over > 3,000 requests. The bounded form (< 1,000 requests) is tests/portal/test_fuzz_api.py,
# part of `make test`. FUZZ_API_EXAMPLES=N sets the cases per operation, role and mode; FUZZ_API_SEED another seed.
.PHONY: fuzz-api
FUZZ_API_EXAMPLES ?= 15
FUZZ_API_SEED ?= 0

fuzz-api: venv services
	env $(RECLAIMNET_TESTING_ENV) $(PY) scripts/fuzz_api.py --examples $(FUZZ_API_EXAMPLES) --seed $(FUZZ_API_SEED)
