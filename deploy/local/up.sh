#!/usr/bin/env bash
# The deployment topology without Docker: a prefill worker, a decode worker
# and Prometheus (scraping both, with the alert rules) as local processes.
#   deploy/local/up.sh      start (prints the addresses; state in $TANDEM_LOCAL_DIR)
#   deploy/local/down.sh    stop everything it started
# Ports: TANDEM_PREFILL_PORT, TANDEM_DECODE_PORT, TANDEM_PREFILL_METRICS_PORT,
# TANDEM_DECODE_METRICS_PORT, TANDEM_PROMETHEUS_PORT. Binaries: TANDEM_BIN_DIR.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${TANDEM_BIN_DIR:-$ROOT/build/bin}
DIR=${TANDEM_LOCAL_DIR:-/tmp/tandem-local}
PP=${TANDEM_PREFILL_PORT:-50052}
DP=${TANDEM_DECODE_PORT:-50051}
PMP=${TANDEM_PREFILL_METRICS_PORT:-9401}
DMP=${TANDEM_DECODE_METRICS_PORT:-9400}
PROM=${TANDEM_PROMETHEUS_PORT:-9090}
mkdir -p "$DIR"
if [ -f "$DIR/pids" ]; then "$ROOT/deploy/local/down.sh"; fi

"$BIN/prefill_worker" --grpc-address=127.0.0.1:$PP --metrics-address=127.0.0.1:$PMP \
  --cudagraph-mode=PIECEWISE "$@" >"$DIR/prefill.log" 2>&1 &
echo $! >>"$DIR/pids"
"$BIN/decode_worker" --grpc-address=127.0.0.1:$DP --metrics-address=127.0.0.1:$DMP \
  --prefill-address=127.0.0.1:$PP --http-address=127.0.0.1:${TANDEM_HTTP_PORT:-8000} \
  --cudagraph-mode=FULL_DECODE_ONLY "$@" >"$DIR/decode.log" 2>&1 &
echo $! >>"$DIR/pids"

# The compose scrape config and rules, pointed at the local processes.
sed -e "s/prefill:9401/127.0.0.1:$PMP/" -e "s/decode:9400/127.0.0.1:$DMP/" \
    -e "s#/etc/prometheus/alerts.yml#$ROOT/deploy/prometheus/alerts.yml#" \
    "$ROOT/deploy/prometheus/prometheus.yml" >"$DIR/prometheus.yml"
prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/prometheus-data" \
  --web.listen-address=127.0.0.1:$PROM >"$DIR/prometheus.log" 2>&1 &
echo $! >>"$DIR/pids"

for addr in 127.0.0.1:$PP 127.0.0.1:$DP; do
  ok=""
  for _ in $(seq 1 300); do
    if "$BIN/tandem" health --address="$addr" >/dev/null 2>&1; then ok=1; break; fi
    sleep 0.1
  done
  [ -n "$ok" ] || { echo "up.sh: $addr is not SERVING; logs in $DIR" >&2; exit 1; }
done
echo "prefill 127.0.0.1:$PP (metrics :$PMP), decode 127.0.0.1:$DP (metrics :$DMP)," \
     "prometheus http://127.0.0.1:$PROM; logs in $DIR"
