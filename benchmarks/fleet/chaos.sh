#!/usr/bin/env bash
# A fleet under faults while it is loaded. P prefill and D decode workers on
# loopback (synthetic:smollm2-135m, no model file), every decode worker given
# every prefill worker (--prefill-routing=prefix); `tandem bench serve` spreads
# a steady request rate over the decode workers (least outstanding requests,
# as a gateway would). While it runs:
#
#   at KILL_AT s     kill -9 prefill worker 1
#   at STOP_AT s     SIGSTOP prefill worker 2, SIGCONT after STOP_SECONDS
#   at RESTART_AT s  start prefill worker 1 again on its old port
#   at DRAIN_AT s    SIGTERM the last decode worker (it drains and exits)
#
# Then checks, and prints as a table:
#   - every request completed, or ended with a clean retryable status
#     (UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED) within its budget: none hung
#     (the load tool finished before its own deadline), none lost (any other
#     status), none over BUDGET_SECONDS;
#   - no KV block stays held: tandem_kv_cache_blocks_in_use is 0 on every
#     worker still running, once the leases of transfers whose reader went
#     away expired (--kv-export-timeout-seconds);
#   - the drained decode worker exited 0;
#   - routing adapted: each prefill worker's prompt tokens, the decode
#     workers' routing reasons and transfer failures.
# Exits 1 when a check fails.
#
#   benchmarks/fleet/chaos.sh            # the full run: 20 s SIGSTOP, ~2 min
#   benchmarks/fleet/chaos.sh --short    # CI's: the same faults, 5 s SIGSTOP, ~40 s
#
# Needs build/bin (scripts/build.sh). Logs and the load tool's JSON: $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
MODEL=${MODEL:-synthetic:smollm2-135m}
P=${P:-3}
D=${D:-2}
if [ "${1:-}" = "--short" ]; then
  DURATION=${DURATION:-24} RATE=${RATE:-3} STOP_SECONDS=${STOP_SECONDS:-5}
  KILL_AT=${KILL_AT:-3} STOP_AT=${STOP_AT:-6} RESTART_AT=${RESTART_AT:-12} DRAIN_AT=${DRAIN_AT:-16}
  LEASE=${LEASE:-5}
else
  DURATION=${DURATION:-90} RATE=${RATE:-4} STOP_SECONDS=${STOP_SECONDS:-20}
  KILL_AT=${KILL_AT:-10} STOP_AT=${STOP_AT:-20} RESTART_AT=${RESTART_AT:-45} DRAIN_AT=${DRAIN_AT:-60}
  LEASE=${LEASE:-10}
fi
INPUT_LEN=${INPUT_LEN:-96}
PREFIX_LEN=${PREFIX_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-16}
BUDGET_SECONDS=${BUDGET_SECONDS:-60}
KEEP_OUT=${OUT:+1}  # a directory of the caller's is kept; a temporary one goes on success
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
. benchmarks/lib.sh

metric() {  # metric PORT NAME: the family's value summed over its labels ("" when unreachable)
  curl -s --max-time 5 "http://127.0.0.1:$1/metrics" |
    awk -v n="$2" '$1 == n || index($1, n "{") == 1 {s += $2; f = 1} END {if (f) printf "%d\n", s}'
}
labelled() {  # labelled PORT NAME: "label=value ..." of the family's series
  curl -s --max-time 5 "http://127.0.0.1:$1/metrics" |
    awk -v n="$2" 'index($1, n "{") == 1 && $2 > 0 {
      match($1, /(reason|outcome)="[^"]*"/); printf "%s=%d ", substr($1, RSTART, RLENGTH), $2}'
}

PREFILL_PORTS=() PREFILL_METRICS=() PREFILL_PIDS=()
start_prefill() {  # start_prefill I: prefill worker I on its ports (the same ones on a restart)
  local i=$1
  "$BIN/prefill_worker" --model="$MODEL" --threads=1 --grpc-address=127.0.0.1:${PREFILL_PORTS[i]} \
    --metrics-address=127.0.0.1:${PREFILL_METRICS[i]} --kv-export-timeout-seconds="$LEASE" \
    >>"$OUT/prefill-$i.log" 2>&1 &
  PREFILL_PIDS[i]=$!
  PIDS+=($!)
}
targets=""
for i in $(seq 0 $((P - 1))); do
  PREFILL_PORTS[i]=$(free_port); PREFILL_METRICS[i]=$(free_port)
  start_prefill "$i"
  targets+="${targets:+,}127.0.0.1:${PREFILL_PORTS[i]}"
