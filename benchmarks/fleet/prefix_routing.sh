#!/usr/bin/env bash
# Does adding prefill workers add to the prefix cache or divide it? One decode
# worker and P prefill workers on loopback (synthetic:smollm2-135m, no model
# file), for --prefill-routing=round_robin and =prefix, and one prefill worker
# alone as the reference:
#
#   1. shared system prompts, one request at a time: SYSTEMS system prompts of
#      PREFIX_LEN tokens, PER_SYSTEM requests each (the system prompt and a
#      question of INPUT_LEN tokens of its own). Reports the prefill workers'
#      prefix-cache hits over their prompt tokens, and TTFT.
#   2. one hot system prompt, HOT_PROMPTS requests at once, each with HOT_INPUT
#      tokens of its own (more than one prefill worker computes as fast as
#      they come): each prefill worker's share of the prompt tokens against
#      the fleet's mean.
#
#   benchmarks/fleet/prefix_routing.sh          # P=3
#   P=2 benchmarks/fleet/prefix_routing.sh
#
# Prints a summary table; each run's `tandem bench serve` report is in $OUT.
# Needs build/bin (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
P=${P:-3}
MODEL=${MODEL:-synthetic:smollm2-135m}
SYSTEMS=${SYSTEMS:-4}
PER_SYSTEM=${PER_SYSTEM:-6}
PREFIX_LEN=${PREFIX_LEN:-512}
INPUT_LEN=${INPUT_LEN:-32}
HOT_PROMPTS=${HOT_PROMPTS:-48}
HOT_INPUT=${HOT_INPUT:-256}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
. benchmarks/lib.sh

metric() {  # metric PORT NAME: the counter's value (summed over its labels)
  curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 {s += $2} END {printf "%d\n", s}'
}

run() {  # run LABEL WORKERS ROUTING
  local label=$1 workers=$2 routing=$3
  start_prefills "$workers" "$OUT/$label"
  local targets=$PREFILL_TARGETS mports=("${PREFILL_METRICS[@]}")
  local dp dm
  dp=$(free_port); dm=$(free_port)
  "$BIN/decode_worker" --model="$MODEL" --threads=1 --prefill=remote \
    --prefill-address="ipv4:$targets" --prefill-routing="$routing" \
    --grpc-address=127.0.0.1:$dp --metrics-address=127.0.0.1:$dm >"$OUT/$label-decode.log" 2>&1 &
  PIDS+=($!)
  for t in ${targets//,/ }; do wait_serving "$t"; done
  wait_serving 127.0.0.1:$dp
  # 1. Shared system prompts, one request at a time, the systems interleaved.
  local ttfts=()
  for r in $(seq 1 "$PER_SYSTEM"); do
    for s in $(seq 1 "$SYSTEMS"); do
      "$BIN/tandem" bench serve --address=127.0.0.1:$dp --prefix-len="$PREFIX_LEN" \
        --input-len="$INPUT_LEN" --output-len=4 --num-prompts=1 --max-concurrency=1 \
        --seed=$((s * 1000 + r)) --prefix-seed=$s >"$OUT/$label-s$s-r$r.txt"
      ttfts+=("$(awk '/Median TTFT/ {print $NF}' "$OUT/$label-s$s-r$r.txt")")
    done
  done
  local hits=0 queries=0
  for mp in "${mports[@]}"; do
    hits=$((hits + $(metric "$mp" tandem_prefix_cache_hits_total)))
    queries=$((queries + $(metric "$mp" tandem_prefix_cache_queries_total)))
  done
  local ttft_p50
  ttft_p50=$(printf '%s\n' "${ttfts[@]}" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}')
  # 2. One hot system prompt, all at once: each worker's share of prompt tokens.
  local before=() shares=""
  for mp in "${mports[@]}"; do before+=("$(metric "$mp" tandem_prefix_cache_queries_total)"); done
  "$BIN/tandem" bench serve --address=127.0.0.1:$dp --prefix-len="$PREFIX_LEN" \
    --input-len="$HOT_INPUT" --output-len=4 --num-prompts="$HOT_PROMPTS" --seed=7 \
    --prefix-seed=99 >"$OUT/$label-hot.txt"
  local i=0 got=() total=0
  for mp in "${mports[@]}"; do
    got+=("$(( $(metric "$mp" tandem_prefix_cache_queries_total) - before[i] ))")
    total=$((total + got[i])); i=$((i + 1))
  done
  for g in "${got[@]}"; do shares+="$(awk -v g="$g" -v t="$total" -v n="$workers" 'BEGIN {printf "%.2f ", g / (t / n)}')"; done
  printf '%s\t%d\t%s\t%d / %d = %.3f\t%s ms\t%s\n' "$label" "$workers" "$routing" "$hits" "$queries" \
    "$(awk -v h="$hits" -v q="$queries" 'BEGIN {print h / q}')" "$ttft_p50" "$shares" | tee -a "$OUT/summary.tsv"
  cleanup
  PIDS=()
}

printf 'run\tprefill workers\trouting\tprefill prefix-cache hits / prompt tokens\tTTFT p50\thot prompt: each worker / fleet mean\n' \
  | tee "$OUT/summary.tsv"
run one 1 prefix
run round_robin "$P" round_robin
run prefix "$P" prefix
echo "reports in $OUT" >&2
