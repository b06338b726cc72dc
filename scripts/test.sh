#!/usr/bin/env bash
# Builds Tandem and runs the whole test suite under CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh "$@"
# The real model the end-to-end tests run (cached after the first download).
scripts/fetch_model.sh >/dev/null
# The official OpenAI client the HTTP API test uses (PyPI, cached likewise).
scripts/openai_venv.sh >/dev/null
ctest --test-dir build --output-on-failure -j"${TANDEM_TEST_JOBS:-2}"
