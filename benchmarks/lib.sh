# Helpers the benchmark scripts share (sourced, not run): free ports, waiting
# for a worker to be SERVING, and killing what a script started on exit.
# Each script keeps BIN and appends its workers' pids to PIDS.
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_serving() {
  for _ in $(seq 1 300); do
    "$BIN/tandem" health --address="$1" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "$0: $1 never became SERVING" >&2; return 1
}

# start_prefills N LOG_PREFIX: N prefill workers of $MODEL (one thread each)
# on free loopback ports, logs LOG_PREFIX-prefill-I.log; sets PREFILL_TARGETS
# (HOST:PORT,...) and PREFILL_METRICS (their metrics ports).
start_prefills() {
  PREFILL_TARGETS="" PREFILL_METRICS=()
  local i gp mp
  for i in $(seq 1 "$1"); do
    gp=$(free_port); mp=$(free_port)
    "$BIN/prefill_worker" --model="$MODEL" --threads=1 --grpc-address=127.0.0.1:$gp \
      --metrics-address=127.0.0.1:$mp >"$2-prefill-$i.log" 2>&1 &
    PIDS+=($!)
    PREFILL_METRICS+=("$mp")
    PREFILL_TARGETS+="${PREFILL_TARGETS:+,}127.0.0.1:$gp"
  done
}
