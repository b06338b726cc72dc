#!/usr/bin/env bash
# Speculative decoding (n-gram prompt lookup) against plain decoding, on this
# machine's cores, SmolLM2-135M's Q4_1 GGUF as stored:
#   batch 1      `tandem generate --local` on each copy prompt
#                (copy_prompts.jsonl: repeat or lightly edit a text) and on 32
#                random prompt ids, ROUNDS interleaved rounds; decode tokens/s
#                after the first token (copy: all prompts' tokens over their
#                time); the greedy outputs with and without speculation must
#                be equal (the script fails otherwise);
#   batch 8, 32  `tandem bench serve` against one decode worker (aggregated,
#                FULL_DECODE_ONLY) with and without --speculative-config, on the
#                copy prompts and on random prompts: throughput, ITL,
#                acceptance and tokens per step from the worker's /metrics.
# Writes OUT (default docs/spec/): summary.md, and each serving run's report
# and JSON.
#
#   benchmarks/spec/run.sh                     # the recorded experiment
#   ROUNDS=3 BATCHES=8 benchmarks/spec/run.sh  # quicker
#
# Needs build/bin (scripts/build.sh) and the SmolLM2 GGUF (scripts/fetch_model.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
MODEL=${MODEL:-$(scripts/fetch_model.sh)}
OUT=${OUT:-docs/spec}
ROUNDS=${ROUNDS:-5}
K=${K:-4}
SPEC=${SPEC:-"{\"method\":\"ngram\",\"num_speculative_tokens\":$K,\"prompt_lookup_min\":2,\"prompt_lookup_max\":4}"}
BATCHES=${BATCHES:-"8 32"}
TOKENS=${TOKENS:-96}          # batch 1: tokens to generate (EOS ends the copy earlier)
OUTPUT_LEN=${OUTPUT_LEN:-64}  # batches: max_tokens of each request
NCPU=$(nproc)
mkdir -p "$OUT"
LOGS=$(mktemp -d)
. benchmarks/lib.sh
PROMPTS=benchmarks/spec/copy_prompts.jsonl
NPROMPTS=$(wc -l <"$PROMPTS")
RANDOM_IDS=$(python3 -c 'import random; r = random.Random(7); print(",".join(str(r.randrange(49152)) for _ in range(32)))')
CPU="$(lscpu | sed -n 's/^Model name: *//p' | head -1) (family $(lscpu | sed -n 's/^CPU family: *//p' | head -1) model $(lscpu | sed -n 's/^Model: *//p' | head -1))"
ISA=$(grep -o -w -E 'avx2|fma|f16c|avx512f|avx512_bf16|amx_tile|asimd|sve' /proc/cpuinfo | sort -u | tr '\n' ' ')

# gen WORKLOAD VARIANT ROUND: one batch-1 run; its output in $LOGS.
gen() {
  local args=(--local --model="$MODEL" --weight-dtype=gguf --cudagraph-mode=FULL_DECODE_ONLY
              --threads="$NCPU" --max-tokens="$TOKENS")
  [ "$2" = spec ] && args+=(--speculative-config="$SPEC")
  if [ "$1" = copy ]; then
    : >"$LOGS/$1.$2.$3.out"; : >"$LOGS/$1.$2.$3.err"
    for i in $(seq 1 "$NPROMPTS"); do
      "$BIN/tandem" generate "${args[@]}" --prompt="$(python3 -c 'import json, sys
print(json.loads(open(sys.argv[1]).readlines()[int(sys.argv[2]) - 1])["prompt"], end="")' "$PROMPTS" "$i")" \
        >>"$LOGS/$1.$2.$3.out" 2>>"$LOGS/$1.$2.$3.err"
    done
  else
    "$BIN/tandem" generate "${args[@]}" --ignore-eos --prompt-token-ids="$RANDOM_IDS" \
      >"$LOGS/$1.$2.$3.all" 2>"$LOGS/$1.$2.$3.err"
    grep -v '^steps:' "$LOGS/$1.$2.$3.all" >"$LOGS/$1.$2.$3.out"
    grep '^steps:' "$LOGS/$1.$2.$3.all" >>"$LOGS/$1.$2.$3.err"
  fi
}

echo "== batch 1: $ROUNDS rounds" >&2
for round in $(seq 1 "$ROUNDS"); do
  for workload in copy random; do
    for variant in plain spec; do gen "$workload" "$variant" "$round"; done
    cmp -s "$LOGS/$workload.plain.$round.out" "$LOGS/$workload.spec.$round.out" || {
      echo "run.sh: $workload: the greedy outputs with and without speculation differ" >&2
      diff "$LOGS/$workload.plain.$round.out" "$LOGS/$workload.spec.$round.out" >&2 || true
      exit 1
    }
  done
done

