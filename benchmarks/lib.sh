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
