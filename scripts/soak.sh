#!/usr/bin/env bash
# Runs the pair at saturation (tests/soak/soak.py) for N minutes (default 10;
# CI uses 1) and prints the report; exit 1 on leaks, stuck blocks or
# unexpected errors. Extra arguments go to soak.py (--concurrency, --json).
#   scripts/soak.sh --minutes=10 --json=docs/soak.json
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 tests/soak/soak.py build/bin . "$@"
