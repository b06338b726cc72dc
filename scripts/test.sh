#!/usr/bin/env bash
# Builds Tandem and runs the whole test suite under CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh "$@"
# The real model the end-to-end tests run (cached after the first download).
scripts/fetch_model.sh >/dev/null
# The official OpenAI client the HTTP API test uses (PyPI, cached likewise).
scripts/openai_venv.sh >/dev/null
# Four tests at a time whatever the cores: most of them wait on worker
# processes and sockets (at -j2 two vCPUs were 62% busy; -j4 ran the suite in
# 179 s instead of ~270), and each worker holds ~1 GiB of weights and KV cache,
# so more at once would ask for memory rather than time.
ctest --test-dir build --output-on-failure -j"${TANDEM_TEST_JOBS:-4}"
