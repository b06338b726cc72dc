#!/usr/bin/env bash
# What prefix caching buys a shared-system-prompt workload: every prompt is
# the same PREFIX_LEN tokens followed by INPUT_LEN of its own, sent at each of
# RATES req/s to a disaggregated pair (prefill and decode worker pinned to their
# own cores), once with --enable-prefix-caching=true on both workers and once
# with false. Writes each run's `tandem bench serve --json` and report into
# OUT (default docs/prefix/) and a summary table (summary.tsv): TTFT, KV
# bytes over the wire and saved, prefix-cache hits on each worker.
#
#   benchmarks/prefix/run.sh                 # the recorded experiment
#   NUM_PROMPTS=10 benchmarks/prefix/run.sh  # quicker
#
# Needs build/bin (scripts/build.sh) and the SmolLM2 GGUF (scripts/fetch_model.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
MODEL=${MODEL:-$(scripts/fetch_model.sh)}
OUT=${OUT:-docs/prefix}
PREFIX_LEN=${PREFIX_LEN:-384}
INPUT_LEN=${INPUT_LEN:-32}
OUTPUT_LEN=${OUTPUT_LEN:-16}
NUM_PROMPTS=${NUM_PROMPTS:-40}
RATES=${RATES:-"0.5 1"}
SEED=${SEED:-1}
NCPU=$(nproc)
if [ "$NCPU" -lt 2 ]; then echo "run.sh: needs at least 2 cores to pin two workers" >&2; exit 2; fi
HALF=$((NCPU / 2))
mkdir -p "$OUT"
LOGS=$(mktemp -d)
. benchmarks/lib.sh

for caching in true false; do
  pp=$(free_port); pm=$(free_port); dp=$(free_port); dm=$(free_port)
  taskset -c "0-$((HALF - 1))" "$BIN/prefill_worker" --model="$MODEL" --threads="$HALF" \
    --enable-prefix-caching=$caching --grpc-address=127.0.0.1:$pp \
    --metrics-address=127.0.0.1:$pm >"$LOGS/prefill-$caching.log" 2>&1 &
  PIDS+=($!)
  taskset -c "$HALF-$((NCPU - 1))" "$BIN/decode_worker" --model="$MODEL" \
    --threads="$((NCPU - HALF))" --enable-prefix-caching=$caching \
    --prefill-address=127.0.0.1:$pp --grpc-address=127.0.0.1:$dp \
    --metrics-address=127.0.0.1:$dm >"$LOGS/decode-$caching.log" 2>&1 &
  PIDS+=($!)
  wait_serving 127.0.0.1:$pp
  wait_serving 127.0.0.1:$dp
  for rate in $RATES; do
    name=caching-$([ $caching = true ] && echo on || echo off)-rate$rate
    echo "== $name" >&2
    # The prefill worker's counters before and after: its side of the run.
    curl -s "http://127.0.0.1:$pm/metrics" | grep -E '^tandem_prefix_cache_(queries|hits)_total' \
      | sed 's/^/before /' >"$OUT/$name.prefill-metrics.txt"
    "$BIN/tandem" bench serve --address=127.0.0.1:$dp --metrics-address=127.0.0.1:$dm \
      --model="$MODEL" --prefix-len="$PREFIX_LEN" --input-len="$INPUT_LEN" \
      --output-len="$OUTPUT_LEN" --num-prompts="$NUM_PROMPTS" --request-rate="$rate" \
      --seed="$SEED" --label="$name" --json="$OUT/$name.json" >"$OUT/$name.txt"
    curl -s "http://127.0.0.1:$pm/metrics" | grep -E '^tandem_prefix_cache_(queries|hits)_total' \
      | sed 's/^/after /' >>"$OUT/$name.prefill-metrics.txt"
    grep -E "Median TTFT|P99 TTFT|KV bytes|Prefix cache" "$OUT/$name.txt" | sed 's/^/   /' >&2
  done
  cleanup
  PIDS=()
done

python3 - "$OUT" "$RATES" <<'PY'
import json, os, re, sys
out, rates = sys.argv[1], sys.argv[2].split()
def prefill(name):  # deltas of the prefill worker's counters over the run
    v = {}
    for line in open(os.path.join(out, f"{name}.prefill-metrics.txt")):
        m = re.match(r'(before|after) (tandem_prefix_cache_\w+)\{[^}]*\} (\S+)', line)
        if m: v[m.group(2)] = v.get(m.group(2), 0) + float(m.group(3)) * (1 if m.group(1) == "after" else -1)
    return v
with open(os.path.join(out, "summary.tsv"), "w") as f:
    f.write("setup\trate\tcompleted\tttft_mean_ms\tttft_p50_ms\tttft_p99_ms\ttpot_p50_ms\t"
            "kv_bytes_received\tkv_bytes_saved\tdecode_hit_rate\tprefill_hit_rate\n")
    for name in [f"caching-{c}-rate{r}" for c in ("on", "off") for r in rates]:
        j = json.load(open(os.path.join(out, f"{name}.json")))
        s, w, p = j["summary"], j["worker_metrics_delta"], prefill(name)
        rate = lambda h, q: h / q if q else 0
        f.write(f"{name.rsplit('-rate', 1)[0]}\t{name.rsplit('-rate', 1)[1]}\t{s['completed']}\t{s['ttft']['mean_ms']:.1f}\t{s['ttft']['median_ms']:.1f}\t"
                f"{s['ttft']['p99_ms']:.1f}\t{s['tpot']['median_ms']:.1f}\t"
                f"{w['tandem_kv_transfer_bytes_total']:.0f}\t{w['tandem_kv_transfer_saved_bytes_total']:.0f}\t"
                f"{rate(w['tandem_prefix_cache_hits_total'], w['tandem_prefix_cache_queries_total']):.3f}\t"
                f"{rate(p.get('tandem_prefix_cache_hits_total', 0), p.get('tandem_prefix_cache_queries_total', 0)):.3f}\n")
PY
echo "wrote $OUT/summary.tsv" >&2
column -t -s $'\t' "$OUT/summary.tsv" >&2
