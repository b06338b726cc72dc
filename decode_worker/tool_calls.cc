#include "decode_worker/tool_calls.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

constexpr std::string_view kBlanks = " \t\n\r";
constexpr std::string_view kFunction = "<function=", kFunctionEnd = "</function>";
constexpr std::string_view kParameter = "<parameter=", kParameterEnd = "</parameter>";
constexpr std::string_view kBlock = "<tool_call>", kBlockEnd = "</tool_call>";
// Mistral's special tokens (kept in the text when tools are offered): the
// calls open with the first; from tokenizer v11 on each call is
// NAME[ARGS]{...} (v13 may put [CALL_ID]ID before [ARGS]).
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]", kMistralArgs = "[ARGS]",
                           kMistralCallId = "[CALL_ID]";

std::string DumpJson(const Json& value) {
  // Invalid UTF-8 (an XML value's raw bytes) as U+FFFD, not an exception.
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// A Qwen3-Coder call's arguments as they grow: `{"key":value` then
// `,"key":value` for each parameter, and CloseXmlArguments at the end. Built
// as text, not as an object, so that the streamed arguments and the whole
// call's are the same bytes.
void AppendXmlArgument(std::string* args, const std::string& key, const Json& value) {
  absl::StrAppend(args, args->empty() ? "{" : ",", DumpJson(Json(key)), ":", DumpJson(value));
}
std::string CloseXmlArguments(const std::string& args) { return args.empty() ? "{}" : args + "}"; }

struct XmlParameter {
  std::string key;
  Json value;
  size_t next;  // where the text after it begins: past its </parameter>, or at the tag that ended it
};

// The parameter whose key begins at body[p] (just past "<parameter="): its
// value ends at its </parameter>, the next <parameter=, a </function>, or
// (`whole`) the body's end, less the newline after the key's '>' and the one
// before the end. None when its key has no '>' or (not whole) its end has
// not come yet.
std::optional<XmlParameter> ReadXmlParameter(std::string_view body, size_t p, bool whole,
                                             const Json* properties) {
  const size_t key_end = body.find('>', p);
  if (key_end == std::string_view::npos) return std::nullopt;
  const size_t closed = body.find(kParameterEnd, key_end);
  size_t value_end = std::min({closed, body.find(kParameter, key_end), body.find(kFunctionEnd, key_end)});
  if (value_end == std::string_view::npos) {
    if (!whole) return std::nullopt;
    value_end = body.size();
  }
  std::string_view value = body.substr(key_end + 1, value_end - key_end - 1);
  if (StartsWith(value, "\n")) value.remove_prefix(1);
  if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
  XmlParameter out;
  out.key = std::string(body.substr(p, key_end - p));
  const Json* schema = properties != nullptr && properties->is_object() && properties->contains(out.key)
                           ? &(*properties)[out.key]
                           : nullptr;
  out.value = XmlParameterValue(std::string(value), schema);
  out.next = value_end == closed ? closed + kParameterEnd.size() : value_end;
  return out;
}

// The parameters' properties of tool `name` in `tool_properties`, if given.
const Json* PropertiesOf(const Json& tool_properties, const std::string& name) {
  return tool_properties.is_object() && tool_properties.contains(name) ? &tool_properties[name] : nullptr;
}

// The calls in `text` written as Qwen3-Coder writes them:
// <function=NAME><parameter=P>\nVALUE\n</parameter>...</function> (a
// function or parameter left open ends where the next begins or the text
// ends). False when a name or key has no closing '>' (not such a call).
bool AddXmlCalls(std::string_view text, const Json& tool_properties,
                 const std::function<bool(const Json&)>& add) {
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
    const Json* properties = PropertiesOf(tool_properties, name);
    std::string arguments;
    const std::string_view params = body.substr(name_end + 1);
    for (size_t p = params.find(kParameter); p != std::string_view::npos; p = params.find(kParameter, p)) {
      const std::optional<XmlParameter> param =
          ReadXmlParameter(params, p + kParameter.size(), /*whole=*/true, properties);
      if (!param.has_value()) return false;
      AppendXmlArgument(&arguments, param->key, param->value);
      p = param->next;
    }
    if (!add(Json{{"name", name}, {"arguments", CloseXmlArguments(arguments)}})) return false;
    any = true;
  }
  return any;
}

