#!/usr/bin/env bash
# deploy/local/up.sh brings up the pair and Prometheus; after traffic,
# Prometheus reports both targets up and a non-zero replay ratio for FULL
# (decode) and PIECEWISE (prefill).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${1:-$ROOT/build/bin}
WORK=$(mktemp -d)
export TANDEM_LOCAL_DIR=$WORK TANDEM_BIN_DIR=$BIN
trap '"$ROOT/deploy/local/down.sh"; rm -rf "$WORK"' EXIT
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
export TANDEM_PREFILL_PORT=$(free_port) TANDEM_DECODE_PORT=$(free_port) TANDEM_HTTP_PORT=$(free_port)
export TANDEM_PREFILL_METRICS_PORT=$(free_port) TANDEM_DECODE_METRICS_PORT=$(free_port)
export TANDEM_PROMETHEUS_PORT=$(free_port)
"$ROOT/deploy/local/up.sh"
for i in 1 2 3 4 5; do
  "$BIN/tandem" generate --address=127.0.0.1:$TANDEM_DECODE_PORT --prompt-token-ids=1,2,3,$i \
    --max-tokens=8 >/dev/null
done
query() {  # prints the first value of an instant query, or nothing
  curl -sfG "http://127.0.0.1:$TANDEM_PROMETHEUS_PORT/api/v1/query" --data-urlencode "query=$1" \
    | /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' \
    2>/dev/null || true
}
for _ in $(seq 1 60); do  # Prometheus scrapes every 5 s: allow 30 s
  up=$(query 'sum(up{job=~"tandem-.*"})')
  full=$(query 'tandem_cudagraph_replay_ratio{role="decode",mode="FULL"}')
  pw=$(query 'tandem_cudagraph_replay_ratio{role="prefill",mode="PIECEWISE"}')
  if [ "$up" = "2" ] && [ -n "$full" ] && [ -n "$pw" ] && \
     /usr/bin/python3 -c "import sys; sys.exit(0 if float('$full') > 0 and float('$pw') > 0 else 1)"; then
    echo "targets up: $up, replay ratio FULL (decode) $full, PIECEWISE (prefill) $pw"
    echo "1 passed, 0 failed"
    exit 0
  fi
  sleep 0.5
done
echo "Prometheus did not report both targets up with non-zero replay ratios (up=$up full=$full piecewise=$pw)" >&2
cat "$WORK/prometheus.log" >&2
exit 1
