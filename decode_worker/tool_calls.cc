#include "decode_worker/tool_calls.h"

#include <algorithm>

#include "common/base/json.h"
#include "decode_worker/reasoning.h"

namespace tandem {

nlohmann::ordered_json ParseToolCalls(const std::string& text, std::string* rest,
                                      const std::function<std::string()>& new_id) {
  using Json = nlohmann::ordered_json;
  Json calls = Json::array();
  auto add = [&](const Json& call) {
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) return false;
    Json args = call.contains("arguments") ? call["arguments"]
                : call.contains("parameters") ? call["parameters"] : Json::object();
    calls.push_back({{"id", new_id()},
                     {"type", "function"},
                     {"function", {{"name", call["name"]},
                                   {"arguments", args.is_string() ? args.get<std::string>() : args.dump()}}}});
    return true;
  };
  *rest = text;
  const std::string open = "<tool_call>", close = "</tool_call>";
  if (text.find(open) != std::string::npos) {
    std::string outside;
    size_t pos = 0;
    while (true) {
      const size_t a = text.find(open, pos);
      if (a == std::string::npos) break;
      const size_t b = text.find(close, a);
      const std::string inner = text.substr(a + open.size(), (b == std::string::npos ? text.size() : b) - a - open.size());
      const Json call = ParseJsonBounded(inner);
      if (call.is_discarded() || !add(call)) return Json::array();  // not a call after all
      outside += text.substr(pos, a - pos);
      if (b == std::string::npos) {
        pos = text.size();
        break;
      }
      pos = b + close.size();
    }
    outside += text.substr(std::min(pos, text.size()));
    *rest = outside;
    return calls;
  }
  const size_t first = text.find_first_not_of(" \t\n\r");
  if (first != std::string::npos && text[first] == '{') {
    const Json call = ParseJsonBounded(text.substr(first));
    if (!call.is_discarded() && (call.contains("parameters") || call.contains("arguments")) && add(call)) {
      rest->clear();
      return calls;
    }
  }
  return Json::array();
}

namespace {
constexpr std::string_view kBlanks = " \t\n\r";
constexpr std::string_view kCallOpen = "<tool_call>";
}  // namespace

std::string ToolCallStream::Add(std::string_view piece) {
  text_.append(piece);
  if (holding_) return "";
  const size_t first = text_.find_first_not_of(kBlanks);
  if (first == std::string::npos) return "";  // blanks alone: not yet told
  if (text_[first] == '{') {
    holding_ = true;
    return "";
  }
  // From where a call opens, or may open with the next piece.
  const size_t from = released_ >= kCallOpen.size() ? released_ - kCallOpen.size() : 0;
  size_t end = text_.find(kCallOpen, from);
  if (end != std::string::npos) {
    holding_ = true;
  } else {
    end = text_.size() - PartialTagAtEnd(text_, kCallOpen);
  }
  while (end > released_ && kBlanks.find(text_[end - 1]) != std::string_view::npos) --end;
  if (end <= released_) return "";
  std::string out = text_.substr(released_, end - released_);
  released_ = end;
  return out;
}

nlohmann::ordered_json ToolCallDeltas(const nlohmann::ordered_json& calls) {
  nlohmann::ordered_json deltas = nlohmann::ordered_json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    nlohmann::ordered_json d = {{"index", i}};
    for (const auto& [key, value] : calls[i].items()) d[key] = value;
    deltas.push_back(std::move(d));
  }
  return deltas;
}

}  // namespace tandem