// The JSON call that `text` begins with (after blanks) passed to `add`, its
// arguments (an object) as JsonCallScanner reads them. Returns the offset
// past it, or npos when it is not one call object.
size_t AddJsonCall(std::string_view text, const std::function<bool(const Json&)>& add) {
  JsonCallScanner scanner;
  scanner.Scan(text);
  if (!scanner.done()) return std::string_view::npos;
  Json call = ParseJsonBounded(std::string(text.substr(0, scanner.end())));
  if (call.is_discarded() || !call.is_object()) return std::string_view::npos;
  if (scanner.has_arguments()) call["arguments"] = scanner.arguments();
  return add(call) ? scanner.end() : std::string_view::npos;
}

// Adds `call` ({"name", "arguments" or "parameters"}) to `calls` in
// OpenAI's shape; false when it has no name.
bool AddCall(const Json& call, const std::function<std::string()>& new_id, Json* calls) {
  if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) return false;
  Json args = call.contains("arguments") ? call["arguments"]
              : call.contains("parameters") ? call["parameters"] : Json::object();
  calls->push_back({{"id", new_id()},
                    {"type", "function"},
                    {"function", {{"name", call["name"]},
                                  {"arguments", args.is_string() ? args.get<std::string>() : DumpJson(args)}}}});
  return true;
}

// The calls of `list`, a JSON list of them (checked by the caller), passed
// to `add` in order until one is not a call; false then.
bool AddListCalls(std::string_view list, const std::function<bool(const Json&)>& add) {
  for (size_t at = list.find('[') + 1; at < list.size(); ++at) {  // at: past '[' or ','
    const size_t length = AddJsonCall(list.substr(at), add);
    if (length == std::string_view::npos) return list.find_first_not_of(kBlanks, at) == list.rfind(']');
    at = list.find_first_of(",]", at + length);
    if (at == std::string_view::npos || list[at] == ']') break;
  }
  return true;
}

// A Mistral v11 call, `part` the text after its [TOOL_CALLS]: its name (to
// [ARGS], or to the arguments' '{' as vLLM also takes it; a [CALL_ID] and
// what follows it left out) and its arguments from their '{', as far as
// they have come. None without a '{' or a name.
struct MistralCall {
  std::string name;
  size_t args_begin = 0;  // the arguments' '{' in `part`
  JsonCompactor arguments;
};
std::optional<MistralCall> ReadMistralCall(std::string_view part) {
  const size_t brace = part.find('{');
  if (brace == std::string_view::npos) return std::nullopt;
  std::string_view name = part.substr(0, std::min(brace, part.find(kMistralArgs)));
  name = name.substr(0, name.find(kMistralCallId));
  const size_t b = name.find_first_not_of(kBlanks);
  if (b == std::string_view::npos) return std::nullopt;
  name = name.substr(b, name.find_last_not_of(kBlanks) + 1 - b);
  MistralCall call;
  call.name = std::string(name);
  call.args_begin = brace;
  call.arguments.Scan(part.substr(brace));
  return call;
}

}  // namespace

