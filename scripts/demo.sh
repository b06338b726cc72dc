#!/usr/bin/env bash
# Starts a prefill worker and a decode worker on loopback, generates tokens
# through the pair with `tandem generate`, then stops both (SIGTERM).
# Extra arguments go to `tandem generate` (e.g. --max-tokens=32 --temperature=0.8).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
PREFILL=127.0.0.1:${PREFILL_PORT:-50052}
DECODE=127.0.0.1:${DECODE_PORT:-50051}
LOGS=$(mktemp -d)
"$BIN/prefill_worker" --grpc-address="$PREFILL" --metrics-address=127.0.0.1:${PREFILL_METRICS_PORT:-9401} \
  >"$LOGS/prefill.log" 2>&1 &
PREFILL_PID=$!
"$BIN/decode_worker" --grpc-address="$DECODE" --metrics-address=127.0.0.1:${DECODE_METRICS_PORT:-9400} \
  --prefill-address="$PREFILL" >"$LOGS/decode.log" 2>&1 &
DECODE_PID=$!
trap 'kill -TERM $DECODE_PID $PREFILL_PID 2>/dev/null; wait $DECODE_PID $PREFILL_PID 2>/dev/null || true' EXIT
for addr in "$PREFILL" "$DECODE"; do
  for _ in $(seq 1 300); do
    "$BIN/tandem" health --address="$addr" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$BIN/tandem" health --address="$addr" >/dev/null || { echo "worker $addr not serving; logs in $LOGS" >&2; exit 1; }
done
echo "prefill worker $PREFILL and decode worker $DECODE are SERVING (logs: $LOGS)"
"$BIN/tandem" generate --address="$DECODE" --prompt-token-ids=1,2,3,4,5 --max-tokens=16 "$@"
