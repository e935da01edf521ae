#!/usr/bin/env bash
# `make demo`: the product on the embedded default — SQLite, in-memory channel layer, Celery tasks in-process.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export DEBUG=${DEBUG:-1} RECLAIMNET_DEMO=1
unset DATABASE_URL REDIS_URL
HOST=${DEMO_HOST:-127.0.0.1}
PORT=${DEMO_PORT:-8000}

$PY manage.py migrate --noinput -v 0
$PY manage.py seed_campus --demo-users
$PY manage.py collectstatic --noinput -v 0

cat <<MSG

  ReclaimNet portal: http://$HOST:$PORT/
  API docs:          http://$HOST:$PORT/api/docs/
  Django admin:      http://$HOST:$PORT/admin/

  Demo logins (password for all: reclaimnet-demo)
    admin      — campus admin (dashboard, everything)
    provider   — member of lab "Vision Lab" (its nodes, reclaim, kill-switch)
    researcher — member of group "NLP Group" (submit and follow jobs)

  Ctrl-C stops everything.
MSG
exec .venv/bin/daphne -b "$HOST" -p "$PORT" portal.asgi:application