void JsonCompactor::Scan(std::string_view text) {
  for (; pos_ < text.size() && !done_ && !failed_; ++pos_) {
    const char ch = text[pos_];
    if (in_string_) {
      text_ += ch;
      if (escape_) {
        escape_ = false;
      } else if (ch == '\\') {
        escape_ = true;
      } else if (ch == '"') {
        in_string_ = false;
      }
      continue;
    }
    if (kBlanks.find(ch) != std::string_view::npos) continue;
    if (depth_ == 0 && ch != '{') {
      failed_ = true;
      return;
    }
    text_ += ch;
    if (ch == '"') {
      in_string_ = true;
    } else if (ch == '{' || ch == '[') {
      if (++depth_ > kMaxJsonDepth) failed_ = true;
    } else if ((ch == '}' || ch == ']') && --depth_ == 0) {
      done_ = true;
    }
  }
}

nlohmann::ordered_json ParseToolCallList(const std::string& text, const std::function<std::string()>& new_id) {
  Json calls = Json::array();
  if (!ParseJsonBounded(text).is_array()) return calls;
  AddListCalls(text, [&](const Json& call) { return call.contains("parameters") && AddCall(call, new_id, &calls); });
  return calls;
}

nlohmann::ordered_json ParseToolCalls(const std::string& text, std::string* rest,
                                      const std::function<std::string()>& new_id,
                                      const nlohmann::ordered_json& tool_properties) {
  Json calls = Json::array();
  auto add = [&](const Json& call) { return AddCall(call, new_id, &calls); };
  *rest = text;
  auto add_llama = [&](const Json& call) {
    return (call.contains("parameters") || call.contains("arguments")) && add(call);
  };
  // Mistral: after each [TOOL_CALLS], a JSON list of calls (tokenizers before
  // v11) or NAME[ARGS]{...} (v11 on), as vLLM's mistral parser reads them;
  // the text before the first is the rest, and so is what follows a call's
  // arguments or a part that is no call.
  if (const size_t first = text.find(kMistralCalls); first != std::string::npos) {
    const std::string_view reply(text);
    std::string outside(reply.substr(0, first));
    for (size_t at = first; at != std::string::npos;) {
      at += kMistralCalls.size();
      const size_t next = reply.find(kMistralCalls, at);
      const std::string_view part = reply.substr(at, (next == std::string::npos ? reply.size() : next) - at);
      at = next;
      const size_t b = part.find_first_not_of(kBlanks);
      if (b != std::string_view::npos && part[b] == '[') {
        const std::string list(part.substr(b));
        if (!ParseJsonBounded(list).is_array() || !AddListCalls(list, add_llama)) outside += part;
        continue;
      }
      const std::optional<MistralCall> call = ReadMistralCall(part);
      if (!call.has_value()) {
        outside += part;
        continue;
      }
      add(Json{{"name", call->name}, {"arguments", call->arguments.text()}});
      if (call->arguments.done()) outside += part.substr(call->args_begin + call->arguments.end());
    }
    if (calls.empty()) return Json::array();
    *rest = outside;
    return calls;
  }
  if (text.find(kBlock) != std::string::npos) {
    std::string outside;
    size_t pos = 0;
    while (true) {
      const size_t a = text.find(kBlock, pos);
      if (a == std::string::npos) break;
      const size_t b = text.find(kBlockEnd, a);
      const std::string_view inner =
          std::string_view(text).substr(a + kBlock.size(), (b == std::string::npos ? text.size() : b) - a - kBlock.size());
      // A JSON call (Hermes, Qwen2.5/3) and nothing else, else Qwen3-Coder's XML one(s).
      const bool json = !ParseJsonBounded(std::string(inner)).is_discarded();
      if (json ? AddJsonCall(inner, add) == std::string_view::npos : !AddXmlCalls(inner, tool_properties, add)) {
        return Json::array();  // not a call after all
      }
      outside += text.substr(pos, a - pos);
      if (b == std::string::npos) {
        pos = text.size();
        break;
      }
      pos = b + kBlockEnd.size();
    }
    outside += text.substr(std::min(pos, text.size()));
    *rest = outside;
    return calls;
  }
  // Qwen3-Coder's calls without their <tool_call> (vLLM's fallback): the
  // text before the first is the rest.
  if (const size_t f = text.find(kFunction); f != std::string::npos) {
    if (!AddXmlCalls(std::string_view(text).substr(f), tool_properties, add)) return Json::array();
    *rest = text.substr(0, f);
    return calls;
  }
  const std::string_view reply(text);
  size_t at = reply.find_first_not_of(kBlanks);
  if (at == std::string_view::npos) return Json::array();
  // Mistral: the reply is a JSON list of calls (after its [TOOL_CALLS]
  // token, which skip_special_tokens leaves out of the text).
  if (reply[at] == '[') {
    if (!ParseJsonBounded(text).is_array() || !AddListCalls(reply, add_llama) || calls.empty()) {
      return Json::array();
    }
    rest->clear();
    return calls;
  }
  // Llama 3.x: the reply is one or more bare JSON calls, joined by ';' (as
  // vLLM's llama3_json parser splits them).
  if (reply[at] != '{') return Json::array();
  while (at < reply.size()) {
    const size_t length = AddJsonCall(reply.substr(at), add_llama);
    if (length == std::string_view::npos) return Json::array();
    at = reply.find_first_not_of(kBlanks, at + length);
    if (at != std::string_view::npos && reply[at] == ';') at = reply.find_first_not_of(kBlanks, at + 1);
    if (at == std::string_view::npos) break;
    if (reply[at] != '{') return Json::array();
  }
  rest->clear();
  return calls;
}

