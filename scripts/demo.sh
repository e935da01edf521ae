#!/usr/bin/env bash
# `make demo`: the product on the embedded default — SQLite, in-memory channel layer, Celery tasks in-process,
# the control loop as an asyncio task inside daphne (portal/control/loop/embedded.py), and a few simulated agents
# (the real agent code with simulated GPUs, running a small numpy training job) so reclaim shows a migration.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${DEMO_PYTHON:-.venv/bin/python}
# As production runs (DEBUG off: the portal's own 400/403/404/500 pages, never Django's technical pages; static
# files from collectstatic through whitenoise), except plain http on loopback instead of HTTPS behind a proxy.
export DEBUG=${DEBUG:-0} RECLAIMNET_DEMO=1 RECLAIMNET_INSECURE_HTTP=${RECLAIMNET_INSECURE_HTTP:-1}
unset DATABASE_URL REDIS_URL
# Short periods so a visitor sees things happen (design §2 control period, heartbeats).
export RECLAIMNET_CONTROL_PERIOD_S=${RECLAIMNET_CONTROL_PERIOD_S:-2}
export RECLAIMNET_HEARTBEAT_INTERVAL_S=${RECLAIMNET_HEARTBEAT_INTERVAL_S:-1}
export RECLAIMNET_HEARTBEAT_TIMEOUT_S=${RECLAIMNET_HEARTBEAT_TIMEOUT_S:-6}
HOST=${DEMO_HOST:-127.0.0.1}
PORT=${DEMO_PORT:-8000}
AGENTS=${DEMO_AGENTS:-4}
# A secret key generated once for this checkout (never committed), so logins survive a restart of the demo.
# Readable by its owner only (docs/design.md §9.9): created 0600, and a key an older run left readable is
# tightened, as is the folder.
DEMO_DIR=${DEMO_DIR:-$PWD/.demo}
mkdir -p "$DEMO_DIR"
chmod 700 "$DEMO_DIR"
[ -s "$DEMO_DIR/secret_key" ] || (umask 077; $PY -c 'import secrets; print(secrets.token_urlsafe(50))' > "$DEMO_DIR/secret_key")
chmod 600 "$DEMO_DIR/secret_key"
export SECRET_KEY_FILE=$DEMO_DIR/secret_key

$PY manage.py migrate --noinput -v 0
$PY manage.py seed_campus --demo-users
$PY manage.py seed_history --past-only  # 48 h of past reclaims and migrations so the dashboard has data
$PY manage.py collectstatic --noinput -v 0

cat <<MSG

  ReclaimNet portal: http://$HOST:$PORT/
  API docs:          http://$HOST:$PORT/api/docs/
  Django admin:      http://$HOST:$PORT/admin/

  Demo logins (password for all: reclaimnet-demo)
    admin      — campus admin (dashboard, everything)
    provider   — member of lab "Vision Lab" (its nodes, reclaim, kill-switch)
    researcher — member of group "NLP Group" (submit and follow jobs)

  $AGENTS simulated agents (Vision Lab's nodes first) run a small numpy training job: log in as provider,
  reclaim the node it runs on, and watch it checkpoint, move and resume. Agent logs: .demo/agents/<node>/
  Ctrl-C stops everything.
MSG

PIDS=()
cleanup() {
  # Stop only what this script started, by PID.
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

.venv/bin/daphne -b "$HOST" -p "$PORT" portal.asgi:application &
PIDS+=($!)
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null && break
  sleep 0.1
done
$PY manage.py demo_agents --count "$AGENTS" --portal "ws://$HOST:$PORT/ws/agent/" --submit-jobs 2 &
PIDS+=($!)
wait "${PIDS[0]}"
