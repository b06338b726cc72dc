#!/usr/bin/env bash
# Tandem against llama.cpp on a GGUF of a real model's layer shape: two
# layers of Qwen3-30B-A3B's (SHAPE=qwen3-moe-2l, the default) or four of
# Llama-3.2-1B's (SHAPE=llama-1b-4l); benchmarks/moe/make_model.py writes it
# once into ~/.cache/tandem/moe as Q8_0, llama.cpp's quantizer makes the
# Q4_K_M file from it, then benchmarks/moe/bench.py times both engines on each.
#
#   benchmarks/moe/run.sh             # 3 rounds at every CPU's thread
#   ROUNDS=1 SHAPE=llama-1b-4l benchmarks/moe/run.sh
#
# Needs build/bin/tandem, the peers virtualenv of benchmarks/peers/run.sh
# (llama-cpp-python), and to make the model torch + transformers (REF_VENV,
# default ~/.cache/tandem/ref-venv) and llama.cpp's source tree (LLAMA_CPP,
# as tests/fixtures/make_family_reference.py says).
set -euo pipefail
cd "$(dirname "$0")/../.."
PEERS_VENV=${PEERS_VENV:-$HOME/.cache/tandem/peers-venv}
REF_VENV=${REF_VENV:-$HOME/.cache/tandem/ref-venv}
CACHE=${CACHE:-$HOME/.cache/tandem/moe}
mkdir -p "$CACHE"
SHAPE=${SHAPE:-qwen3-moe-2l}
GGUF=$CACHE/$SHAPE.q8_0.gguf
if [ ! -f "$GGUF" ]; then
  : "${LLAMA_CPP:?set LLAMA_CPP to the llama.cpp source tree to make the model}"
  LLAMA_CPP=$LLAMA_CPP "$REF_VENV/bin/python" benchmarks/moe/make_model.py "$CACHE" "$SHAPE"
fi
Q4KM=$CACHE/$SHAPE.q4_k_m.gguf
PYTHONPATH=benchmarks/peers "$PEERS_VENV/bin/python" -c \
  "import sys, llama_cpp, peers; peers.quantize(sys.argv[1], sys.argv[2], llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)" \
  "$GGUF" "$Q4KM"
for f in "$GGUF" "$Q4KM"; do
  "$PEERS_VENV/bin/python" benchmarks/moe/bench.py --gguf="$f" --tandem=build/bin/tandem \
    --rounds="${ROUNDS:-3}" ${THREADS:+--threads="$THREADS"}
done