echo "== batches: $BATCHES" >&2
DP=$(free_port); DM=$(free_port)
for variant in plain spec; do
  extra=()
  [ "$variant" = spec ] && extra=(--speculative-config="$SPEC")
  "$BIN/decode_worker" --model="$MODEL" --weight-dtype=gguf --threads="$NCPU" \
    --grpc-address=127.0.0.1:$DP --metrics-address=127.0.0.1:$DM "${extra[@]}" \
    >"$LOGS/worker.$variant.log" 2>&1 &
  PIDS+=($!)
  wait_serving 127.0.0.1:$DP
  for batch in $BATCHES; do
    for workload in copy random; do
      data=(--dataset=prompts --prompts-file="$PROMPTS" --ignore-eos=false)
      [ "$workload" = random ] && data=(--dataset=random --model="$MODEL" --input-len=32)
      name=$workload-b$batch-$variant
      "$BIN/tandem" bench serve --address=127.0.0.1:$DP --metrics-address=127.0.0.1:$DM \
        "${data[@]}" --num-prompts=$((2 * batch)) --max-concurrency="$batch" --request-rate=inf \
        --output-len="$OUTPUT_LEN" --seed=1 --label="$name" --json="$OUT/$name.json" \
        >"$OUT/$name.txt"
      grep -E "Output token throughput|Median ITL|acceptance|per step" "$OUT/$name.txt" \
        | sed "s/^/   $name: /" >&2
    done
  done
  cleanup
  PIDS=()
done

python3 - "$LOGS" "$OUT" "$ROUNDS" "$BATCHES" "$SPEC" "$CPU" "$ISA" "$NCPU" <<'PYEOF'
import json, re, statistics, sys
logs, out, rounds, batches, spec, cpu, isa, ncpu = sys.argv[1:]
rounds = int(rounds)
DECODE = re.compile(r"decode ([0-9.]+) tokens/s \| (\d+) tokens")
STEPS = re.compile(r"FULL=(\d+) PIECEWISE=(\d+) NONE=(\d+)")
DRAFTS = re.compile(r"accepted (\d+) / (\d+) tokens")

def decode_rate(text):
    """Tokens after the first over their time, summed over the runs in text."""
    tokens = seconds = 0.0
    for rate, count in DECODE.findall(text):
        if float(rate) > 0:
            tokens += int(count) - 1
            seconds += (int(count) - 1) / float(rate)
    return tokens / seconds
lines = [f"Machine: {cpu}, {ncpu} cores, flags: {isa}", "",
         f"`--speculative-config='{spec}'`", "",
         "Batch 1 (`tandem generate --local`, decode tokens/s after the first token, "
         f"{rounds} interleaved rounds; greedy outputs equal in every round):", "",
         "| workload | plain (median) | speculative (median) | ratio | steps plain / spec | accepted / drafted |",
         "|---|---|---|---|---|---|"]
for w in ("copy", "random"):
    rate, steps, acc = {}, {}, ""
    for v in ("plain", "spec"):
        rs = []
        for r in range(1, rounds + 1):
            text = open(f"{logs}/{w}.{v}.{r}.err").read()
            rs.append(decode_rate(text))
            steps[v] = sum(int(x) for m in STEPS.findall(text) for x in m)
            drafts = DRAFTS.findall(text)
            if v == "spec" and drafts:
                acc = f"{sum(int(a) for a, _ in drafts)} / {sum(int(d) for _, d in drafts)}"
        rate[v] = rs
    p, s = statistics.median(rate["plain"]), statistics.median(rate["spec"])
    lines.append(f"| {w} | {p:.1f} ({', '.join(f'{x:.0f}' for x in rate['plain'])}) | "
                 f"{s:.1f} ({', '.join(f'{x:.0f}' for x in rate['spec'])}) | {s / p:.2f}x | "
                 f"{steps['plain']} / {steps['spec']} | {acc or '-'} |")
lines += ["", "Batches (`tandem bench serve`, max concurrency = batch, 2 x batch requests, "
          "all at once; one decode worker on every core):", "",
          "| workload | batch | output tok/s plain | spec | ratio | ITL p50 ms plain | spec | acceptance | tokens/step plain | spec |",
          "|---|---|---|---|---|---|---|---|---|---|"]
for b in batches.split():
    for w in ("copy", "random"):
        j = {v: json.load(open(f"{out}/{w}-b{b}-{v}.json")) for v in ("plain", "spec")}
        tp = {v: j[v]["summary"]["output_throughput"] for v in j}
        itl = {v: j[v]["summary"]["itl"]["median_ms"] for v in j}
        tps = {v: j[v]["worker_metrics_delta"].get("tokens_per_step", 0) for v in j}
        accept = j["spec"]["worker_metrics_delta"].get("spec_decode_acceptance_rate", 0)
        lines.append(f"| {w} | {b} | {tp['plain']:.1f} | {tp['spec']:.1f} | {tp['spec'] / tp['plain']:.2f}x | "
                     f"{itl['plain']:.1f} | {itl['spec']:.1f} | {100 * accept:.0f}% | {tps['plain']:.2f} | {tps['spec']:.2f} |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
