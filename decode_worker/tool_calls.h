// Tool calls in a generated reply, for the OpenAI API's `tool_calls`:
// Hermes / Qwen style `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
// blocks, or a whole reply that is one bare JSON call (Llama 3.x style,
// "parameters" or "arguments").
#ifndef TANDEM_DECODE_WORKER_TOOL_CALLS_H_
#define TANDEM_DECODE_WORKER_TOOL_CALLS_H_

#include <functional>
#include <string>

#include "nlohmann/json.hpp"

namespace tandem {

// The calls in OpenAI's shape ({"id", "type": "function", "function":
// {"name", "arguments": a JSON string}}), ids from `new_id`, and in *rest
// the text outside them. No calls (an empty array, *rest = text) when the
// reply holds none, or a block that is not a JSON call (or nests deeper
// than kMaxJsonDepth).
nlohmann::ordered_json ParseToolCalls(const std::string& text, std::string* rest,
                                      const std::function<std::string()>& new_id);

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_TOOL_CALLS_H_
