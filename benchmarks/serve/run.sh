#!/usr/bin/env bash
# What disaggregation buys, measured: the same mixed workload (mostly short
# chats plus some long prompts) at several request rates against
#   aggregated     one decode worker on every core, prefilling itself;
#   disaggregated  a prefill worker and a decode worker, each pinned to its
#                  own cores (taskset);
#   conditional    as disaggregated, but the decode worker prefills short
#                  prompts itself (--local-prefill-max-tokens).
# Writes each run's `tandem bench serve --json` into OUT (default
# docs/serve/), a summary table (summary.tsv) and PNG plots with gnuplot:
# TTFT and ITL p50/p99 against request rate, and ITL over time for one run.
#
#   benchmarks/serve/run.sh                       # the recorded experiment
#   RATES="0.5 1" PROMPTS_PER_RATE=20 benchmarks/serve/run.sh   # quicker
#
# Needs build/bin (scripts/build.sh), the SmolLM2 GGUF (scripts/fetch_model.sh),
# gnuplot (Debian's gnuplot-nox) and python3 (standard library only).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
MODEL=${MODEL:-$(scripts/fetch_model.sh)}
OUT=${OUT:-docs/serve}
RATES=${RATES:-"0.5 1 2 3"}
SECONDS_PER_RATE=${SECONDS_PER_RATE:-60}   # requests per run = rate x this (at least 16)
MIX=${MIX:-"chat=64/32:0.85,doc=512/8:0.15"}
LOCAL_MAX=${LOCAL_MAX:-128}                # conditional: prompts up to this stay local
ITL_RUN_RATE=${ITL_RUN_RATE:-2}          # the rate whose ITL-over-time is plotted
SEED=${SEED:-1}
NCPU=$(nproc)
if [ "$NCPU" -lt 2 ]; then echo "run.sh: needs at least 2 cores to pin two workers" >&2; exit 2; fi
HALF=$((NCPU / 2))
ALL="0-$((NCPU - 1))"
PREFILL_CPUS="0-$((HALF - 1))"
DECODE_CPUS="$HALF-$((NCPU - 1))"
mkdir -p "$OUT"
LOGS=$(mktemp -d)
. benchmarks/lib.sh

# start_setup NAME: starts the workers of a setup; sets DECODE and METRICS.
start_setup() {
  local name=$1 dp dm pp pm
  dp=$(free_port); dm=$(free_port)
  DECODE=127.0.0.1:$dp; METRICS=127.0.0.1:$dm
  case $name in
    aggregated)
      taskset -c "$ALL" "$BIN/decode_worker" --model="$MODEL" --threads="$NCPU" \
        --grpc-address="$DECODE" --metrics-address="$METRICS" >"$LOGS/$name.decode.log" 2>&1 &
      PIDS+=($!) ;;
    disaggregated|conditional)
      pp=$(free_port); pm=$(free_port)
      taskset -c "$PREFILL_CPUS" "$BIN/prefill_worker" --model="$MODEL" --threads="$HALF" \
        --grpc-address=127.0.0.1:$pp --metrics-address=127.0.0.1:$pm >"$LOGS/$name.prefill.log" 2>&1 &
      PIDS+=($!)
      local extra=()
      [ "$name" = conditional ] && extra=(--local-prefill-max-tokens="$LOCAL_MAX")
      taskset -c "$DECODE_CPUS" "$BIN/decode_worker" --model="$MODEL" --threads="$((NCPU - HALF))" \
        --prefill-address=127.0.0.1:$pp --grpc-address="$DECODE" --metrics-address="$METRICS" \
        "${extra[@]}" >"$LOGS/$name.decode.log" 2>&1 &
      PIDS+=($!)
      wait_serving 127.0.0.1:$pp ;;
  esac
  wait_serving "$DECODE"
}

for setup in aggregated disaggregated conditional; do
  start_setup "$setup"
  echo "== $setup (decode $DECODE)" >&2
  for rate in $RATES; do
    n=$(python3 -c "print(max(16, round($rate * $SECONDS_PER_RATE)))")
    "$BIN/tandem" bench serve --address="$DECODE" --metrics-address="$METRICS" \
      --model="$MODEL" --mix="$MIX" --num-prompts="$n" --request-rate="$rate" --seed="$SEED" \
      --slo=ttft:2000,tpot:250 --label="$setup" --json="$OUT/$setup-rate$rate.json" \
      >"$OUT/$setup-rate$rate.txt"
    grep -E "Successful|Median TTFT|P99 TTFT|Median ITL|P99 ITL" "$OUT/$setup-rate$rate.txt" | sed 's/^/   /' >&2
  done
  cleanup
  PIDS=()
