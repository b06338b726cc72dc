#!/usr/bin/env bash
# Stops what deploy/local/up.sh started (SIGTERM, then waits).
set -uo pipefail
DIR=${TANDEM_LOCAL_DIR:-/tmp/tandem-local}
[ -f "$DIR/pids" ] || exit 0
pids=$(cat "$DIR/pids")
kill -TERM $pids 2>/dev/null
for _ in $(seq 1 100); do
  alive=""
  for p in $pids; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ -z "$alive" ] && break
  sleep 0.1
done
kill -KILL $pids 2>/dev/null
rm -f "$DIR/pids"
