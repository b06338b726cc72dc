// Tool calls in a generated reply, for the OpenAI API's `tool_calls`:
// Hermes / Qwen style `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
// blocks, or a whole reply that is one bare JSON call (Llama 3.x style,
// "parameters" or "arguments").
#ifndef TANDEM_DECODE_WORKER_TOOL_CALLS_H_
#define TANDEM_DECODE_WORKER_TOOL_CALLS_H_

#include <functional>
#include <string>
#include <string_view>

#include "nlohmann/json.hpp"

namespace tandem {

// The calls in OpenAI's shape ({"id", "type": "function", "function":
// {"name", "arguments": a JSON string}}), ids from `new_id`, and in *rest
// the text outside them. A block holds a JSON call, or Qwen3-Coder's
// <function=NAME><parameter=P>\nVALUE\n</parameter></function> (also without
// the block, as vLLM's qwen3_coder parser takes it: the rest is the text
// before it), its values typed by `tool_properties` (tool name -> its
// parameters' "properties"). No calls (an empty array, *rest = text) when
// the reply holds none, or a block that is not a call (or nests deeper than
// kMaxJsonDepth).
nlohmann::ordered_json ParseToolCalls(const std::string& text, std::string* rest,
                                      const std::function<std::string()>& new_id,
                                      const nlohmann::ordered_json& tool_properties = nullptr);

// A streamed answer when tools were offered (tool_choice auto): the text
// that can no longer be part of a call goes out as it comes, the rest is
// held until the reply is whole and ParseToolCalls tells. Held: everything
// from the first `<tool_call>` or `<function=` on, a reply whose first non-blank character
// is `{` (a Llama 3.x call is the whole reply), the end of the text that may
// begin either, and blanks that a call right after them would trim.
class ToolCallStream {
 public:
  // Takes the answer's next piece; returns what may go out now.
  std::string Add(std::string_view piece);
  // What Add has let out so far, and what it holds.
  std::string_view released() const { return std::string_view(text_).substr(0, released_); }
  std::string_view held() const { return std::string_view(text_).substr(released_); }

 private:
  std::string text_;  // the answer so far
  size_t released_ = 0;
  bool holding_ = false;  // a call may have begun: nothing more goes out
};

// The streamed form of `calls` (ParseToolCalls' or a forced call's): each
// with its `index`, as OpenAI's and vLLM's chunks carry them.
nlohmann::ordered_json ToolCallDeltas(const nlohmann::ordered_json& calls);

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_TOOL_CALLS_H_
