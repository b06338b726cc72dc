#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang) and runs each for a bounded
# time on its committed seed corpus (a copy: new inputs are not committed).
#   scripts/fuzz.sh          # 60 s per target
#   FUZZ_SECONDS=30 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
CC=clang CXX=clang++ cmake -S fuzz -B build-fuzz -G Ninja >/dev/null
cmake --build build-fuzz -j"${TANDEM_BUILD_JOBS:-$(nproc)}"
for target in gguf tokenizer_json kv_stream flags safetensors jinja; do
  work=$(mktemp -d)
  [ -d "fuzz/corpus/$target" ] && cp -r "fuzz/corpus/$target/." "$work/"
  echo "fuzz: $target for ${SECONDS_PER_TARGET}s"
  status=0
  build-fuzz/${target}_fuzzer -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 \
    -artifact_prefix="build-fuzz/$target-" -print_final_stats=1 "$work" >"build-fuzz/$target.log" 2>&1 \
    || status=$?
  grep -E "^stat::(number_of_executed_units|peak_rss_mb)|^SUMMARY|^==[0-9]+==ERROR" "build-fuzz/$target.log" || true
  rm -rf "$work"
  if [ "$status" -ne 0 ]; then
    echo "fuzz: $target failed (exit $status); log build-fuzz/$target.log, input build-fuzz/$target-*" >&2
    tail -40 "build-fuzz/$target.log" >&2
    exit 1
  fi
done
