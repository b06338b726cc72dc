#!/usr/bin/env bash
# Serving through the OpenAI API, Tandem against llama.cpp's OpenAI server
# (llama-cpp-python[server], PyPI) on the same GGUF and the same cores, with
# the same load: `tandem bench serve --backend=openai-chat`, text prompts
# (prompts.jsonl beside this script) through each model's chat template, at
# one request at a time and at several in flight. Tandem runs aggregated
# (one decode worker prefilling itself, --threads=THREADS); llama.cpp with
# n_threads=THREADS. Neither is asked to ignore EOS (llama-cpp-python's server
# has no such field), so each stops where its model does; the figures are
# per generated token. llama-cpp-python's server runs one request at a time
# (--interrupt_requests False queues the others; by default a new request
# cuts off the one streaming). Writes each run's --json into OUT and summary.md.
#
#   benchmarks/serve/openai_peers.sh
#   PROMPTS=8 CONCURRENCY="1 4" benchmarks/serve/openai_peers.sh
#
# Needs build/bin (scripts/build.sh), the SmolLM2 GGUF (scripts/fetch_model.sh)
# and the peers venv of benchmarks/peers/run.sh (llama-cpp-python; the server's
# extras are added here).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin}
VENV=${PEERS_VENV:-$HOME/.cache/tandem/peers-venv}
MODEL=${MODEL:-$(scripts/fetch_model.sh)}
OUT=${OUT:-docs/serve/openai}
THREADS=${THREADS:-$(nproc)}
PROMPTS=${PROMPTS:-16}
CONCURRENCY=${CONCURRENCY:-"1 4"}
OUTPUT_LEN=${OUTPUT_LEN:-96}
PORT=${PORT:-18123}
TANDEM_FLAGS=${TANDEM_FLAGS:-}             # e.g. --weight-dtype=gguf
[ -x "$VENV/bin/python" ] || { echo "openai_peers: no $VENV (run benchmarks/peers/run.sh first)" >&2; exit 2; }
"$VENV/bin/python" -c "import llama_cpp.server.app" 2>/dev/null \
  || "$VENV/bin/python" -m pip install -q fastapi uvicorn sse-starlette starlette-context pydantic-settings
mkdir -p "$OUT"
LOGS=$(mktemp -d)
PID=""
stop() { if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true; fi; PID=""; }
trap stop EXIT
wait_models() {
  for _ in $(seq 1 300); do
    curl -fsS "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "openai_peers: $1 never answered /v1/models; log in $LOGS" >&2; exit 1
}
run_load() {  # NAME
  for c in $CONCURRENCY; do
    "$BIN/tandem" bench serve --backend=openai-chat --base-url="http://127.0.0.1:$PORT" \
      --dataset=prompts --prompts-file=benchmarks/serve/prompts.jsonl --num-prompts="$PROMPTS" \
      --max-concurrency="$c" --output-len="$OUTPUT_LEN" --ignore-eos=false --seed=1 \
      --label="$1-c$c" --json="$OUT/$1-c$c.json" >"$LOGS/$1-c$c.txt"
    grep -E "Successful|Output token|Mean TTFT|Mean ITL" "$LOGS/$1-c$c.txt" | sed "s/^/$1 c=$c: /"
  done
}

"$BIN/decode_worker" --model="$MODEL" --prefill=local --threads="$THREADS" $TANDEM_FLAGS \
  --grpc-address=127.0.0.1:0 --metrics-address=127.0.0.1:0 --http-address="127.0.0.1:$PORT" \
  >"$LOGS/tandem.log" 2>&1 &
PID=$!
wait_models tandem
run_load tandem
stop

"$VENV/bin/python" -m llama_cpp.server --model "$MODEL" --n_threads "$THREADS" \
  --n_threads_batch "$THREADS" --n_ctx 4096 --interrupt_requests False --host 127.0.0.1 \
  --port "$PORT" >"$LOGS/llamacpp.log" 2>&1 &
PID=$!
wait_models llama.cpp
run_load llamacpp
stop

/usr/bin/python3 - "$OUT" "$CONCURRENCY" <<'PY'
import json, os, sys
out, levels = sys.argv[1], sys.argv[2].split()
rows = ["| server | in flight | completed | output tok/s | mean TTFT ms | p99 TTFT ms | mean ITL ms | tokens generated |",
        "|---|---|---|---|---|---|---|---|"]
for name, label in (("tandem", "Tandem"), ("llamacpp", "llama.cpp (llama-cpp-python server)")):
    for c in levels:
        s = json.load(open(os.path.join(out, f"{name}-c{c}.json")))["summary"]
        rows.append(f"| {label} | {c} | {s['completed']} | {s['output_throughput']:.1f} | "
                    f"{s['ttft']['mean_ms']:.0f} | {s['ttft']['p99_ms']:.0f} | {s['itl']['mean_ms']:.1f} | "
                    f"{s['total_output_tokens']} |")
open(os.path.join(out, "summary.md"), "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
