#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang) and runs each for a bounded
# time on its committed seed corpus (a copy: new inputs are not committed).
# Targets run as many at a time as there are cores (each fuzzer is one
# process on one core).
#   scripts/fuzz.sh          # 60 s per target
#   FUZZ_SECONDS=30 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
JOBS="${TANDEM_BUILD_JOBS:-$(nproc)}"
CC=clang CXX=clang++ cmake -S fuzz -B build-fuzz -G Ninja >/dev/null
cmake --build build-fuzz -j"$JOBS"

# Runs one target; its exit status is the fuzzer's.
run_target() {
  local target=$1 work
  work=$(mktemp -d)
  [ -d "fuzz/corpus/$target" ] && cp -r "fuzz/corpus/$target/." "$work/"
  local dict=()
  [ -f "fuzz/$target.dict" ] && dict=(-dict="fuzz/$target.dict")
  local status=0
  build-fuzz/${target}_fuzzer "${dict[@]}" -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 \
    -artifact_prefix="build-fuzz/$target-" -print_final_stats=1 "$work" >"build-fuzz/$target.log" 2>&1 \
    || status=$?
  rm -rf "$work"
  return "$status"
}

targets=(gguf tokenizer_json kv_stream flags safetensors jinja openai_request json_grammar byte_regex
         ebnf_grammar model_config forwarded_header)
failed=0
for ((i = 0; i < ${#targets[@]}; i += JOBS)); do
  batch=("${targets[@]:i:JOBS}")
  pids=()
  for target in "${batch[@]}"; do
    echo "fuzz: $target for ${SECONDS_PER_TARGET}s"
    run_target "$target" &
    pids+=($!)
  done
  for j in "${!batch[@]}"; do
    target=${batch[$j]}
    status=0
    wait "${pids[$j]}" || status=$?
    echo "fuzz: $target"
    grep -E "^stat::(number_of_executed_units|peak_rss_mb)|^SUMMARY|^==[0-9]+==ERROR" "build-fuzz/$target.log" || true
    if [ "$status" -ne 0 ]; then
      echo "fuzz: $target failed (exit $status); log build-fuzz/$target.log, input build-fuzz/$target-*" >&2
      tail -40 "build-fuzz/$target.log" >&2
      failed=1
    fi
  done
done
exit "$failed"
