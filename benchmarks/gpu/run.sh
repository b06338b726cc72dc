#!/usr/bin/env bash
# On a GPU host, from the repository root, with the folder bundle.sh made:
# the CUDA tests, `tandem bench step` (graphs against eager) for both
# synthetic presets, the KV hand-off between workers on the GPU (`tandem
# bench kv --device=cuda`), the PyTorch peer and the GPU's limits in the same
# run, and a per-kernel profile of one eager decode step. Logs go to $OUT (or
# /tmp/tandem-gpu) and the figures to stdout.
#   benchmarks/gpu/run.sh [bundle dir] [what: all|tests|tandem|kv|peer|profile]...
set -uo pipefail
cd "$(dirname "$0")/../.."
dir="${1:-.gpu}"
shift || true
what="${*:-all}"
out="${OUT:-/tmp/tandem-gpu}"
mkdir -p "$out"
if [[ -f "$dir/bundle.tar.xz" && ! -d "$dir/$(basename "$dir")" ]]; then
  tar -C "$dir" -xJf "$dir/bundle.tar.xz"
fi
dir="$(cd "$dir/$(basename "$dir")" && pwd)"  # absolute: the tests start workers from it
cublas_dir="$(python3 -c 'import os, nvidia.cublas as m; print(os.path.join(os.path.dirname(m.__file__), "lib"))' 2>/dev/null || true)"
export LD_LIBRARY_PATH="$dir/lib:/usr/local/cuda/lib64:${cublas_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TANDEM_BIN_DIR="$dir/bin"  # where the worker tests find the workers
has() { [[ " $what " == *" all "* || " $what " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
if has tests; then
  for t in cuda_ops_test cuda_worker_test; do
    "$dir/bin/$t" > "$out/$t.log" 2>&1
    echo "$t: rc $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ')"
  done
  "$dir/bin/backend_test" --gtest_filter='DeviceTest.*:BackendTest.*' > "$out/backend_test.log" 2>&1
  echo "backend_test (devices): rc $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/backend_test.log" | tr '\n' ' ')"
fi
if has tandem; then
  for m in smollm2-135m llama-3.2-1b; do
    "$dir/bin/tandem" bench step --device=cuda --model=synthetic:$m \
      --cudagraph-mode=FULL_AND_PIECEWISE --batch-sizes=1,8,32 \
      --prefill-tokens=512,2048 --context=256 --iters=50 2>"$out/bench-$m.err" |
      tee "$out/bench-$m.txt"
  done
fi
if has kv; then
  # Goodput against raw TCP, and the TTFT split, with every worker on the GPU.
  "$dir/bin/tandem" bench kv --device=cuda --prompt-tokens=512,2048 --iters=3 \
    2>"$out/bench-kv.err" | tee "$out/bench-kv.txt"
fi
if has peer; then
  python3 benchmarks/gpu/torch_peer.py --model=llama-3.2-1b --limits --batch-sizes=1,8,32 \
    --prefill-tokens=512,2048 --context=256 --iters=50 --json="$out/peer-llama-3.2-1b.json" \
    2>"$out/peer-llama.err" || tail -20 "$out/peer-llama.err"
  python3 benchmarks/gpu/torch_peer.py --model=smollm2-135m --batch-sizes=1 --prefill-tokens= \
    --context=256 --iters=50 --json="$out/peer-smollm2-135m.json" \
    2>"$out/peer-smollm2.err" || tail -20 "$out/peer-smollm2.err"
fi
if has profile; then
  # Every kernel of one eager decode step (batch 1 and 8), timed alone.
  for m in smollm2-135m llama-3.2-1b; do
    ncu --metrics gpu__time_duration.sum --print-summary per-kernel \
      "$dir/bin/tandem" bench step --device=cuda --model=synthetic:$m --cudagraph-mode=NONE \
      --batch-sizes=1,8 --prefill-tokens= --context=256 --iters=1 > "$out/ncu-decode-$m.txt" 2>&1
    echo "ncu $m: rc $?"
  done
fi