void JsonCallScanner::Scan(std::string_view text) {
  for (; pos_ < text.size() && !failed_ && !done_; ++pos_) {
    if (in_args_) {  // the arguments object, from its '{'
      args_.Scan(text.substr(args_begin_));
      pos_ = args_begin_ + args_.end();
      if (args_.failed()) return Fail();
      if (!args_.done() || pos_ >= text.size()) {
        if (args_.done()) EndArguments();
        return;
      }
      EndArguments();
    }
    const char ch = text[pos_];
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (ch == '\\') {
        escape_ = true;
      } else if (ch == '"') {
        in_string_ = false;
        if (depth_ > 1) continue;
        // A depth-1 key or string value is whole.
        const Json s = ParseJsonBounded(std::string(text.substr(token_begin_, pos_ + 1 - token_begin_)));
        if (!s.is_string()) return Fail();
        if (expect_ == Expect::kKey) {
          key_ = s.get<std::string>();
          expect_ = Expect::kColon;
        } else {
          if (key_ == "name") name_ = s.get<std::string>();
          expect_ = Expect::kAfterValue;
        }
      }
      continue;
    }
    if (kBlanks.find(ch) != std::string_view::npos) {
      if (expect_ == Expect::kPrimitive) expect_ = Expect::kAfterValue;
      continue;
    }
    if (depth_ > 1) {  // inside a container value
      if (ch == '"') {
        in_string_ = true;
      } else if (ch == '{' || ch == '[') {
        if (++depth_ > kMaxJsonDepth) return Fail();
      } else if ((ch == '}' || ch == ']') && --depth_ == 1) {
        expect_ = Expect::kAfterValue;
      }
      continue;
    }
    switch (expect_) {
      case Expect::kObject:
        if (ch != '{') return Fail();
        depth_ = 1;
        expect_ = Expect::kKey;
        break;
      case Expect::kKey:
        if (ch == '}') {
          depth_ = 0;
          done_ = true;
        } else if (ch == '"') {
          in_string_ = true;
          token_begin_ = pos_;
        } else {
          return Fail();
        }
        break;
      case Expect::kColon:
        if (ch != ':') return Fail();
        expect_ = Expect::kValue;
        break;
      case Expect::kValue:
        if (ch == '"') {
          in_string_ = true;
          token_begin_ = pos_;
        } else if (ch == '{' || ch == '[') {
          depth_ = 2;
          if (ch == '{' && !args_begun_ && (key_ == "arguments" || key_ == "parameters")) {
            in_args_ = args_begun_ = true;
            args_begin_ = pos_;
            args_ = JsonCompactor();
            --pos_;  // the loop's next turn reads the object from its '{'
          }
        } else if (ch == ',' || ch == '}') {
          return Fail();  // no value
        } else {
          expect_ = Expect::kPrimitive;
        }
        break;
      case Expect::kPrimitive:  // a number, true, false or null: until what follows it
      case Expect::kAfterValue:
        if (ch == ',') {
          expect_ = Expect::kKey;
        } else if (ch == '}') {
          depth_ = 0;
          done_ = true;
        } else if (expect_ == Expect::kAfterValue) {
          return Fail();
        }
        break;
    }
  }
}