done
DECODE_PORTS=() DECODE_METRICS=() DECODE_PIDS=() decodes=""
for j in $(seq 0 $((D - 1))); do
  DECODE_PORTS[j]=$(free_port); DECODE_METRICS[j]=$(free_port)
  "$BIN/decode_worker" --model="$MODEL" --threads=1 --prefill=remote --prefill-address="ipv4:$targets" \
    --grpc-address=127.0.0.1:${DECODE_PORTS[j]} --metrics-address=127.0.0.1:${DECODE_METRICS[j]} \
    --http-address=127.0.0.1:0 \
    --drain-seconds=10 >"$OUT/decode-$j.log" 2>&1 &
  DECODE_PIDS[j]=$!
  PIDS+=($!)
  decodes+="${decodes:+,}127.0.0.1:${DECODE_PORTS[j]}"
done
for i in $(seq 0 $((P - 1))); do wait_serving 127.0.0.1:${PREFILL_PORTS[i]}; done
for j in $(seq 0 $((D - 1))); do wait_serving 127.0.0.1:${DECODE_PORTS[j]}; done

NUM_PROMPTS=$(awk -v d="$DURATION" -v r="$RATE" 'BEGIN {printf "%d", d * r}')
echo "chaos: $P prefill, $D decode workers; $NUM_PROMPTS requests at $RATE/s; kill -9 prefill 1 at ${KILL_AT}s," \
  "SIGSTOP prefill 2 at ${STOP_AT}s for ${STOP_SECONDS}s, restart prefill 1 at ${RESTART_AT}s," \
  "SIGTERM decode $D at ${DRAIN_AT}s; logs in $OUT" >&2
# The load tool's own deadline: the last arrival, one request budget, slack.
LOAD_DEADLINE=$((DURATION + BUDGET_SECONDS + 30))
timeout "$LOAD_DEADLINE" "$BIN/tandem" bench serve --address="$decodes" --spread=least_outstanding \
  --request-rate="$RATE" --num-prompts="$NUM_PROMPTS" --input-len="$INPUT_LEN" --range-ratio=0.5 \
  --prefix-len="$PREFIX_LEN" --output-len="$OUTPUT_LEN" --timeout-seconds="$BUDGET_SECONDS" --seed=11 \
  --json="$OUT/load.json" >"$OUT/load.txt" 2>&1 &
LOAD=$!

t0=$SECONDS
at() { while [ $((SECONDS - t0)) -lt "$1" ]; do sleep 0.2; done; }
at "$KILL_AT"; kill -9 "${PREFILL_PIDS[0]}"; echo "chaos: $((SECONDS - t0))s kill -9 prefill 1" >&2
at "$STOP_AT"; kill -STOP "${PREFILL_PIDS[1]}"; echo "chaos: $((SECONDS - t0))s SIGSTOP prefill 2" >&2
at "$((STOP_AT + STOP_SECONDS))"; kill -CONT "${PREFILL_PIDS[1]}"; echo "chaos: $((SECONDS - t0))s SIGCONT prefill 2" >&2
at "$RESTART_AT"; start_prefill 0; echo "chaos: $((SECONDS - t0))s prefill 1 restarted" >&2
at "$DRAIN_AT"; kill -TERM "${DECODE_PIDS[D - 1]}"; echo "chaos: $((SECONDS - t0))s SIGTERM decode $D" >&2

fail=0
load_rc=0
wait "$LOAD" || load_rc=$?
# The drained worker exits within its drain (10 s) and a little more, or it
# hung: killed, and the run fails.
drained_rc=0
for _ in $(seq 1 100); do kill -0 "${DECODE_PIDS[D - 1]}" 2>/dev/null || break; sleep 0.3; done
if kill -0 "${DECODE_PIDS[D - 1]}" 2>/dev/null; then
  echo "chaos: FAIL: the drained decode worker was still running 30 s after its drain began" >&2
  kill -9 "${DECODE_PIDS[D - 1]}"
  fail=1
