#!/usr/bin/env bash
# Tandem against llama.cpp (llama-cpp-python) and transformers on the same
# SmolLM2 weights at 1 and 2 threads, interleaved (peers.py says how).
# Installs the peers from PyPI into a virtualenv (PEERS_VENV, default
# ~/.cache/tandem/peers-venv; llama-cpp-python builds llama.cpp from source
# for this CPU, ~10 minutes on 2 cores the first time), then writes
# docs/peers/peers.txt and peers.json.
#
#   benchmarks/peers/run.sh                  # the recorded comparison
#   ROUNDS=1 benchmarks/peers/run.sh         # quicker
#   TRANSFORMERS=off OUT=docs/peers/avx2 benchmarks/peers/run.sh   # llama.cpp only
#
# Needs build/bin/tandem (scripts/build.sh) and python3 with venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${PEERS_VENV:-$HOME/.cache/tandem/peers-venv}
OUT=${OUT:-docs/peers}
MODEL=${MODEL:-$(scripts/fetch_model.sh)}
if [ ! -x "$VENV/bin/python" ]; then python3 -m venv "$VENV"; fi
# TRANSFORMERS=off skips torch and transformers (a large download): llama.cpp
# f32's greedy tokens are then the reference.
TRANSFORMERS=${TRANSFORMERS:-on}
PKGS=(llama-cpp-python gguf numpy)
[ "$TRANSFORMERS" = on ] && PKGS+=(torch transformers accelerate)
if ! "$VENV/bin/python" -c "import llama_cpp, gguf$([ "$TRANSFORMERS" = on ] && echo ', transformers, torch')" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --upgrade pip
  CMAKE_ARGS="-DGGML_NATIVE=ON" "$VENV/bin/python" -m pip install -q "${PKGS[@]}"
fi
mkdir -p "$OUT"
"$VENV/bin/python" benchmarks/peers/peers.py --gguf="$MODEL" --tandem=build/bin/tandem \
  --threads="${THREADS:-1,2}" --rounds="${ROUNDS:-3}" --transformers="$TRANSFORMERS" \
  --json="$OUT/peers.json" | tee "$OUT/peers.txt"
