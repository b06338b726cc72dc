#!/usr/bin/env bash
# Configures and builds Tandem into build/ (executables in build/bin/).
# Extra arguments go to the CMake configure step, e.g. -DTANDEM_ENABLE_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${TANDEM_BUILD_JOBS:-$(nproc)}"
cmake -S . -B build -G Ninja "$@"
cmake --build build -j"$jobs"