void JsonCallScanner::EndArguments() {
  in_args_ = false;
  depth_ = 1;
  expect_ = Expect::kAfterValue;
}

std::vector<ToolCallPiece> WholeCallPieces(const nlohmann::ordered_json& calls, size_t first_index) {
  std::vector<ToolCallPiece> pieces;
  for (size_t i = first_index; i < calls.size(); ++i) {
    const Json& f = calls[i]["function"];
    pieces.push_back({i, calls[i]["id"].get<std::string>(), f["name"].get<std::string>(),
                      f["arguments"].get<std::string>()});
  }
  return pieces;
}

nlohmann::ordered_json ToolCallPiecesJson(const std::vector<ToolCallPiece>& pieces) {
  Json out = Json::array();
  for (const ToolCallPiece& p : pieces) {
    Json d = {{"index", p.index}};
    if (!p.id.empty()) {
      d["id"] = p.id;
      d["type"] = "function";
      d["function"] = {{"name", p.name}, {"arguments", p.arguments}};
    } else {
      d["function"] = {{"arguments", p.arguments}};
    }
    out.push_back(std::move(d));
  }
  return out;
}

namespace {
// What opens a call: a block, Qwen3-Coder's function without one, or
// Mistral's token.
constexpr std::string_view kCallOpens[] = {kBlock, kFunction, kMistralCalls};
}  // namespace

ToolCallStream::Out ToolCallStream::Add(std::string_view piece) {
  text_.append(piece);
  Out out;
  if (expect_ == Expect::kText) {
    const size_t first = text_.find_first_not_of(kBlanks);
    if (first == std::string::npos) return out;  // blanks alone: not yet told
    // From where a call opens, or may open with the next piece.
    size_t end = text_.size();
    if (text_[first] == '{' || list_) {  // a Llama 3.x reply of calls, or a list of them
      expect_ = Expect::kCall;
      end = first;
    } else if (text_[first] == '[') {  // a Mistral list of calls begins "[{"
      const size_t second = text_.find_first_not_of(kBlanks, first + 1);
      if (second == std::string::npos || text_[second] == '{') end = first;
      if (second != std::string::npos && text_[second] == '{') {
        expect_ = Expect::kCall;
        list_ = true;
      }
    }
    for (std::string_view open : kCallOpens) {
      const size_t at = text_.find(open, released_);
      if (at != std::string::npos) {
        expect_ = Expect::kCall;
        end = std::min(end, at);
      }
    }
    if (expect_ == Expect::kText) {
      for (std::string_view open : kCallOpens) {
        end = std::min(end, text_.size() - PartialTagAtEnd(text_, open));
      }
    }
    while (end > released_ && kBlanks.find(text_[end - 1]) != std::string_view::npos) --end;
    if (end > released_) {
      out.content = text_.substr(released_, end - released_);
      released_ = end;
    }
    scan_ = released_;
  }
  ReadCalls(&out);
  return out;
}

void ToolCallStream::Begin(Out* out, const std::string& name) {
  begun_.push_back({new_id_(), name, ""});
  out->calls.push_back({begun_.size() - 1, begun_.back().id, name, ""});
  call_open_ = true;
}