fi
wait "${DECODE_PIDS[D - 1]}" || drained_rc=$?
if [ "$load_rc" -eq 124 ]; then
  echo "chaos: FAIL: the load tool was still waiting after ${LOAD_DEADLINE}s: requests hung" >&2
  fail=1
fi

# Outcomes, from the load tool's per-request records.
read -r total ok retryable lost over < <(python3 - "$OUT/load.json" "$BUDGET_SECONDS" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
budget = float(sys.argv[2])
reqs = d["requests"]
ok = sum(r["status"] == "OK" for r in reqs)
retryable = sum(r["status"] in ("UNAVAILABLE", "RESOURCE_EXHAUSTED", "ABORTED") for r in reqs)
over = sum(r["e2e_s"] > budget + 1 for r in reqs)
print(len(reqs), ok, retryable, len(reqs) - ok - retryable, over)
EOF
) || { echo "chaos: FAIL: no report from the load tool ($OUT/load.txt)" >&2; total=0 ok=0 retryable=0 lost=$NUM_PROMPTS over=0; fail=1; }
[ "$total" -eq "$NUM_PROMPTS" ] || { echo "chaos: FAIL: $total of $NUM_PROMPTS requests reported" >&2; fail=1; }
[ "$lost" -eq 0 ] || { echo "chaos: FAIL: $lost requests ended with a status that is not retryable:" >&2
  python3 -c "import json,sys; [print('  ', r['status'], r['error'][:200]) for r in json.load(open(sys.argv[1]))['requests'] if r['status'] not in ('OK','UNAVAILABLE','RESOURCE_EXHAUSTED','ABORTED')]" "$OUT/load.json" >&2; fail=1; }
[ "$over" -eq 0 ] || { echo "chaos: FAIL: $over requests took longer than their ${BUDGET_SECONDS}s budget" >&2; fail=1; }
[ "$drained_rc" -eq 0 ] || { echo "chaos: FAIL: the drained decode worker exited $drained_rc" >&2; fail=1; }

# Blocks: every worker still running holds none once idle (transfers whose
# reader left are freed when their lease expires).
leaked=""
deadline=$((SECONDS + 3 * LEASE + 10))
while :; do
  leaked=""
  for i in $(seq 0 $((P - 1))); do
    n=$(metric "${PREFILL_METRICS[i]}" tandem_kv_cache_blocks_in_use)
    [ "${n:-x}" = "0" ] || leaked+="prefill-$((i + 1))=${n:-unreachable} "
  done
  for j in $(seq 0 $((D - 2))); do
    n=$(metric "${DECODE_METRICS[j]}" tandem_kv_cache_blocks_in_use)
    [ "${n:-x}" = "0" ] || leaked+="decode-$((j + 1))=${n:-unreachable} "
  done
  [ -z "$leaked" ] || [ $SECONDS -ge $deadline ] && break
  sleep 0.5
done
[ -z "$leaked" ] || { echo "chaos: FAIL: KV blocks still held: $leaked" >&2; fail=1; }

{
  printf 'requests\tcompleted\tretryable errors\tlost or non-retryable\tover budget\tdrained decode exit\tblocks held after\n'
  printf '%d\t%d\t%d\t%d\t%d\t%d\t%s\n' "$total" "$ok" "$retryable" "$lost" "$over" "$drained_rc" "${leaked:-0 on every worker}"
  for i in $(seq 0 $((P - 1))); do
    printf 'prefill-%d prompt tokens (since its last start): %s\n' $((i + 1)) \
      "$(metric "${PREFILL_METRICS[i]}" tandem_prefix_cache_queries_total)"
  done
  for j in $(seq 0 $((D - 2))); do
    printf 'decode-%d routes: %s| transfer failures: %s\n' $((j + 1)) \
      "$(labelled "${DECODE_METRICS[j]}" tandem_prefill_routes_total)" \
      "$(labelled "${DECODE_METRICS[j]}" tandem_kv_transfer_failures_total)"
  done
  grep -E "^(Successful|Failed)" "$OUT/load.txt" || true
} | tee "$OUT/summary.txt"
if [ "$fail" -eq 0 ]; then
  echo "chaos: OK" >&2
  cleanup
  [ -n "$KEEP_OUT" ] || rm -rf "$OUT"
fi
exit "$fail"
