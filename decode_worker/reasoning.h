// Reasoning in a chat reply, for the OpenAI API's `reasoning` field (vLLM's
// --reasoning-parser qwen3 and deepseek_r1): models of these families think
// between <think> and </think> before they answer. The text before </think>
// is reasoning (a <think> in the reply itself is dropped: older Qwen3
// templates leave it to the model, newer ones and DeepSeek-R1's put it in the
// prompt) and the text after it is the answer. A reply that never closes its
// thinking (cut by max_tokens) is all reasoning, unless the request turned
// thinking off (qwen3: chat_template_kwargs.enable_thinking = false), when it
// is all answer.
#ifndef TANDEM_DECODE_WORKER_REASONING_H_
#define TANDEM_DECODE_WORKER_REASONING_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem {

enum class ReasoningParser { kNone, kQwen3, kDeepSeekR1 };

// The length of the longest end of `text` that begins `tag` (a tag that the
// next piece of a streamed reply may complete).
size_t PartialTagAtEnd(std::string_view text, std::string_view tag);

// "" (none), "qwen3" or "deepseek_r1"; INVALID_ARGUMENT names the others.
absl::StatusOr<ReasoningParser> ReasoningParserByName(std::string_view name);

// Splits a reply into reasoning and answer as its text streams in. What
// Add() returns over a reply, then Finish(), is the same however the text is
// cut into pieces: a piece that might end inside a tag is held back until
// the next one tells.
class ReasoningSplitter {
 public:
  struct Parts {
    std::string reasoning, content;
  };

  // `thinking`: false when the request turned thinking off.
  ReasoningSplitter(ReasoningParser parser, bool thinking);

  Parts Add(std::string_view text);
  // What was held back, at the end of the reply.
  Parts Finish();

  static Parts Split(ReasoningParser parser, bool thinking, std::string_view text);

 private:
  bool in_reasoning_;
  bool opened_ = false;  // a <think> was dropped
  std::string pending_;  // text that may be the start of a tag
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_REASONING_H_