void ToolCallStream::Emit(Out* out, const std::string& arguments) {
  Begun& call = begun_.back();
  if (arguments.size() <= call.arguments.size()) return;
  const std::string more = arguments.substr(call.arguments.size());
  call.arguments += more;
  const size_t index = begun_.size() - 1;
  if (out->calls.empty() || out->calls.back().index != index) out->calls.push_back({index, "", "", ""});
  out->calls.back().arguments += more;
}

void ToolCallStream::ReadCalls(Out* out) {
  const std::string_view text(text_);
  while (true) {
    switch (expect_) {
      case Expect::kCall: {  // between calls
        scan_ = std::min(text.find_first_not_of(kBlanks, scan_), text.size());
        const std::string_view rest = text.substr(scan_);
        if (rest.empty()) return;
        if (StartsWith(rest, kMistralCalls)) {
          // A list of calls follows (before v11), or NAME[ARGS]{...}.
          const size_t b = text.find_first_not_of(kBlanks, scan_ + kMistralCalls.size());
          if (b == std::string_view::npos) return;  // the next piece tells
          scan_ += kMistralCalls.size();
          if (text[b] == '[') {
            list_ = true;
          } else {
            expect_ = Expect::kMistralName;
          }
        } else if (PartialTagAtEnd(rest, kMistralCalls) == rest.size()) {
          return;  // the next piece tells
        } else if (StartsWith(rest, kBlock) || StartsWith(rest, kBlockEnd)) {
          scan_ += StartsWith(rest, kBlock) ? kBlock.size() : kBlockEnd.size();
        } else if (rest[0] == ';' || (list_ && (rest[0] == '[' || rest[0] == ',' || rest[0] == ']'))) {
          ++scan_;  // between Llama 3.x calls, or a list's
        } else if (StartsWith(rest, kFunction)) {
          expect_ = Expect::kXml;
          xml_named_ = false;
          xml_args_.clear();
        } else if (rest[0] == '{') {
          expect_ = Expect::kJson;
          json_ = JsonCallScanner();
          call_begin_ = scan_;
        } else {
          for (std::string_view tag : {kBlock, kBlockEnd, kFunction}) {
            if (PartialTagAtEnd(rest, tag) == rest.size()) return;  // the next piece tells
          }
          expect_ = Expect::kNone;  // text after the calls: held to the end
        }
        break;
      }
      case Expect::kJson:
        json_.Scan(text.substr(call_begin_));
        if (json_.failed()) {
          expect_ = Expect::kNone;
          return;
        }
        if (!call_open_ && json_.name().has_value() && json_.has_arguments()) Begin(out, *json_.name());
        if (call_open_) Emit(out, json_.arguments());
        if (!json_.done()) return;
        if (!call_open_) {  // no call whose arguments could stream: it comes at the end
          expect_ = Expect::kNone;
          return;
        }
        call_open_ = false;
        scan_ = call_begin_ + json_.end();
        expect_ = Expect::kCall;
        break;
      case Expect::kXml:
        if (!ReadXml(out)) return;
        expect_ = Expect::kCall;
        break;
      case Expect::kMistralName: {  // scan_ is past its [TOOL_CALLS]
        const size_t next = text.find(kMistralCalls, scan_);
        const std::string_view part = text.substr(scan_, next == std::string_view::npos ? text.npos : next - scan_);
        const std::optional<MistralCall> call = ReadMistralCall(part);
        if (!call.has_value()) {
          if (next != std::string_view::npos) {  // a part that is no call (text): on to the next
            scan_ = next;
            expect_ = Expect::kCall;
            break;
          }
          if (part.find('{') == std::string_view::npos) return;  // the name goes on
          expect_ = Expect::kNone;  // no name: text, held to the end
          return;
        }
        Begin(out, call->name);
        call_begin_ = scan_ + call->args_begin;
        mistral_args_ = JsonCompactor();
        expect_ = Expect::kMistralArgs;
        break;
      }
      case Expect::kMistralArgs: {
        // The arguments up to the next [TOOL_CALLS] (the whole parse's part),
        // looked for only where a new piece could have completed one: from
        // what was read less a token's length, not from the arguments'
        // start (a long argument would be searched again at every piece).
        const size_t read = call_begin_ + mistral_args_.end();
        const size_t next =
            text.find(kMistralCalls, std::max(call_begin_, read - std::min(read, kMistralCalls.size() - 1)));
        const std::string_view args =
            text.substr(call_begin_, next == std::string_view::npos ? text.npos : next - call_begin_);
        mistral_args_.Scan(args);
        Emit(out, mistral_args_.text());
        if (!mistral_args_.done() && !mistral_args_.failed() && next == std::string_view::npos) return;
        call_open_ = false;
        if (mistral_args_.done()) {
          scan_ = call_begin_ + mistral_args_.end();
        } else if (next != std::string_view::npos) {
          scan_ = next;  // cut short by the next call: the whole parse keeps what came
        } else {
          expect_ = Expect::kNone;  // malformed: the rest is held to the end
          return;
        }
        expect_ = Expect::kCall;
        break;
      }
      case Expect::kText:
      case Expect::kNone:
        return;
    }
  }
}

