# The what-if report (docs/design.md §7 "The what-if report"). Included by the main Makefile (-include mk/*.mk).
#
#   make export-trace [TRACE_OUT=reports/trace.json] [DAYS=30]   the portal's last DAYS days as a design §7 trace
#                     (TRACE_OUT ending in .json: one JSON file; anything else: a folder of CSV files), then
#                     `python -m scheduler.sim --trace TRACE_OUT --policy reclaimnet --json` replays it
#   make test-whatif  the what-if unit tests (export round trip, uploads, permissions, an eager run), then its
#                     browser test in its own pytest process
TRACE_OUT ?= reports/trace.json
DAYS ?= 30

.PHONY: export-trace test-whatif

export-trace: venv
	@mkdir -p $(dir $(TRACE_OUT))
	$(PY) manage.py export_trace $(TRACE_OUT) --days $(DAYS)

test-whatif: venv services
	env $(RECLAIMNET_TESTING_ENV) $(PYTEST) -q tests/whatif
	@bash scripts/install_browser_deps.sh
	env $(RECLAIMNET_TESTING_ENV) $(PYTEST) -q tests/browser/test_whatif.py -p no:asyncio -W ignore::pytest.PytestConfigWarning
