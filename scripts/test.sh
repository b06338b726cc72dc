#!/usr/bin/env bash
# Builds Tandem and runs the whole test suite under CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -j"${TANDEM_TEST_JOBS:-2}"
