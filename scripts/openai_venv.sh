#!/usr/bin/env bash
# Makes the Python venv the OpenAI API tests run the official `openai` client
# and LangChain's `langchain-openai` in, and the KV events test pyzmq and
# msgspec (vLLM's own event structs are msgspec's; PyPI, Debian lacks
# msgspec), beside the models in the cache
# (default ~/.cache/tandem, or $TANDEM_MODEL_CACHE), and prints its python.
# Idempotent. Debian's own packages (grpcio) stay visible in it.
set -euo pipefail
DIR="${TANDEM_MODEL_CACHE:-$HOME/.cache/tandem}/openai-venv"
VERSION=3.57.0
LANGCHAIN_OPENAI=1.8.1
MSGSPEC=0.19.0
PYZMQ=26.4.0
if [ -x "$DIR/bin/python" ] && "$DIR/bin/python" -c "
import importlib.metadata as m, openai, sys
sys.exit(openai.__version__ != '$VERSION' or m.version('langchain-openai') != '$LANGCHAIN_OPENAI'
         or m.version('msgspec') != '$MSGSPEC' or m.version('pyzmq') != '$PYZMQ')" 2>/dev/null; then
  echo "$DIR/bin/python"
  exit 0
fi
rm -rf "$DIR"
/usr/bin/python3 -m venv --system-site-packages "$DIR"
"$DIR/bin/python" -m pip install -q --disable-pip-version-check "openai==$VERSION" \
  "langchain-openai==$LANGCHAIN_OPENAI" "msgspec==$MSGSPEC" "pyzmq==$PYZMQ" >&2
echo "$DIR/bin/python"
