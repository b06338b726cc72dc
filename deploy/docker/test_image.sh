#!/usr/bin/env bash
# Builds the CPU image from deploy/docker/Dockerfile as a user does and runs the
# pair from it: prefill and decode containers (host networking, read-only root
# filesystem, the SmolLM2 GGUF mounted read-only) on free loopback ports, wait
# for health, generate through the pair, scrape both /metrics, SIGTERM each and
# expect a clean drain (exit 0). Then the same image through docker-compose:
# deploy/docker-compose.yml with the host-network override, the prefill and
# decode services plus Prometheus (built from Debian's package by
# deploy/prometheus/Dockerfile), an answer through the pair and both workers'
# tandem_cudagraph_replay_ratio in Prometheus's API, stopped with exit 0.
# Any failure exits non-zero.
#
# Where no registry is reachable, the debian:12-slim stand-in is made with
# debootstrap (minbase, from the Debian mirror apt already uses) and
# `docker import`, and kept as tandem-base:bookworm for later runs. dockerd is
# started when none runs, with no bridge and no iptables changes: every
# container uses the host's network, so all traffic stays on loopback.
#   sudo deploy/docker/test_image.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v docker-compose >/dev/null || need+=(docker-compose)
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
DOCKER=/usr/bin/docker
WORK=$(mktemp -d)
CONTAINERS=()
COMPOSE=()
cleanup() {
  for c in "${CONTAINERS[@]}"; do $DOCKER rm -f "$c" >/dev/null 2>&1 || true; done
  [ ${#COMPOSE[@]} -gt 0 ] && "${COMPOSE[@]}" down >/dev/null 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT

if ! $DOCKER info >/dev/null 2>&1; then
  echo "test_image: starting dockerd (no bridge, no iptables)"
  $SUDO dockerd --bridge=none --iptables=false >"$WORK/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do $DOCKER info >/dev/null 2>&1 && break; sleep 1; done
  $DOCKER info >/dev/null || { cat "$WORK/dockerd.log" >&2; exit 1; }
fi

BASE=tandem-base:bookworm
if ! $DOCKER image inspect "$BASE" >/dev/null 2>&1; then
  # The mirror apt already uses (deb822 `URIs:` or one-line `deb` sources;
  # never a commented-out line, which may name a mirror this host cannot reach).
  mirror=$(grep -hE '^[[:space:]]*(URIs:|deb[[:space:]])' /etc/apt/sources.list.d/*.sources \
             /etc/apt/sources.list 2>/dev/null | grep -oE 'https?://[^ ]+/debian/?' | head -1 || true)
  [ -n "$mirror" ] || { echo "test_image: no Debian mirror in apt's sources" >&2; exit 1; }
  echo "test_image: making $BASE with debootstrap"
  start=$(date +%s)
  $SUDO debootstrap --variant=minbase bookworm "$WORK/rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
  $SUDO tar -C "$WORK/rootfs" -c . | $DOCKER import - "$BASE" >/dev/null
  $SUDO rm -rf "$WORK/rootfs"
  echo "test_image: $BASE made in $(( $(date +%s) - start )) s"
fi

start=$(date +%s)
$DOCKER build --network host -f deploy/docker/Dockerfile --build-arg BUILD_IMAGE="$BASE" \
  --build-arg RUNTIME_IMAGE="$BASE" \
  -t tandem:cpu . >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log" >&2; exit 1; }
size=$($DOCKER image inspect tandem:cpu --format '{{.Size}}')
echo "test_image: tandem:cpu built in $(( $(date +%s) - start )) s, $(( size / 1048576 )) MiB"
[ "$($DOCKER image inspect tandem:cpu --format '{{.Config.User}}')" = 10001 ] \
  || { echo "test_image: the image does not run as uid 10001" >&2; exit 1; }

MODEL=$(scripts/fetch_model.sh)
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
P_GRPC=$(free_port); P_METRICS=$(free_port); D_GRPC=$(free_port); D_METRICS=$(free_port)
run() {  # name, then the worker's command line
  local name=$1; shift
  CONTAINERS+=("$name")
  $DOCKER run -d --name "$name" --network host --read-only \
    -v "$MODEL:/models/model.gguf:ro" tandem:cpu "$@" >/dev/null
}
suffix=$$
start=$(date +%s)
run "tandem-prefill-$suffix" prefill_worker --model=/models/model.gguf \
  --grpc-address=127.0.0.1:$P_GRPC --metrics-address=127.0.0.1:$P_METRICS
run "tandem-decode-$suffix" decode_worker --model=/models/model.gguf \
  --grpc-address=127.0.0.1:$D_GRPC --metrics-address=127.0.0.1:$D_METRICS \
  --prefill-address=127.0.0.1:$P_GRPC
in_image() { $DOCKER run --rm --network host tandem:cpu "$@"; }
for addr in 127.0.0.1:$P_GRPC 127.0.0.1:$D_GRPC; do
  for _ in $(seq 1 120); do in_image tandem health --address="$addr" >/dev/null 2>&1 && break; sleep 1; done
  in_image tandem health --address="$addr" >/dev/null \
    || { for c in "${CONTAINERS[@]}"; do $DOCKER logs "$c" >&2; done; exit 1; }
done
echo "test_image: both workers SERVING $(( $(date +%s) - start )) s after docker run"

PROMPT=$(printf '<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n')
answer=$(in_image tandem generate --address=127.0.0.1:$D_GRPC --prompt="$PROMPT" --max-tokens=16 \
  --temperature=0)
echo "test_image: answer: $answer"
echo "$answer" | grep -q "Paris" || { echo "test_image: unexpected answer" >&2; exit 1; }

for port in $P_METRICS $D_METRICS; do
  # The whole page first: `curl | grep -q` fails under pipefail when grep
  # stops reading at its match before curl has written everything.
  page=$(curl -fsS "http://127.0.0.1:$port/metrics")
  grep -q '^tandem_cudagraph_replay_ratio{' <<<"$page" \
    || { echo "test_image: no tandem_cudagraph_replay_ratio on :$port" >&2; exit 1; }
done
echo "test_image: both /metrics scraped"

for c in "tandem-decode-$suffix" "tandem-prefill-$suffix"; do
  $DOCKER stop -t 40 "$c" >/dev/null
  code=$($DOCKER inspect "$c" --format '{{.State.ExitCode}}')
  [ "$code" = 0 ] || { echo "test_image: $c exited $code after SIGTERM" >&2; $DOCKER logs "$c" >&2; exit 1; }
done
echo "test_image: both workers drained on SIGTERM (exit 0)"

# docker-compose: the file users run, with deploy/docker-compose.hostnet.yml.
# Host networking publishes every port (the workers' 50051/50052/8000/9400/9401
# and Prometheus's 9090), and docker-compose v1 refuses `ports` beside it, so
# the merged configuration is run with those lists dropped.
for port in 50051 50052 8000 9400 9401 9090; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "test_image: port $port is in use; docker-compose's services need it" >&2; exit 1
  fi
done
start=$(date +%s)
$DOCKER build --network host -f deploy/prometheus/Dockerfile --build-arg BASE_IMAGE="$BASE" \
  -t tandem-prometheus:local deploy/prometheus >"$WORK/prometheus-build.log" 2>&1 \
  || { tail -20 "$WORK/prometheus-build.log" >&2; exit 1; }
echo "test_image: tandem-prometheus:local built in $(( $(date +%s) - start )) s"
TANDEM_MODEL_DIR=$(dirname "$MODEL") TANDEM_MODEL=/models/$(basename "$MODEL") \
  docker-compose -f deploy/docker-compose.yml -f deploy/docker-compose.hostnet.yml config \
  | /usr/bin/python3 -c '
import sys, yaml
c = yaml.safe_load(sys.stdin)
for service in c["services"].values():
    service.pop("ports", None)
yaml.safe_dump(c, sys.stdout)' >"$WORK/compose.yml"
COMPOSE=(docker-compose -p "tandem-test-$suffix" -f "$WORK/compose.yml")
start=$(date +%s)
"${COMPOSE[@]}" up -d --no-build prefill decode prometheus >"$WORK/compose-up.log" 2>&1 \
  || { cat "$WORK/compose-up.log" >&2; exit 1; }
compose_logs() { "${COMPOSE[@]}" logs --no-color >&2; }
for addr in 127.0.0.1:50052 127.0.0.1:50051; do
  for _ in $(seq 1 120); do in_image tandem health --address="$addr" >/dev/null 2>&1 && break; sleep 1; done
  in_image tandem health --address="$addr" >/dev/null || { compose_logs; exit 1; }
done
echo "test_image: compose: both workers SERVING $(( $(date +%s) - start )) s after up"
answer=$(in_image tandem generate --address=127.0.0.1:50051 --prompt="$PROMPT" --max-tokens=16 \
  --temperature=0)
echo "test_image: compose: answer: $answer"
echo "$answer" | grep -q "Paris" || { echo "test_image: unexpected answer" >&2; exit 1; }
# The README's quick start: the OpenAI API, through the model's chat template.
chat=$(curl -fsS http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0}') \
  || { echo "test_image: compose: /v1/chat/completions failed" >&2; compose_logs; exit 1; }
echo "test_image: compose: /v1/chat/completions: $chat"
echo "$chat" | grep -q "Paris" || { echo "test_image: unexpected chat answer" >&2; exit 1; }
# Prometheus scrapes every 5 s: both roles' replay ratios must reach its API.
roles=""
for _ in $(seq 1 60); do
  roles=$(curl -fsS 'http://127.0.0.1:9090/api/v1/query?query=tandem_cudagraph_replay_ratio' \
            2>/dev/null | /usr/bin/python3 -c '
import json, sys
print(" ".join(sorted({r["metric"]["role"] for r in json.load(sys.stdin)["data"]["result"]})))' \
            2>/dev/null || true)
  [ "$roles" = "decode prefill" ] && break
  sleep 1
done
[ "$roles" = "decode prefill" ] \
  || { echo "test_image: Prometheus shows tandem_cudagraph_replay_ratio for '$roles'" >&2; compose_logs; exit 1; }
echo "test_image: compose: Prometheus shows tandem_cudagraph_replay_ratio for both roles"
"${COMPOSE[@]}" stop -t 40 >/dev/null 2>&1
for service in decode prefill prometheus; do
  code=$($DOCKER inspect "$("${COMPOSE[@]}" ps -q "$service")" --format '{{.State.ExitCode}}')
  [ "$code" = 0 ] || { echo "test_image: compose: $service exited $code on stop" >&2; compose_logs; exit 1; }
done
echo "test_image: compose: every service stopped with exit 0; PASS"
