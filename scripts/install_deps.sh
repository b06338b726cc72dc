#!/usr/bin/env bash
# Installs the Debian 12 packages Tandem builds and tests with (or the ones
# given as arguments). Idempotent: packages already present are skipped.
# Run as root (or through sudo).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libabsl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev nlohmann-json3-dev libopenblas-dev libicu-dev libhwy-dev libevent-dev
  libcurl4-openssl-dev  # tandem bench serve's OpenAI backends
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev  # KV events (ZeroMQ, msgpack), as vLLM publishes them
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  prometheus python3-grpcio python3-grpc-tools
  docker-compose yamllint python3-yaml python3-venv curl openssl
  gnuplot-nox  # benchmarks/serve/run.sh draws its plots with it
)
# kubectl (for `kubectl kustomize`) ships with this project's machine image;
# elsewhere Debian's kubernetes-client provides it.
command -v kubectl >/dev/null 2>&1 || PACKAGES+=(kubernetes-client)
# Other scripts name their own packages: scripts/install_deps.sh PACKAGE...
[ $# -gt 0 ] && PACKAGES=("$@")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
