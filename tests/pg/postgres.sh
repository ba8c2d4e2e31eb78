#!/bin/bash
# A throwaway PostgreSQL server for the store, controller and report tests.
#
#   tests/pg/postgres.sh [up|down|status]      (default: up)
#
# Debian's own PostgreSQL (package `postgresql`: 15 on Debian 12, 17 on Debian 13), one
# server run as the `postgres` user from a data folder under $PG_TEST_DIR, listening on
# 127.0.0.1:$PG_PORT and a socket in that folder only (no system cluster, no systemd,
# nothing written to /etc/postgresql). 'up' makes a fresh data folder (initdb, trust
# authentication on the loopback: a test server, never a site's), starts it and creates the
# database $PG_DB; 'down' stops the server and removes the folder.
# Run as root (it switches to `postgres` for initdb and pg_ctl) or as the `postgres` user.
#
# Environment (all optional):
#   PG_TEST_DIR=/tmp/pipeswift-pg    data, socket and log
#   PG_PORT=55433                    pick another to run a second server
#   PG_DB=pipeswift_test
#   INSTALL=1                        apt-get install postgresql when no server is found
#
# After 'up':  source "$PG_TEST_DIR/env.sh"   (exports PIPESWIFT_TEST_POSTGRES_URL, a
# postgresql+psycopg:// URL for the tests, and PG_TEST_PSQL, a psql command line for it)
set -euo pipefail

ACTION=${1:-up}
DIR=${PG_TEST_DIR:-/tmp/pipeswift-pg}
PORT=${PG_PORT:-55433}
DB=${PG_DB:-pipeswift_test}
DATA=$DIR/data

bindir() {
  # The newest server Debian installed (/usr/lib/postgresql/<major>/bin).
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$d" ] && [ "${INSTALL:-0}" = 1 ]; then
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  fi
  [ -n "$d" ] || { echo "tests/pg/postgres.sh: no PostgreSQL server (apt-get install postgresql)" >&2; exit 2; }
  echo "$d"
}

as_pg() {
  if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi
}

running() { [ -f "$DATA/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

BIN=$(bindir)
case "$ACTION" in
  up)
    if running; then as_pg "$BIN/pg_ctl" -D "$DATA" -m immediate stop >/dev/null 2>&1 || true; fi
    rm -rf "$DIR"
    mkdir -p "$DIR"
    [ "$(id -un)" = postgres ] || chown postgres: "$DIR"
    as_pg "$BIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 \
      || { cat "$DIR/initdb.log" >&2; exit 1; }
    # fsync off: a test server that is thrown away; a site's server keeps the defaults.
    as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 60 start \
      -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" >/dev/null \
      || { tail -20 "$DIR/server.log" >&2; exit 1; }
    as_pg "$BIN/createdb" -h "$DIR" -p "$PORT" -U postgres "$DB"
    URL="postgresql+psycopg://postgres@127.0.0.1:$PORT/$DB"
    cat >"$DIR/env.sh" <<EOF
export PIPESWIFT_TEST_POSTGRES_URL=$URL
export PG_TEST_PSQL="$BIN/psql -h 127.0.0.1 -p $PORT -U postgres -X -v ON_ERROR_STOP=1 $DB"
EOF
    echo "PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') up: $URL (source $DIR/env.sh)"
    ;;
  down)
    if running; then as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 30 stop >/dev/null; fi
    rm -rf "$DIR"
    ;;
  status)
    if running; then echo "up ($DIR, port $PORT)"; else echo "down"; exit 1; fi
    ;;
  *)
    echo "usage: tests/pg/postgres.sh [up|down|status]" >&2; exit 2
    ;;
esac
