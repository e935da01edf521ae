#!/usr/bin/env bash
# Build the vendored browser assets into frontend/static/vendor/ (committed, so `make demo` needs no node at run
# time). Our own scripts and styles are not copied: the portal serves frontend/src/ as static reclaimnet/
# (STATICFILES_DIRS in portal/settings.py), so there is one copy of them.
#   scripts/build_frontend.sh          install the pinned npm packages if needed, copy, syntax-check
#   scripts/build_frontend.sh --check  fail if frontend/static/ is not what the sources and packages give
# htmx 2 and Chart.js 4 are copied as the minified files their npm packages ship; our own scripts are plain
# ES5 checked with `node --check` (small enough that bundling would add nothing).
set -euo pipefail
cd "$(dirname "$0")/../frontend"

if [ ! -d node_modules/htmx.org ] || [ ! -d node_modules/chart.js ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
for f in src/*.js; do node --check "$f"; done

out=static
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out/vendor"
cp node_modules/htmx.org/dist/htmx.min.js "$out/vendor/htmx.min.js"
cp node_modules/chart.js/dist/chart.umd.min.js "$out/vendor/chart.umd.min.js"
{
  echo "htmx.org $(node -p 'require("./node_modules/htmx.org/package.json").version')"
  echo "chart.js $(node -p 'require("./node_modules/chart.js/package.json").version')"
} > "$out/vendor/VERSIONS"

if [ "${1:-}" = "--check" ]; then
  diff -r "$out" static && echo "frontend/static is up to date"
else
  echo "built frontend/static ($(cat static/vendor/VERSIONS | tr '\n' ' '))"
fi
