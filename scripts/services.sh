#!/usr/bin/env bash
# Make sure PostgreSQL and Redis answer on 127.0.0.1; install (Debian) and start them if needed, then create
# the project's role and test database. Idempotent; prints what it did. Used by `make test` and .ci/run.
set -euo pipefail

PG_HOST=127.0.0.1
PG_PORT=5432
REDIS_PORT=6379
DB_USER=${RECLAIMNET_DB_USER:-reclaimnet}
DB_NAME=${RECLAIMNET_DB_NAME:-reclaimnet}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_installed=0
ensure_pkg() {
  local bin=$1 pkg=$2
  if ! command -v "$bin" >/dev/null 2>&1 && ! dpkg -s "$pkg" >/dev/null 2>&1; then
    if [ $apt_installed = 0 ]; then as_root apt-get update -qq; apt_installed=1; fi
    echo "services: installing $pkg"
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$pkg" >/dev/null
  fi
}

if ! pg_isready -q -h $PG_HOST -p $PG_PORT 2>/dev/null; then
  ensure_pkg pg_ctlcluster postgresql
  echo "services: starting PostgreSQL"
  as_root pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start || true
  for _ in $(seq 1 50); do pg_isready -q -h $PG_HOST -p $PG_PORT && break; sleep 0.2; done
fi
pg_isready -q -h $PG_HOST -p $PG_PORT || { echo "services: PostgreSQL does not answer on $PG_HOST:$PG_PORT" >&2; exit 1; }

if [ "$(psql -qAt -h $PG_HOST -p $PG_PORT -U postgres -c "SELECT 1 FROM pg_roles WHERE rolname='$DB_USER'" postgres)" != 1 ]; then
  echo "services: creating role $DB_USER"
  psql -q -h $PG_HOST -p $PG_PORT -U postgres -c "CREATE ROLE $DB_USER LOGIN CREATEDB" postgres
fi
if [ "$(psql -qAt -h $PG_HOST -p $PG_PORT -U postgres -c "SELECT 1 FROM pg_database WHERE datname='$DB_NAME'" postgres)" != 1 ]; then
  echo "services: creating database $DB_NAME"
  psql -q -h $PG_HOST -p $PG_PORT -U postgres -c "CREATE DATABASE $DB_NAME OWNER $DB_USER" postgres
fi

if ! redis-cli -h 127.0.0.1 -p $REDIS_PORT ping >/dev/null 2>&1; then
  ensure_pkg redis-server redis-server
  echo "services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  redis-server --daemonize yes --bind 127.0.0.1 --port $REDIS_PORT --save "" --appendonly no \
    --dir /tmp --logfile /tmp/reclaimnet-redis.log
  for _ in $(seq 1 50); do redis-cli -h 127.0.0.1 -p $REDIS_PORT ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
redis-cli -h 127.0.0.1 -p $REDIS_PORT ping >/dev/null || { echo "services: Redis does not answer" >&2; exit 1; }
echo "services: PostgreSQL $PG_HOST:$PG_PORT (database $DB_NAME) and Redis 127.0.0.1:$REDIS_PORT are up"
