#!/usr/bin/env bash
# Priority scheduling under load: the same mixed workload against a
# disaggregated pair (prefill worker on core 0, decode worker on core 1)
# scheduling first come, first served, then by priority (the short
# interactive class at priority 0, the long batch class at 1), with the
# per-class TTFT of each run. Writes both reports to OUT (default
# docs/priority/).
#
#   benchmarks/priority/run.sh          # ~3 minutes on 2 cores
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="${BIN:-$ROOT/build/bin}"
MODEL="${MODEL:-$("$ROOT/scripts/fetch_model.sh")}"
OUT="${OUT:-$ROOT/docs/priority}"
NUM="${NUM:-96}"
RATE="${RATE:-6}"
MIX="${MIX:-interactive=64/16:1,batch=384/48:3}"
SEQS="${SEQS:-4}"
mkdir -p "$OUT"
LOGS="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

port_after() {  # LOG MARKER: the port after MARKER once the worker logs it
  for _ in $(seq 600); do
    p=$(sed -n "s/.*$2 [^ ]*:\([0-9]*\).*/\1/p" "$1" | head -1)
    if [ -n "$p" ]; then echo "$p"; return; fi
    sleep 0.1
  done
  echo "no '$2' in $1" >&2; cat "$1" >&2; exit 1
}

run() {  # POLICY MIX LABEL
  local policy=$1 mix=$2 label=$3
  taskset -c 0 "$BIN/prefill_worker" --model="$MODEL" --threads=1 --scheduling-policy="$policy" \
    --max-num-seqs="$SEQS" --grpc-address=127.0.0.1:0 --metrics-address=127.0.0.1:0 \
    > "$LOGS/prefill-$label.log" 2>&1 &
  pids+=($!)
  local pport; pport=$(port_after "$LOGS/prefill-$label.log" "gRPC listening on")
  taskset -c 1 "$BIN/decode_worker" --model="$MODEL" --threads=1 --scheduling-policy="$policy" \
    --max-num-seqs="$SEQS" --prefill-address=127.0.0.1:"$pport" --grpc-address=127.0.0.1:0 \
    --metrics-address=127.0.0.1:0 --http-address= > "$LOGS/decode-$label.log" 2>&1 &
  pids+=($!)
  local dport; dport=$(port_after "$LOGS/decode-$label.log" "gRPC listening on")
  for _ in $(seq 600); do
    "$BIN/tandem" health --address=127.0.0.1:"$dport" > /dev/null 2>&1 && break
    sleep 0.2
  done
  "$BIN/tandem" bench serve --address=127.0.0.1:"$dport" --num-prompts="$NUM" \
    --request-rate="$RATE" --mix="$mix" --seed=1 --ignore-eos --label="$label" \
    --json="$OUT/$label.json" | tee "$OUT/$label.txt"
  kill "${pids[@]}"; wait 2>/dev/null || true; pids=()
}

# fcfs refuses a priority other than 0: the same mix without the @ priorities.
run fcfs "$MIX" fcfs
run priority "$(echo "$MIX" | sed 's/interactive=\([^,]*\)/interactive=\1@0/; s/batch=\([^,]*\)/batch=\1@1/')" priority