bool ToolCallStream::ReadXml(Out* out) {
  const std::string_view text(text_);
  if (!xml_named_) {  // scan_ is at its <function=
    const size_t name_end = text.find('>', scan_ + kFunction.size());
    if (name_end == std::string_view::npos) return false;
    xml_name_ = std::string(text.substr(scan_ + kFunction.size(), name_end - scan_ - kFunction.size()));
    xml_named_ = true;
    scan_ = name_end + 1;
    Begin(out, xml_name_);
  }
  const Json* properties = PropertiesOf(tool_properties_, xml_name_);
  while (true) {
    scan_ = std::min(text.find('<', scan_), text.size());
    const std::string_view rest = text.substr(scan_);
    if (StartsWith(rest, kFunctionEnd)) {
      Emit(out, CloseXmlArguments(xml_args_));
      call_open_ = false;
      scan_ += kFunctionEnd.size();
      return true;
    }
    if (StartsWith(rest, kParameter)) {
      const std::optional<XmlParameter> param =
          ReadXmlParameter(text, scan_ + kParameter.size(), /*whole=*/false, properties);
      if (!param.has_value()) return false;
      AppendXmlArgument(&xml_args_, param->key, param->value);
      Emit(out, xml_args_);
      scan_ = param->next;
      continue;
    }
    if (PartialTagAtEnd(rest, kFunctionEnd) == rest.size() || PartialTagAtEnd(rest, kParameter) == rest.size()) {
      return false;  // the end, or the next piece tells
    }
    ++scan_;  // text between parameters, as the whole reply's parse skips it
  }
}

std::vector<ToolCallPiece> ToolCallStream::Finish(const nlohmann::ordered_json& calls) const {
  std::vector<ToolCallPiece> pieces;
  size_t next_index = begun_.size();
  for (size_t i = 0; i < calls.size(); ++i) {
    const Json& f = calls[i]["function"];
    const std::string name = f["name"].get<std::string>(), arguments = f["arguments"].get<std::string>();
    if (i < begun_.size() && begun_[i].name == name &&
        arguments.compare(0, begun_[i].arguments.size(), begun_[i].arguments) == 0) {
      if (arguments.size() > begun_[i].arguments.size()) {
        pieces.push_back({i, "", "", arguments.substr(begun_[i].arguments.size())});
      }
      continue;
    }
    // Not the call that went out under this index: whole, under a new one.
    pieces.push_back({next_index++, calls[i]["id"].get<std::string>(), name, arguments});
  }
  return pieces;
}

}  // namespace tandem
