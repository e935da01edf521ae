# Browser assets and browser tests. Included by the main Makefile (-include mk/*.mk).
#
#   make frontend        rebuild frontend/static/ from the pinned npm packages and syntax-check frontend/src/ (needs npm)
#   make frontend-check  fail if the committed frontend/static/ differs from what the build gives
#   make test-browser    Playwright + Debian chromium against daphne, PostgreSQL and Redis; its own pytest process
#                        (STACK.md gotcha 4); last line: "browser: N passed, M screenshots in DIR"
#
# frontend/static/ (the vendored htmx and Chart.js) is committed, so `make demo` and `make test` need no node at run
# time; our own scripts and styles are served from frontend/src/ as static reclaimnet/ (portal/settings.py).

BROWSER_ARTIFACTS := test-artifacts
# Workers, each with its own database, daphne, Redis database and chromium: the tests mostly wait on pages, so
# three share 2 cores well (52 tests: 188 s on one, 140 s on three).
BROWSER_WORKERS ?= 3
BROWSER_SCREENSHOTS := $(BROWSER_ARTIFACTS)/screenshots

.PHONY: frontend frontend-check test-browser

frontend:
	bash scripts/build_frontend.sh

frontend-check:
	bash scripts/build_frontend.sh --check

test-browser: venv services
	@bash scripts/install_browser_deps.sh
	@rm -rf $(BROWSER_SCREENSHOTS) && mkdir -p $(BROWSER_SCREENSHOTS)
	@set -o pipefail; \
	env $(RECLAIMNET_TESTING_ENV) $(PYTEST) tests/browser -q -p no:asyncio -W ignore::pytest.PytestConfigWarning \
		-n $(BROWSER_WORKERS) --dist loadgroup \
		2>&1 | tee $(BROWSER_ARTIFACTS)/browser.log; rc=$$?; \
	passed=$$(grep -oE '[0-9]+ passed' $(BROWSER_ARTIFACTS)/browser.log | tail -n 1 | cut -d' ' -f1); \
	shots=$$(find $(BROWSER_SCREENSHOTS) -name '*.png' | wc -l); \
	echo "browser: $${passed:-0} passed, $$shots screenshots in $(BROWSER_SCREENSHOTS)"; \
	exit $$rc
