#!/usr/bin/env bash
# Cross-builds the CPU kernels and their tests for aarch64 (Debian's
# g++-aarch64-linux-gnu and arm64 multiarch packages) and runs them under
# qemu-aarch64-static on an emulated CPU with SVE and SVE2, so Highway's
# NEON, SVE and SVE2 targets are each tested. Installs
# what it needs if missing (as root or through sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  if [ "$(id -u)" -ne 0 ]; then sudo dpkg --add-architecture arm64; else dpkg --add-architecture arm64; fi
  # install_deps.sh runs apt-get update when anything is missing.
fi
bash scripts/install_deps.sh g++-aarch64-linux-gnu qemu-user-static libhwy-dev:arm64 \
  libgtest-dev:arm64 libabsl-dev:arm64
cmake -S tests/cross -B build-arm64 -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$(pwd)/cmake/aarch64-linux-gnu.cmake" >/dev/null
cmake --build build-arm64 -j"${TANDEM_BUILD_JOBS:-$(nproc)}"
# qemu's "max" CPU has SVE and SVE2 (vector length 512 bits unless told).
for test in portable_kernels_test crc32c_test compute_probe_test; do
  QEMU_LD_PREFIX=/usr/aarch64-linux-gnu QEMU_CPU=max qemu-aarch64-static "build-arm64/$test"
done
