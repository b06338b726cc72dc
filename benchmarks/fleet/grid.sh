#!/usr/bin/env bash
# A fleet's P:D grid: P prefill and D decode workers as processes on loopback
# (synthetic:smollm2-135m, no model file, one thread each), at P:D = 1:1, 2:1
# and 3:1, for --prefill-routing=round_robin and =prefix. The workload is
# multi-tenant and multi-turn (`tandem bench serve --tenants --turns`):
# TENANTS system prompts of PREFIX_LEN tokens, conversations taking them in
# turn, each of TURNS requests whose prompt extends the last one (the reply,
# OUTPUT_LEN tokens, and INPUT_LEN new ones), sent at RATE requests/s over the
# decode workers (least outstanding requests). Reports, per cell: the
# prefill workers' prefix-cache hits over their prompt tokens, TTFT and ITL
# p50/p99, and goodput at SLO; writes $OUT/grid.tsv and, with gnuplot,
# $OUT/grid.png.
#
#   benchmarks/fleet/grid.sh
#   D=2 RATE=2 benchmarks/fleet/grid.sh
#
# Needs build/bin (scripts/build.sh). Each run's report and JSON: $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
MODEL=${MODEL:-synthetic:smollm2-135m}
D=${D:-1}
PS=${PS:-1 2 3}
TENANTS=${TENANTS:-4}
TURNS=${TURNS:-4}
PREFIX_LEN=${PREFIX_LEN:-512}
INPUT_LEN=${INPUT_LEN:-64}
OUTPUT_LEN=${OUTPUT_LEN:-16}
NUM_PROMPTS=${NUM_PROMPTS:-68}  # 17 conversations: round-robin over 2 or 3 workers does not keep them apart by chance
RATE=${RATE:-1.5}
SLO=${SLO:-ttft:2000,tpot:200}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
. benchmarks/lib.sh

metric() {  # metric PORT NAME: the family's value summed over its labels
  curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n || index($1, n "{") == 1 {s += $2} END {printf "%d\n", s}'
}

cell() {  # cell P ROUTING
  local p=$1 routing=$2 decodes=""
  start_prefills "$p" "$OUT/p$p-$routing"
  local targets=$PREFILL_TARGETS mports=("${PREFILL_METRICS[@]}")
  local dports=()
  for j in $(seq 1 "$D"); do
    local dp dm
    dp=$(free_port); dm=$(free_port)
    "$BIN/decode_worker" --model="$MODEL" --threads=1 --prefill=remote \
      --prefill-address="ipv4:$targets" --prefill-routing="$routing" --http-address=127.0.0.1:0 \
      --grpc-address=127.0.0.1:$dp --metrics-address=127.0.0.1:$dm >"$OUT/p$p-$routing-decode-$j.log" 2>&1 &
    PIDS+=($!)
    dports+=("$dp")
    decodes+="${decodes:+,}127.0.0.1:$dp"
  done
  for t in ${targets//,/ }; do wait_serving "$t"; done
  for dp in "${dports[@]}"; do wait_serving 127.0.0.1:$dp; done
  "$BIN/tandem" bench serve --address="$decodes" --spread=least_outstanding --request-rate="$RATE" \
    --num-prompts="$NUM_PROMPTS" --tenants="$TENANTS" --turns="$TURNS" --prefix-len="$PREFIX_LEN" \
    --input-len="$INPUT_LEN" --output-len="$OUTPUT_LEN" --seed=3 --slo="$SLO" \
    --label="P$p:D$D $routing" --json="$OUT/p$p-$routing.json" >"$OUT/p$p-$routing.txt" 2>&1
  local hits=0 queries=0
  for mp in "${mports[@]}"; do
    hits=$((hits + $(metric "$mp" tandem_prefix_cache_hits_total)))
    queries=$((queries + $(metric "$mp" tandem_prefix_cache_queries_total)))
  done
  python3 - "$OUT/p$p-$routing.json" "$p" "$D" "$routing" "$hits" "$queries" <<'EOF' | tee -a "$OUT/grid.tsv"
import json, sys
d = json.load(open(sys.argv[1]))
s = d["summary"]
p, dd, routing, hits, queries = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
print(f"{p}:{dd}\t{routing}\t{hits}/{queries} = {hits / max(queries, 1):.3f}\t"
      f"{s['ttft']['median_ms']:.0f}\t{s['ttft']['p99_ms']:.0f}\t{s['itl']['median_ms']:.1f}\t"
      f"{s['itl']['p99_ms']:.1f}\t{s['request_goodput']:.2f}\t{s['completed']}/{len(d['requests'])}")
EOF
  cleanup
  PIDS=()
}

printf 'P:D\trouting\tprefill prefix-cache hits / prompt tokens\tTTFT p50 ms\tTTFT p99 ms\tITL p50 ms\tITL p99 ms\tgoodput req/s (%s)\tcompleted\n' "$SLO" \
  | tee "$OUT/grid.tsv"
for p in $PS; do
  if [ "$p" -eq 1 ]; then
    cell 1 prefix  # one prefill worker: routing has nothing to choose
  else
    cell "$p" round_robin
    cell "$p" prefix
  fi
done
if command -v gnuplot >/dev/null; then
  awk -F'\t' 'NR > 1 {split($3, a, " = "); r = $2 == "round_robin" ? "rr" : $2; print $1 "\\n" r, a[2], $4}' \
    "$OUT/grid.tsv" >"$OUT/grid.dat"
  gnuplot <<EOF
set terminal pngcairo size 1000,420 noenhanced
set output "$OUT/grid.png"
set multiplot layout 1,2 title "Fleet grid: $TENANTS tenants x ${PREFIX_LEN}-token system prompts, $TURNS-turn conversations, $RATE req/s"
set style data histogram
set style fill solid 0.8 border -1
set boxwidth 0.8
set yrange [0:*]
set bmargin 4
set title "prefill prefix-cache hits / prompt tokens"
plot "$OUT/grid.dat" using 2:xtic(1) notitle lc rgb "#4472c4"
set title "TTFT p50 (ms)"
plot "$OUT/grid.dat" using 3:xtic(1) notitle lc rgb "#ed7d31"
unset multiplot
EOF
fi
echo "reports in $OUT" >&2