done

# JSON -> gnuplot data, then the plots.
python3 - "$OUT" "$RATES" "$ITL_RUN_RATE" <<'EOF'
import json, sys, os
out, rates, itl_rate = sys.argv[1], sys.argv[2].split(), sys.argv[3]
setups = ["aggregated", "disaggregated", "conditional"]
with open(os.path.join(out, "summary.tsv"), "w") as f:
    f.write("setup\trate\tcompleted\tfailed\treq_per_s\tgoodput\toutput_tok_per_s\t"
            "ttft_p50_ms\tttft_p99_ms\titl_p50_ms\titl_p99_ms\ttpot_p50_ms\t"
            "chat_ttft_p50_ms\tdoc_ttft_p50_ms\tfull_replay_ratio\tkv_bytes\n")
    for s in setups:
        for r in rates:
            j = json.load(open(os.path.join(out, f"{s}-rate{r}.json")))
            m, c, w = j["summary"], j["by_class"], j["worker_metrics_delta"]
            cls = lambda k: c.get(k, {}).get("ttft", {}).get("median_ms", float("nan"))
            f.write(f"{s}\t{r}\t{m['completed']}\t{m['failed']}\t{m['request_throughput']:.3f}\t"
                    f"{m['request_goodput']:.3f}\t{m['output_throughput']:.2f}\t"
                    f"{m['ttft']['median_ms']:.1f}\t{m['ttft']['p99_ms']:.1f}\t"
                    f"{m['itl']['median_ms']:.1f}\t{m['itl']['p99_ms']:.1f}\t{m['tpot']['median_ms']:.1f}\t"
                    f"{cls('chat'):.1f}\t{cls('doc'):.1f}\t"
                    f"{w.get('full_replay_ratio', 0):.3f}\t{w.get('tandem_kv_transfer_bytes_total', 0):.0f}\n")
for s in setups:
    j = json.load(open(os.path.join(out, f"{s}-rate{itl_rate}.json")))
    with open(os.path.join(out, f"itl-{s}.dat"), "w") as f:
        for req in j["requests"]:
            t = req["start_s"] + req["ttft_s"]
            for gap in req["itl_s"]:
                t += gap
                f.write(f"{t:.4f}\t{gap * 1e3:.2f}\n")
EOF

gnuplot <<EOF
set terminal pngcairo size 1200,480 font "sans,10"
set datafile separator "\t"
set key top left
set grid
set logscale y
setups = "aggregated disaggregated conditional"
rows(s) = "< grep '^".s."\t' $OUT/summary.tsv"
set xlabel "request rate (req/s)"
set ylabel "ms (log)"
set output "$OUT/latency_vs_rate.png"
set multiplot layout 1,2 title "SmolLM2-135M on $NCPU CPU cores, mix $MIX: p50 solid, p99 dashed"
set title "time to first token"
plot for [i=1:3] rows(word(setups,i)) using 2:8 with linespoints lc i title word(setups,i)." p50", \
     for [i=1:3] rows(word(setups,i)) using 2:9 with linespoints lc i dashtype 2 title word(setups,i)." p99"
set title "inter-token latency"
plot for [i=1:3] rows(word(setups,i)) using 2:10 with linespoints lc i title word(setups,i)." p50", \
     for [i=1:3] rows(word(setups,i)) using 2:11 with linespoints lc i dashtype 2 title word(setups,i)." p99"
unset multiplot
set output "$OUT/itl_over_time.png"
set title "inter-token latency of every token over one run (rate $ITL_RUN_RATE req/s)"
set xlabel "seconds since the first request"
plot for [i=1:3] "$OUT/itl-".word(setups,i).".dat" using 1:2 with points pointsize 0.5 lc i title word(setups,i)
EOF
rm -f "$OUT"/itl-*.dat
echo "wrote $OUT/summary.tsv, $OUT/latency_vs_rate.png, $OUT/itl_over_time.png" >&2
column -t -s $'\t' "$OUT/summary.tsv" >&2
