#include "decode_worker/tool_calls.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "absl/strings/numbers.h"
#include "common/base/json.h"
#include "decode_worker/reasoning.h"

namespace tandem {

namespace {

using Json = nlohmann::ordered_json;

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// A Qwen3-Coder parameter's text as its schema's type says (vLLM's
// qwen3_coder parser): "null" is null whatever the type; a parameter the
// tool does not declare, or a string type, stays text; integers, numbers
// (an integral one as an integer) and booleans are converted, and text that
// is none stays text; objects, arrays and undeclared types are parsed as
// JSON where they are JSON (vLLM also tries Python literals).
Json XmlParameterValue(const std::string& value, const Json* schema) {
  if (Lower(value) == "null") return nullptr;
  if (schema == nullptr) return value;
  std::string type = "string";
  if (schema->is_object() && schema->contains("type")) {
    const Json& t = (*schema)["type"];
    type = t.is_string() ? Lower(t.get<std::string>()) : "";
  }
  for (std::string_view text : {"string", "str", "text", "varchar", "char", "enum"}) {
    if (type == text) return value;
  }
  for (std::string_view prefix : {"int", "uint", "long", "short", "unsigned"}) {
    if (!StartsWith(type, prefix)) continue;
    int64_t i = 0;
    return absl::SimpleAtoi(value, &i) ? Json(i) : Json(value);
  }
  if (StartsWith(type, "num") || StartsWith(type, "float")) {
    double d = 0;
    if (!absl::SimpleAtod(value, &d) || !std::isfinite(d)) return value;
    if (d == std::trunc(d) && std::fabs(d) < 9.2e18) return Json(static_cast<int64_t>(d));
    return Json(d);
  }
  if (type == "boolean" || type == "bool" || type == "binary") return Lower(value) == "true";
  const Json parsed = ParseJsonBounded(value);
  return parsed.is_discarded() ? Json(value) : parsed;
}

// The calls in `text` written as Qwen3-Coder writes them:
// <function=NAME><parameter=P>\nVALUE\n</parameter>...</function> (a
// function or parameter left open ends where the next begins or the text
// ends). False when a name has no closing '>' (not such a call).
bool AddXmlCalls(std::string_view text, const Json& tool_properties,
                 const std::function<bool(const Json&)>& add) {
  constexpr std::string_view kFunction = "<function=", kFunctionEnd = "</function>";
  constexpr std::string_view kParameter = "<parameter=", kParameterEnd = "</parameter>";
  bool any = false;
  for (size_t at = text.find(kFunction); at != std::string_view::npos;
       at = text.find(kFunction, at)) {
    at += kFunction.size();
    const size_t end = std::min(text.find(kFunctionEnd, at), text.size());
    const std::string_view body = text.substr(at, end - at);
    at = end;
    const size_t name_end = body.find('>');
    if (name_end == std::string_view::npos) return false;
    const std::string name(body.substr(0, name_end));
    const Json* properties = nullptr;
    if (tool_properties.is_object() && tool_properties.contains(name)) {
      properties = &tool_properties[name];
    }
    Json arguments = Json::object();
    std::string_view params = body.substr(name_end + 1);
    for (size_t p = params.find(kParameter); p != std::string_view::npos;) {
      p += kParameter.size();
      const size_t next = params.find(kParameter, p);
      const size_t value_end = std::min({params.find(kParameterEnd, p), next, params.size()});
      const std::string_view param = params.substr(p, value_end - p);
      const size_t key_end = param.find('>');
      if (key_end == std::string_view::npos) return false;
      std::string_view value = param.substr(key_end + 1);
      if (StartsWith(value, "\n")) value.remove_prefix(1);
      if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
      const std::string key(param.substr(0, key_end));
      const Json* schema = properties != nullptr && properties->is_object() && properties->contains(key)
                               ? &(*properties)[key]
                               : nullptr;
      arguments[key] = XmlParameterValue(std::string(value), schema);
      p = next;
    }
    if (!add(Json{{"name", name}, {"arguments", arguments}})) return false;
    any = true;
  }
  return any;
}

}  // namespace

nlohmann::ordered_json ParseToolCalls(const std::string& text, std::string* rest,
                                      const std::function<std::string()>& new_id,
                                      const nlohmann::ordered_json& tool_properties) {
  Json calls = Json::array();
  auto add = [&](const Json& call) {
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) return false;
    Json args = call.contains("arguments") ? call["arguments"]
                : call.contains("parameters") ? call["parameters"] : Json::object();
    calls.push_back({{"id", new_id()},
                     {"type", "function"},
                     {"function", {{"name", call["name"]},
                                   // Invalid UTF-8 (an XML value's raw bytes) as U+FFFD, not
                                   // an exception.
                                   {"arguments", args.is_string()
                                                     ? args.get<std::string>()
                                                     : args.dump(-1, ' ', false, Json::error_handler_t::replace)}}}});
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
      // A JSON call (Hermes, Qwen2.5/3), else Qwen3-Coder's XML one(s).
      if (call.is_discarded() ? !AddXmlCalls(inner, tool_properties, add) : !add(call)) {
        return Json::array();  // not a call after all
      }
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
  // Qwen3-Coder's calls without their <tool_call> (vLLM's fallback): the
  // text before the first is the rest.
  if (const size_t f = text.find("<function="); f != std::string::npos) {
    if (!AddXmlCalls(std::string_view(text).substr(f), tool_properties, add)) return Json::array();
    *rest = text.substr(0, f);
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
// What opens a call: a block, or Qwen3-Coder's function without one.
constexpr std::string_view kCallOpens[] = {"<tool_call>", "<function="};
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
  size_t end = text_.size();
  for (std::string_view open : kCallOpens) {
    const size_t at = text_.find(open, released_);
    if (at != std::string::npos) {
      holding_ = true;
      end = std::min(end, at);
    }
  }
  if (!holding_) {
    for (std::string_view open : kCallOpens) {
      end = std::min(end, text_.size() - PartialTagAtEnd(text_, open));
    }
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
