#include "decode_worker/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/algorithm/container.h"
#include "common/serving/request_id.h"
#include "absl/strings/str_join.h"
#include "common/engine/sampling.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

// The typed fields of a request body; each error names the field.
class Fields {
 public:
  explicit Fields(const Json& body) : body_(body) {}

  bool Has(const char* name) const { return body_.contains(name) && !body_[name].is_null(); }

  std::optional<HttpError> Int(const char* name, int64_t lo, int64_t hi, std::optional<int64_t>* out) const {
    if (!Has(name)) return std::nullopt;
    const Json& v = body_[name];
    if (!v.is_number_integer()) {
      return Bad(name, absl::StrCat(name, " must be an integer, got ", v.dump()));
    }
    // An unsigned value past int64 is out of every range here.
    const bool huge = v.is_number_unsigned() &&
                      v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    const int64_t i = huge ? 0 : v.get<int64_t>();
    if (huge || i < lo || i > hi) {
      return Bad(name, absl::StrCat(name, " must be in [", lo, ", ", hi, "], got ", v.dump()));
    }
    *out = i;
    return std::nullopt;
  }
  std::optional<HttpError> Number(const char* name, double lo, double hi, std::optional<double>* out) const {
    if (!Has(name)) return std::nullopt;
    const Json& v = body_[name];
    if (!v.is_number()) return Bad(name, absl::StrCat(name, " must be a number, got ", v.dump()));
    const double d = v.get<double>();
    if (!(d >= lo && d <= hi)) {
      return Bad(name, absl::StrCat(name, " must be in [", lo, ", ", hi, "], got ", v.dump()));
    }
    *out = d;
    return std::nullopt;
  }
  std::optional<HttpError> Bool(const char* name, bool* out) const {
    if (!Has(name)) return std::nullopt;
    if (!body_[name].is_boolean()) {
      return Bad(name, absl::StrCat(name, " must be true or false, got ", body_[name].dump()));
    }
    *out = body_[name].get<bool>();
    return std::nullopt;
  }
  // A field this server does not implement: accepted at its neutral value.
  std::optional<HttpError> Neutral(const char* name, const Json& neutral) const {
    if (!Has(name) || body_[name] == neutral) return std::nullopt;
    if (neutral.is_number() && body_[name].is_number() &&
        body_[name].get<double>() == neutral.get<double>()) {
      return std::nullopt;
    }
    return Bad(name, absl::StrCat(name, "=", body_[name].dump(), " is not supported (only ",
                                  neutral.dump(), ")"));
  }
  // A list of token ids, each in [0, 2^31).
  std::optional<HttpError> TokenIds(const char* name, std::vector<int32_t>* out) const {
    if (!Has(name)) return std::nullopt;
    return TokenIdList(body_[name], name, name, out);
  }
  // `label` names the list in messages (a field, or "prompt[2]").
  static std::optional<HttpError> TokenIdList(const Json& list, const char* name, const std::string& label,
                                              std::vector<int32_t>* out) {
    if (!list.is_array()) return Bad(name, absl::StrCat(label, " must be a list of token ids"));
    for (size_t i = 0; i < list.size(); ++i) {
      const Json& t = list[i];
      const bool ok = t.is_number_unsigned()
                          ? t.get<uint64_t>() <= std::numeric_limits<int32_t>::max()
                          : t.is_number_integer() && t.get<int64_t>() >= 0 &&
                                t.get<int64_t>() <= std::numeric_limits<int32_t>::max();
      if (!ok) {
        return Bad(name, absl::StrCat(label, "[", i, "] must be a token id (an integer in [0, ",
                                      std::numeric_limits<int32_t>::max(), "]), got ", t.dump()));
      }
      out->push_back(t.get<int32_t>());
    }
    return std::nullopt;
  }
  static HttpError Bad(const char* name, std::string message) { return {400, std::move(message), name}; }

 private:
  const Json& body_;
};

// Structured outputs, in any of the forms clients send: OpenAI's
// response_format (json_object, json_schema), vLLM's structured_outputs
// (json, json_object, choice, regex, grammar) and its older guided_json /
// guided_choice / guided_regex / guided_grammar. At most one; the schema,
// regex or grammar is compiled where the request runs (FromProto).
std::optional<HttpError> ParseStructuredOutput(const Json& body, v1::SamplingParams* s) {
  Fields f(body);
  std::vector<const char*> given;
  Json schema;                   // a JSON schema, or null
  const Json* choices = nullptr;  // a list of strings, or null
  const Json* regex = nullptr;    // a string, or null
  const Json* grammar = nullptr;  // a string, or null
  if (f.Has("response_format")) {
    const Json& format = body["response_format"];
    if (!format.is_object() || !format.contains("type") || !format["type"].is_string()) {
      return Fields::Bad("response_format", absl::StrCat("response_format must be an object with "
                                                         "a type, got ", format.dump()));
    }
    const std::string type = format["type"].get<std::string>();
    if (type == "json_object") {
      schema = {{"type", "object"}};
      given.push_back("response_format");
    } else if (type == "json_schema") {
      if (!format.contains("json_schema") || !format["json_schema"].is_object() ||
          !format["json_schema"].contains("schema") || !format["json_schema"]["schema"].is_object()) {
        return Fields::Bad("response_format", "response_format.json_schema.schema must be an object "
                                              "(a JSON schema)");
      }
      schema = format["json_schema"]["schema"];
      given.push_back("response_format");
    } else if (type != "text") {
      return Fields::Bad("response_format", absl::StrCat("response_format type ", format["type"].dump(),
                                                         " is not supported (text, json_object or "
                                                         "json_schema)"));
    }
  }
  auto json_or_text = [](const Json& v) -> Json {
    return v.is_string() ? ParseJsonBounded(v.get<std::string>()) : v;
  };
  if (f.Has("structured_outputs")) {
    const Json& so = body["structured_outputs"];
    if (!so.is_object()) return Fields::Bad("structured_outputs", "structured_outputs must be an object");
    for (const auto& [key, value] : so.items()) {
      if (value.is_null() || (value.is_boolean() && !value.get<bool>())) continue;
      if (key == "json") {
        schema = json_or_text(value);
      } else if (key == "json_object") {
        schema = {{"type", "object"}};
      } else if (key == "choice") {
        choices = &value;
      } else if (key == "regex") {
        regex = &value;
      } else if (key == "grammar") {
        grammar = &value;
      } else {
        return Fields::Bad("structured_outputs", absl::StrCat("structured_outputs.", key,
                                                              " is not supported (json, json_object, "
                                                              "choice, regex or grammar)"));
      }
      given.push_back("structured_outputs");
    }
  }
  if (f.Has("guided_json")) {
    schema = json_or_text(body["guided_json"]);
    given.push_back("guided_json");
  }
  if (f.Has("guided_choice")) {
    choices = &body["guided_choice"];
    given.push_back("guided_choice");
  }
  if (f.Has("guided_regex")) {
    regex = &body["guided_regex"];
    given.push_back("guided_regex");
  }
  if (f.Has("guided_grammar")) {
    grammar = &body["guided_grammar"];
    given.push_back("guided_grammar");
  }
  if (given.empty()) return std::nullopt;
  if (given.size() > 1) {
    return Fields::Bad(given[1], absl::StrCat("give one structured output, not ", given.size(), " (",
                                              absl::StrJoin(given, ", "), ")"));
  }
  if (regex != nullptr) {
    if (!regex->is_string()) return Fields::Bad(given[0], "the regex must be a string");
    s->set_structured_regex(regex->get<std::string>());
    return std::nullopt;
  }
  if (grammar != nullptr) {
    if (!grammar->is_string() || grammar->get<std::string>().empty()) {
      return Fields::Bad(given[0], "the grammar must be a non-empty string (GBNF / EBNF)");
    }
    s->set_structured_grammar(grammar->get<std::string>());
    return std::nullopt;
  }
  if (choices != nullptr) {
    if (!choices->is_array() || choices->empty()) {
      return Fields::Bad(given[0], "choice must be a non-empty list of strings");
    }
    for (const Json& c : *choices) {
      if (!c.is_string() || c.get<std::string>().empty()) {
        return Fields::Bad(given[0], "choice must be a non-empty list of non-empty strings");
      }
      s->add_structured_choice(c.get<std::string>());
    }
    return std::nullopt;
  }
  if (!schema.is_object() && !schema.is_boolean()) {
    return Fields::Bad(given[0], "the JSON schema must be an object");
  }
  s->set_structured_json_schema(schema.dump());
  return std::nullopt;
}

// tool_choice "required" or a named function: the reply is held to the
// tools' schemas as vLLM holds it (a structured output) and becomes the
// calls. "auto" and "none" leave it free.
std::optional<HttpError> ForcedToolCall(const Json& body, CompletionSpec* spec, v1::SamplingParams* s) {
  if (!Fields(body).Has("tool_choice")) return std::nullopt;
  const Json& choice = body["tool_choice"];
  if (choice == "auto" || choice == "none") return std::nullopt;
  const Json& tools = body.contains("tools") ? body["tools"] : Json();
  if (!tools.is_array() || tools.empty()) {
    return Fields::Bad("tool_choice", absl::StrCat("tool_choice=", choice.dump(), " needs tools"));
  }
  if (!s->structured_json_schema().empty() || s->structured_choice_size() > 0 ||
      !s->structured_regex().empty() || !s->structured_grammar().empty()) {
    return Fields::Bad("tool_choice", "tool_choice forces a call, a structured output of its own: "
                                      "send it without response_format or structured_outputs");
  }
  auto parameters = [](const Json& tool) -> Json {
    const Json& fn = tool["function"];
    return fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"]
                                                                      : Json{{"type", "object"}};
  };
  if (choice == "required") {
    // A list of at least one {"name", "parameters"}, each a tool's.
    Json alternatives = Json::array();
    for (const Json& tool : tools) {
      alternatives.push_back({{"type", "object"},
                              {"properties", {{"name", {{"enum", {tool["function"]["name"]}}}},
                                              {"parameters", parameters(tool)}}},
                              {"required", {"name", "parameters"}}});
    }
    const Json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", alternatives}}}};
    s->set_structured_json_schema(schema.dump());
    spec->tool_choice_required = true;
    return std::nullopt;
  }
  if (!choice.is_object() || !choice.contains("function") || !choice["function"].is_object() ||
      !choice["function"].contains("name") || !choice["function"]["name"].is_string()) {
    return Fields::Bad("tool_choice", absl::StrCat("tool_choice must be \"auto\", \"none\", \"required\" "
                                                   "or {\"type\": \"function\", \"function\": {\"name\"}}, got ",
                                                   choice.dump()));
  }
  const std::string name = choice["function"]["name"].get<std::string>();
  for (const Json& tool : tools) {
    if (tool["function"]["name"] == name) {
      s->set_structured_json_schema(parameters(tool).dump());
      spec->forced_function = name;
      return std::nullopt;
    }
  }
  return Fields::Bad("tool_choice", absl::StrCat("tool_choice names the function `", name,
                                                 "`, which is not among the tools"));
}

// Fills `req` with what chat and completions share; `default_max_tokens`
// when the client gives none.
// `defaults`: the model's recommended sampling, for the fields the body
// leaves out (and max_tokens' cap), as vLLM applies its generation config.
std::optional<HttpError> ParseCommon(const Json& body, bool chat, int64_t default_max_tokens,
                                     const OpenAiContext& context, v1::GenerateRequest* req,
                                     CompletionSpec* spec) {
  const int max_model_len = context.max_model_len;
  const GenerationDefaults& defaults = context.generation_defaults;
  // -1: the whole vocabulary, which the engine checks.
  const int64_t max_logprobs =
      context.max_logprobs < 0 ? std::numeric_limits<int32_t>::max() : context.max_logprobs;
  Fields f(body);
  v1::SamplingParams* s = req->mutable_sampling();
  std::optional<int64_t> i;
  std::optional<double> d;
  const int64_t token_limit = max_model_len > 0 ? max_model_len : (int64_t{1} << 31) - 1;
  const char* max_name = chat && f.Has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  // vLLM's completions take max_tokens 0 with echo: the prompt alone (with
  // its logprobs), one token generated and left out.
  const bool echo = !chat && f.Has("echo") && body["echo"].is_boolean() && body["echo"].get<bool>();
  if (auto e = f.Int(max_name, echo ? 0 : 1, token_limit, &i)) return e;
  spec->echo_only = i == 0;
  int64_t max_tokens = i.value_or(default_max_tokens);
  if (defaults.max_tokens) max_tokens = std::min(max_tokens, *defaults.max_tokens);
  s->set_max_tokens(static_cast<uint32_t>(spec->echo_only ? 1 : max_tokens));
  i.reset();
  d.reset();
  if (auto e = f.Number("temperature", 0, 2, &d)) return e;
  s->set_temperature(static_cast<float>(d.value_or(defaults.temperature.value_or(1.0))));
  d.reset();
  if (auto e = f.Number("top_p", 1e-9, 1, &d)) return e;
  if (!d) d = defaults.top_p;
  if (d) s->set_top_p(static_cast<float>(*d));
  if (auto e = f.Int("top_k", -1, 1 << 30, &i)) return e;
  if (!i) i = defaults.top_k;
  if (i) s->set_top_k(static_cast<int32_t>(*i));
  i.reset();
  if (auto e = f.Int("seed", INT64_MIN, INT64_MAX, &i)) return e;
  if (i) s->mutable_seed()->set_value(static_cast<uint64_t>(*i));
  i.reset();
  if (auto e = f.Int("best_of", 1, 1, &i)) return e;
  i.reset();
  // vLLM's `priority` (--scheduling-policy=priority; the engine refuses a
  // value other than 0 under fcfs).
  if (auto e = f.Int("priority", std::numeric_limits<int32_t>::min(),
                     std::numeric_limits<int32_t>::max(), &i)) {
    return e;
  }
  if (i) req->set_priority(static_cast<int32_t>(*i));
  i.reset();
  // vLLM's `cache_salt` (null: none), with vLLM's message.
  if (f.Has("cache_salt")) {
    const Json& salt = body["cache_salt"];
    if (!salt.is_string() || salt.get<std::string>().empty()) {
      return Fields::Bad("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.");
    }
    req->set_cache_salt(salt.get<std::string>());
  }
  bool flag = false;
  if (auto e = f.Bool("ignore_eos", &flag)) return e;
  s->set_ignore_eos(flag);
  bool skip = true;
  if (auto e = f.Bool("skip_special_tokens", &skip)) return e;
  s->mutable_skip_special_tokens()->set_value(skip);
  if (f.Has("stop")) {
    const Json& stop = body["stop"];
    if (stop.is_string()) {
      s->add_stop(stop.get<std::string>());
    } else if (stop.is_array()) {
      for (const Json& one : stop) {
        if (!one.is_string()) return Fields::Bad("stop", "stop must be a string or a list of strings");
        s->add_stop(one.get<std::string>());
      }
    } else {
      return Fields::Bad("stop", "stop must be a string or a list of strings");
    }
  }
  std::vector<int32_t> stop_ids;
  if (auto e = f.TokenIds("stop_token_ids", &stop_ids)) return e;
  for (int32_t t : stop_ids) s->add_stop_token_ids(t);
  if (auto e = f.Bool("include_stop_str_in_output", &flag)) return e;
  s->set_include_stop_str_in_output(flag);
  d.reset();
  if (auto e = f.Number("min_p", 0, 1, &d)) return e;
  s->set_min_p(static_cast<float>(d.value_or(defaults.min_p.value_or(0))));
  d.reset();
  if (auto e = f.Number("presence_penalty", -2, 2, &d)) return e;
  s->set_presence_penalty(static_cast<float>(d.value_or(0)));
  d.reset();
  if (auto e = f.Number("frequency_penalty", -2, 2, &d)) return e;
  s->set_frequency_penalty(static_cast<float>(d.value_or(0)));
  d.reset();
  if (f.Has("repetition_penalty")) {
    const Json& v = body["repetition_penalty"];
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>())) {
      return Fields::Bad("repetition_penalty", absl::StrCat("repetition_penalty must be a number "
                                                            "> 0 (1 = off), got ", v.dump()));
    }
    s->set_repetition_penalty(static_cast<float>(v.get<double>()));
  } else if (defaults.repetition_penalty) {
    s->set_repetition_penalty(static_cast<float>(*defaults.repetition_penalty));
  }
  if (f.Has("logit_bias")) {
    // OpenAI's form: {"<token id>": bias}; biases are clamped to [-100, 100]
    // as OpenAI and vLLM do.
    const Json& bias = body["logit_bias"];
    if (!bias.is_object()) {
      return Fields::Bad("logit_bias", "logit_bias must be an object of token id -> bias");
    }
    if (bias.size() > kMaxLogitBias) {
      return Fields::Bad("logit_bias", absl::StrCat("logit_bias has ", bias.size(),
                                                    " entries; the limit is ", kMaxLogitBias));
    }
    for (const auto& [key, value] : bias.items()) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(key, &id) || !value.is_number()) {
        return Fields::Bad("logit_bias", absl::StrCat("logit_bias: each key must be a token id "
                                                      "and each value a number, got \"",
                                                      key, "\": ", value.dump()));
      }
      (*s->mutable_logit_bias())[id] =
          static_cast<float>(std::clamp(value.get<double>(), -100.0, 100.0));
    }
  }
  i.reset();
  if (auto e = f.Int("min_tokens", 0, token_limit, &i)) return e;
  s->set_min_tokens(static_cast<uint32_t>(i.value_or(0)));
  i.reset();
  if (auto e = ParseStructuredOutput(body, s)) return e;
  std::vector<int32_t> allowed;
  if (auto e = f.TokenIds("allowed_token_ids", &allowed)) return e;
  if (f.Has("allowed_token_ids") && allowed.empty()) {
    return Fields::Bad("allowed_token_ids", "allowed_token_ids must name at least one token");
  }
  s->mutable_allowed_token_ids()->Add(allowed.begin(), allowed.end());
  if (f.Has("bad_words")) {
    const Json& words = body["bad_words"];
    if (!words.is_array()) return Fields::Bad("bad_words", "bad_words must be a list of strings");
    for (size_t w = 0; w < words.size(); ++w) {
      if (!words[w].is_string()) {
        return Fields::Bad("bad_words", absl::StrCat("bad_words[", w, "] must be a string"));
      }
      s->add_bad_words(words[w].get<std::string>());
    }
  }
  if (auto e = f.Neutral("use_beam_search", false)) return e;
  if (chat) {
    // OpenAI's chat form: logprobs (bool), top_logprobs (0..--max-logprobs,
    // needs logprobs).
    bool logprobs = false;
    if (auto e = f.Bool("logprobs", &logprobs)) return e;
    i.reset();
    if (auto e = f.Int("top_logprobs", 0, max_logprobs, &i)) return e;
    if (i && *i > 0 && !logprobs) {
      return Fields::Bad("top_logprobs", "top_logprobs needs logprobs=true");
    }
    if (logprobs) s->mutable_logprobs()->set_value(static_cast<int32_t>(i.value_or(0)));
    i.reset();
  } else {
    // The completions form: logprobs = how many top tokens.
    if (auto e = f.Int("logprobs", 0, max_logprobs, &i)) return e;
    if (i) s->mutable_logprobs()->set_value(static_cast<int32_t>(*i));
    i.reset();
    if (auto e = f.Neutral("suffix", "")) return e;
  }
  spec->logprobs = s->has_logprobs();
  spec->stream = false;
  if (auto e = f.Bool("stream", &spec->stream)) return e;
  // vLLM's prompt_logprobs: each prompt token's, in the response's
  // `prompt_logprobs` (as vLLM, not with stream).
  if (auto e = f.Int("prompt_logprobs", 0, max_logprobs, &i)) return e;
  if (i) {
    if (spec->stream) return Fields::Bad("prompt_logprobs", "prompt_logprobs are not available with stream=true");
    s->mutable_prompt_logprobs()->set_value(static_cast<int32_t>(*i));
    spec->prompt_logprobs = true;
  }
  i.reset();
  spec->include_usage = false;
  if (f.Has("stream_options")) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) return Fields::Bad("stream_options", "stream_options must be an object");
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean()) {
        return Fields::Bad("stream_options", "stream_options.include_usage must be true or false");
      }
      spec->include_usage = so["include_usage"].get<bool>();
    }
  }
  return Fields(body).Bool("return_token_ids", &spec->return_token_ids);
}

// OpenAI content: a string, null, or parts of which only text is supported.
// A missing or null content (an assistant turn that only calls tools, as
// the OpenAI SDK, LangChain and LiteLLM send it) is "", as vLLM hands it to
// the template (a template adding it to a string would fail on None).
std::optional<HttpError> FlattenContent(Json* message, size_t index) {
  Json& content = (*message)["content"];
  if (content.is_null()) content = "";
  if (content.is_string()) return std::nullopt;
  if (!content.is_array()) {
    return Fields::Bad("messages", absl::StrCat("messages[", index, "].content must be a string or a list of parts"));
  }
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
        !part.contains("text") || !part["text"].is_string()) {
      return Fields::Bad("messages", absl::StrCat("messages[", index,
                                                  "].content: only text parts are supported"));
    }
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  content = text;
  return std::nullopt;
}

// Messages as chat templates expect them: content parts joined, tool call
// arguments as objects (OpenAI sends them as JSON strings).
std::optional<HttpError> NormalizeMessages(Json* messages) {
  if (!messages->is_array() || messages->empty()) {
    return Fields::Bad("messages", "messages must be a non-empty list");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    Json& m = (*messages)[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return Fields::Bad("messages", absl::StrCat("messages[", i, "] must be an object with a role"));
    }
    if (auto e = FlattenContent(&m, i)) return e;
    // Templates read an earlier turn's reasoning as reasoning_content
    // (vLLM's newer name for it is reasoning).
    if (m.contains("reasoning") && m["reasoning"].is_string() && !m.contains("reasoning_content")) {
      m["reasoning_content"] = m["reasoning"];
    }
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (Json& call : m["tool_calls"]) {
        if (call.is_object() && call.contains("function") && call["function"].is_object() &&
            call["function"].contains("arguments") && call["function"]["arguments"].is_string()) {
          Json args = ParseJsonBounded(call["function"]["arguments"].get<std::string>());
          if (!args.is_discarded()) call["function"]["arguments"] = std::move(args);
        }
      }
    }
  }
  return std::nullopt;
}

// Whether the vocabulary has Mistral's [TOOL_CALLS] as a special token.
bool IsMistralToolCallToken(const Tokenizer* tokenizer) {
  if (tokenizer == nullptr) return false;
  const int32_t id = tokenizer->TokenToId("[TOOL_CALLS]");
  return id >= 0 && tokenizer->IsSpecial(id);
}

// OpenAI's tools: [{"type": "function", "function": {"name", "description",
// "parameters"}}], as vLLM checks them before the template sees them.
std::optional<HttpError> CheckTools(const Json& tools) {
  if (tools.is_null()) return std::nullopt;
  if (!tools.is_array()) return Fields::Bad("tools", "tools must be a list");
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string at = absl::StrCat("tools[", i, "]");
    if (!t.is_object()) return Fields::Bad("tools", absl::StrCat(at, " must be an object"));
    if (t.contains("type") && t["type"] != "function") {
      return Fields::Bad("tools", absl::StrCat(at, ".type must be \"function\", got ", t["type"].dump()));
    }
    if (!t.contains("function") || !t["function"].is_object()) {
      return Fields::Bad("tools", absl::StrCat(at, ".function must be an object"));
    }
    const Json& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string()) {
      return Fields::Bad("tools", absl::StrCat(at, ".function.name must be a string"));
    }
    if (fn.contains("parameters") && !fn["parameters"].is_null() && !fn["parameters"].is_object()) {
      return Fields::Bad("tools", absl::StrCat(at, ".function.parameters must be an object"));
    }
  }
  return std::nullopt;
}

// vLLM's words for a prompt over the context (OpenAI's code).
HttpError ContextTooLong(size_t tokens, int max_model_len, const char* param) {
  return {400,
          absl::StrCat("This model's maximum context length is ", max_model_len,
                       " tokens. However, your request has ", tokens,
                       " input tokens. Please reduce the length of the input ", param, "."),
          param, "context_length_exceeded"};
}

// A text of `bytes` fits max_model_len only if its tokens, each at most the
// vocabulary's longest, can number fewer: more is refused untokenized.
std::optional<HttpError> CheckTextFits(size_t bytes, const OpenAiContext& context, const char* param) {
  if (context.max_token_bytes == 0 || context.max_model_len <= 0) return std::nullopt;
  const size_t most = context.max_token_bytes * static_cast<size_t>(context.max_model_len);
  if (bytes <= most) return std::nullopt;
  return HttpError{400,
                   absl::StrCat("This model's maximum context length is ", context.max_model_len,
                                " tokens. However, your request's ", param, " has ", bytes,
                                " bytes of text, more than ", context.max_model_len,
                                " tokens of this vocabulary (at most ", context.max_token_bytes,
                                " bytes each) can hold. Please reduce the length of the input ", param, "."),
                   param, "context_length_exceeded"};
}

OpenAiRequest Error(HttpError e) {
  OpenAiRequest r;
  r.error = std::move(e);
  return r;
}

OpenAiRequest Reply(Json reply) {
  OpenAiRequest r;
  r.reply = std::move(reply);
  return r;
}

}  // namespace

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

// transformers' apply_chat_template(continue_final_message=True): the
// rendered chat ends where the final message's text does (its end-of-turn
// and whatever follows cut off), found as the last occurrence of that text
// stripped of surrounding whitespace; its trailing whitespace is kept where
// the template kept it (and the text has no leading whitespace). An empty
// final message is refused (transformers would leave its end-of-turn in).
std::optional<HttpError> CutAfterFinalMessage(const Json& messages, std::string* rendered) {
  const Json* content = messages.is_array() && !messages.empty() && messages.back().is_object() &&
                                messages.back().contains("content")
                            ? &messages.back()["content"]
                            : nullptr;
  if (content == nullptr || !content->is_string()) {
    return HttpError{400, "continue_final_message is set but we could not find any text to continue "
                          "in the final message!", "continue_final_message"};
  }
  const std::string text = content->get<std::string>();
  const absl::string_view stripped = absl::StripAsciiWhitespace(text);
  const absl::string_view left = absl::StripLeadingAsciiWhitespace(text);
  const size_t at = rendered->rfind(std::string(stripped));
  if (stripped.empty() || at == std::string::npos) {
    return HttpError{400, "continue_final_message is set but the final message does not appear in "
                          "the chat after applying the chat template!", "continue_final_message"};
  }
  const bool kept = rendered->compare(at, left.size(), text) == 0;  // as transformers compares
  rendered->resize(at + (kept ? left.size() : stripped.size()));
  return std::nullopt;
}

std::optional<HttpError> ResponsesToChat(const Json& body, Json* chat) {
  const Fields f(body);
  *chat = Json::object();
  for (const char* key : {"model", "temperature", "top_p", "stream", "user", "seed", "top_k",
                          "min_p", "repetition_penalty", "stop", "tools", "tool_choice",
                          "parallel_tool_calls", "priority", "cache_salt"}) {
    if (f.Has(key)) (*chat)[key] = body[key];
  }
  if (f.Has("previous_response_id")) {
    return Fields::Bad("previous_response_id",
                       "previous_response_id is not supported: this server stores no responses; "
                       "send the whole conversation as input");
  }
  if (f.Has("background") && body["background"] != false) {
    return Fields::Bad("background", "background responses are not supported");
  }
  if (f.Has("max_output_tokens")) {
    std::optional<int64_t> max;
    if (auto e = f.Int("max_output_tokens", 1, std::numeric_limits<int32_t>::max(), &max)) return e;
    (*chat)["max_tokens"] = *max;
  }
  Json messages = Json::array();
  if (f.Has("instructions")) {
    if (!body["instructions"].is_string()) {
      return Fields::Bad("instructions", "instructions must be a string");
    }
    messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
  }
  const Json& input = f.Has("input") ? body["input"] : Json();
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
  } else if (input.is_array()) {
    for (size_t i = 0; i < input.size(); ++i) {
      const Json& item = input[i];
      const std::string at = absl::StrCat("input[", i, "]");
      if (!item.is_object()) return Fields::Bad("input", absl::StrCat(at, " must be an object"));
      const std::string type = item.contains("type") && item["type"].is_string()
                                   ? item["type"].get<std::string>()
                                   : (item.contains("role") ? "message" : "");
      if (type == "message") {
        if (!item.contains("role") || !item["role"].is_string()) {
          return Fields::Bad("input", absl::StrCat(at, ".role must be a string"));
        }
        std::string role = item["role"].get<std::string>();
        if (role == "developer") role = "system";
        const Json& content = item.contains("content") ? item["content"] : Json();
        Json text;
        if (content.is_string()) {
          text = content;
        } else if (content.is_array()) {
          text = Json::array();
          for (size_t j = 0; j < content.size(); ++j) {
            const Json& part = content[j];
            const std::string pt = part.is_object() && part.contains("type") && part["type"].is_string()
                                       ? part["type"].get<std::string>()
                                       : "";
            if (pt != "input_text" && pt != "output_text" && pt != "text") {
              return Fields::Bad("input", absl::StrCat(at, ".content[", j, "]: only text parts ",
                                                       "(input_text, output_text) are supported, got ",
                                                       EchoClientText(part.is_object() && part.contains("type")
                                                                          ? part["type"].dump()
                                                                          : part.dump())));
            }
            if (!part.contains("text") || !part["text"].is_string()) {
              return Fields::Bad("input", absl::StrCat(at, ".content[", j, "]: an ", pt,
                                                       " part needs `text`, a string"));
            }
            text.push_back({{"type", "text"}, {"text", part["text"]}});
          }
        } else {
          return Fields::Bad("input", absl::StrCat(at, ".content must be a string or a list of parts"));
        }
        messages.push_back({{"role", role}, {"content", text}});
      } else if (type == "function_call") {
        for (const char* key : {"call_id", "name", "arguments"}) {
          if (!item.contains(key) || !item[key].is_string()) {
            return Fields::Bad("input", absl::StrCat(at, ".", key, " must be a string"));
          }
        }
        const Json call = {{"id", item["call_id"]},
                           {"type", "function"},
                           {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
        // Calls made in one turn are one assistant message's.
        if (!messages.empty() && messages.back()["role"] == "assistant" &&
            messages.back().contains("tool_calls")) {
          messages.back()["tool_calls"].push_back(call);
        } else {
          messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", {call}}});
        }
      } else if (type == "function_call_output") {
        if (!item.contains("call_id") || !item["call_id"].is_string()) {
          return Fields::Bad("input", absl::StrCat(at, ".call_id must be a string"));
        }
        const Json& output = item.contains("output") ? item["output"] : Json();
        std::string text;
        if (output.is_string()) {
          text = output.get<std::string>();
        } else if (output.is_array()) {  // parts: their text
          for (const Json& part : output) {
            if (part.is_object() && part.contains("text") && part["text"].is_string()) {
              text += part["text"].get<std::string>();
            }
          }
        } else {
          return Fields::Bad("input", absl::StrCat(at, ".output must be a string or a list of parts"));
        }
        messages.push_back({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", text}});
      } else if (type == "reasoning") {
        continue;  // an earlier turn's thinking: templates drop it
      } else {
        return Fields::Bad("input", absl::StrCat(at, ".type ", item.contains("type") ? item["type"].dump() : "(none)",
                                                 " is not supported (message, function_call, "
                                                 "function_call_output, reasoning)"));
      }
    }
  } else {
    return Fields::Bad("input", "input must be a string or a list of items");
  }
  (*chat)["messages"] = std::move(messages);
  if (f.Has("tools")) {
    const Json& tools = body["tools"];
    if (!tools.is_array()) return Fields::Bad("tools", "tools must be a list");
    Json out = Json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const Json& t = tools[i];
      if (!t.is_object() || t.value("type", Json()) != "function") {
        return Fields::Bad("tools", absl::StrCat("tools[", i, "].type must be \"function\" (",
                                                 "built-in tools are not supported), got ",
                                                 t.is_object() && t.contains("type") ? t["type"].dump() : t.dump()));
      }
      Json fn = Json::object();
      for (const char* key : {"name", "description", "parameters"}) {
        if (t.contains(key)) fn[key] = t[key];
      }
      out.push_back({{"type", "function"}, {"function", fn}});
    }
    (*chat)["tools"] = std::move(out);
  }
  if (f.Has("tool_choice") && body["tool_choice"].is_object()) {
    const Json& c = body["tool_choice"];
    if (c.value("type", Json()) != "function" || !c.contains("name")) {
      return Fields::Bad("tool_choice", absl::StrCat("tool_choice must be \"auto\", \"none\", \"required\" "
                                                     "or {\"type\": \"function\", \"name\"}, got ", c.dump()));
    }
    (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
  }
  if (f.Has("text") && body["text"].is_object() && body["text"].contains("format")) {
    const Json& format = body["text"]["format"];
    const Json type = format.is_object() ? format.value("type", Json()) : Json();
    if (type == "json_schema") {
      Json schema = {{"name", format.value("name", Json("response"))}};
      if (format.contains("schema")) schema["schema"] = format["schema"];
      (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", schema}};
    } else if (type == "json_object") {
      (*chat)["response_format"] = {{"type", "json_object"}};
    } else if (type != "text") {
      return Fields::Bad("text", absl::StrCat("text.format.type must be text, json_object or json_schema, got ",
                                              type.dump()));
    }
  }
  return std::nullopt;
}

OpenAiRequest ParseOpenAiRequest(OpenAiRoute route, const std::string& text,
                                 const OpenAiContext& context) {
  const bool chat = route == OpenAiRoute::kChatCompletions;
  const bool tokenize = route == OpenAiRoute::kTokenize;
  const Tokenizer* tokenizer = context.tokenizer;
  std::string why;
  const Json body = ParseJsonBounded(text, &why);
  if (body.is_discarded()) return Error({400, absl::StrCat("the request body is not JSON: ", why), ""});
  if (!body.is_object()) {
    return Error({400, absl::StrCat("the request body must be a JSON object, got ", body.type_name()), ""});
  }
  if (route == OpenAiRoute::kResponses) {
    Json chat;
    if (auto e = ResponsesToChat(body, &chat)) return Error(*e);
    OpenAiRequest r = ParseOpenAiRequest(OpenAiRoute::kChatCompletions, chat.dump(), context);
    r.spec.responses = true;
    return r;
  }
  std::string model_name = context.served_model_name;
  std::string lora_name;  // the adapter the model names, if it names one
  if (body.contains("model") && !body["model"].is_null()) {
    const Json& model = body["model"];
    const bool adapter = model.is_string() &&
                         absl::c_linear_search(context.lora_adapters, model.get<std::string>());
    const bool served = model.is_string() && (model == context.served_model_name ||
                                              absl::c_linear_search(context.model_aliases, model.get<std::string>()));
    if (!served && !adapter) {
      // A name as the client wrote it (not JSON-quoted); anything else as JSON.
      std::vector<std::string> names = {context.served_model_name};
      names.insert(names.end(), context.model_aliases.begin(), context.model_aliases.end());
      names.insert(names.end(), context.lora_adapters.begin(), context.lora_adapters.end());
      return Error({404, absl::StrCat("The model `", EchoClientText(model.is_string() ? model.get<std::string>() : model.dump()),
                                      "` does not exist; this server serves `", absl::StrJoin(names, "`, `"), "`"),
                    "model"});
    }
    model_name = model.get<std::string>();
    if (adapter && !served) lora_name = model_name;
  }
  if (route == OpenAiRoute::kDetokenize) {
    if (tokenizer == nullptr) return Error({400, "this model has no tokenizer", ""});
    std::vector<int32_t> ids;
    if (!body.contains("tokens")) return Error(Fields::Bad("tokens", "tokens must be a list of token ids"));
    if (auto e = Fields::TokenIdList(body["tokens"], "tokens", "tokens", &ids)) return Error(*e);
    return Reply({{"prompt", tokenizer->Decode(ids)}});
  }

  // The prompts: chat messages through the template, or the completion's
  // prompt (a string or token ids, or a list of them: a batch).
  struct Prompt {
    std::vector<int32_t> ids;
    std::string text;
    bool has_ids = false;
    bool from_text = false;  // ids tokenized here from `text` (echo gives the text)
  };
  std::vector<Prompt> prompts(1);
  bool thinking = true;
  bool offered_tools = false;  // tools that reach the template (not tool_choice "none")
  Json tool_properties = Json::object();
  if (chat || (tokenize && body.contains("messages"))) {
    if (tokenizer == nullptr || context.chat_template == nullptr) {
      return Error({400, tokenizer == nullptr ? "chat needs a tokenizer, and this model has none"
                                              : "this model has no chat template; start the decode "
                                                "worker with --chat-template=FILE",
                    "messages"});
    }
    Json messages = body.value("messages", Json());
    if (auto e = NormalizeMessages(&messages)) return Error(*e);
    Json tools = body.value("tools", Json());
    if (auto e = CheckTools(tools)) return Error(*e);
    if (body.contains("tool_choice") && body["tool_choice"] == "none") tools = nullptr;
    offered_tools = tools.is_array() && !tools.empty();
    if (offered_tools) {
      for (const Json& tool : tools) {  // CheckTools: each has a function with a string name
        const Json& fn = tool["function"];
        const Json none = Json::object();
        const Json& params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : none;
        tool_properties[fn["name"].get<std::string>()] =
            params.contains("properties") ? params["properties"] : Json::object();
      }
    }
    bool add_generation_prompt = true;
    if (auto e = Fields(body).Bool("add_generation_prompt", &add_generation_prompt)) return Error(*e);
    // vLLM's continue_final_message: the reply continues the last message
    // (a prefilled start of the answer) instead of opening a new one, so no
    // generation prompt (unless asked for, which is refused as vLLM does).
    bool continue_final = false;
    if (auto e = Fields(body).Bool("continue_final_message", &continue_final)) return Error(*e);
    if (continue_final) {
      if (body.contains("add_generation_prompt") && add_generation_prompt) {
        return Error({400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                      "continue_final_message"});
      }
      add_generation_prompt = false;
    }
    Json kwargs = body.value("chat_template_kwargs", Json());
    if (!kwargs.is_null() && !kwargs.is_object()) {
      return Error({400, "chat_template_kwargs must be an object", "chat_template_kwargs"});
    }
    // What the server gives the template from the checked request, and the
    // model's own tokens, are not the client's to replace.
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt",
                                 "continue_final_message", "chat_template", "bos_token", "eos_token"}) {
      if (kwargs.is_object() && kwargs.contains(reserved)) {
        return Error({400, absl::StrCat("chat_template_kwargs.", reserved, " is set by the server; ",
                                        std::string(reserved) == "messages" || std::string(reserved) == "tools"
                                            ? absl::StrCat("send it as the request's `", reserved, "`")
                                            : "it cannot be overridden"),
                      "chat_template_kwargs"});
      }
    }
    // vLLM's chat_template: a request's own template, only where the
    // operator trusts the clients with one.
    std::optional<ChatTemplate> request_template;
    if (body.contains("chat_template") && !body["chat_template"].is_null()) {
      if (!context.trust_request_chat_template) {
        return Error({400, "chat_template: this server does not take a request's chat template (start "
                           "the decode worker with --trust-request-chat-template to allow it)",
                      "chat_template"});
      }
      if (!body["chat_template"].is_string()) {
        return Error({400, "chat_template must be a string", "chat_template"});
      }
      auto created = ChatTemplate::Create(body["chat_template"].get<std::string>(), "the request's chat_template",
                                          context.chat_template->bos_token(), context.chat_template->eos_token());
      if (!created.ok()) return Error({400, std::string(created.status().message()), "chat_template"});
      request_template = *std::move(created);
    }
    const ChatTemplate& chat_template = request_template ? *request_template : *context.chat_template;
    if (kwargs.is_object() && kwargs.contains("enable_thinking") && kwargs["enable_thinking"].is_boolean()) {
      thinking = kwargs["enable_thinking"].get<bool>();
    }
    auto rendered = chat_template.Render(messages, tools, add_generation_prompt, kwargs);
    if (!rendered.ok()) {
      // A template over its step or memory budget fails this request: 400.
      const absl::StatusCode code = rendered.status().code();
      return Error({code == absl::StatusCode::kResourceExhausted ? 400 : HttpStatusFor(code),
                    std::string(rendered.status().message()), "messages"});
    }
    if (continue_final) {
      if (auto e = CutAfterFinalMessage(messages, &*rendered)) return Error(*e);
    }
    if (!tokenize) {  // /tokenize counts any length, as vLLM's
      if (auto e = CheckTextFits(rendered->size(), context, "messages")) return Error(*e);
    }
    // The template writes the special tokens itself (transformers and vLLM
    // tokenize its output without adding any).
    prompts[0].ids = tokenizer->Encode(*rendered, /*add_special_tokens=*/false);
    prompts[0].has_ids = true;
  } else {
    const Json& prompt = body.contains("prompt") ? body["prompt"] : Json();
    const HttpError bad{400, "prompt must be a string, a list of token ids, or a list of either "
                             "(a batch)", "prompt"};
    if (prompt.is_string()) {
      prompts[0].text = prompt.get<std::string>();
    } else if (!prompt.is_array() || prompt.empty()) {
      return Error(bad);
    } else if (prompt[0].is_number_integer()) {
      if (auto e = Fields::TokenIdList(prompt, "prompt", "prompt", &prompts[0].ids)) return Error(*e);
      prompts[0].has_ids = true;
    } else {
      if (prompt.size() > kMaxChoices) {
        return Error({400, absl::StrCat("prompt is a batch of ", prompt.size(),
                                        " prompts; the limit is ", kMaxChoices), "prompt"});
      }
      prompts.assign(prompt.size(), Prompt());
      for (size_t i = 0; i < prompt.size(); ++i) {
        if (prompt[i].is_string()) {
          prompts[i].text = prompt[i].get<std::string>();
        } else if (prompt[i].is_array() && !prompt[i].empty()) {
          if (auto e = Fields::TokenIdList(prompt[i], "prompt", absl::StrCat("prompt[", i, "]"),
                                           &prompts[i].ids)) {
            return Error(*e);
          }
          prompts[i].has_ids = true;
        } else {
          return Error(bad);
        }
      }
    }
  }
  if (tokenize) {
    if (prompts.size() != 1) return Error({400, "/tokenize takes one prompt", "prompt"});
    Prompt& p = prompts[0];
    if (!p.has_ids) {
      if (tokenizer == nullptr) return Error({400, "this model has no tokenizer", ""});
      bool add_special = true;
      if (auto e = Fields(body).Bool("add_special_tokens", &add_special)) return Error(*e);
      p.ids = tokenizer->Encode(p.text, add_special);
    }
    return Reply({{"count", p.ids.size()}, {"max_model_len", context.max_model_len}, {"tokens", p.ids}});
  }

  // vLLM's truncate_prompt_tokens: each prompt keeps its last k tokens (-1:
  // max_model_len), counted as the model's tokenizer counts them.
  std::optional<int64_t> truncate;
  if (auto e = Fields(body).Int("truncate_prompt_tokens", -1, std::max(context.max_model_len, 1), &truncate)) {
    return Error(*e);
  }
  if (truncate) {
    if (*truncate == 0) return Error({400, "truncate_prompt_tokens must be -1 or in [1, max_model_len], got 0", "truncate_prompt_tokens"});
    const size_t keep = static_cast<size_t>(*truncate == -1 ? context.max_model_len : *truncate);
    for (Prompt& p : prompts) {
      if (!p.has_ids) {
        if (tokenizer == nullptr) return Error({400, "truncate_prompt_tokens of a text prompt needs a tokenizer", "truncate_prompt_tokens"});
        p.ids = tokenizer->Encode(p.text);  // as the decode worker would
        p.has_ids = true;
      }
      if (keep > 0 && p.ids.size() > keep) p.ids.erase(p.ids.begin(), p.ids.end() - static_cast<int64_t>(keep));
    }
  }

  // Every prompt is counted in tokens here, before anything is spent on it
  // (and before its size meets a transport limit): a text prompt that
  // cannot fit is refused untokenized, the others tokenized as the decode
  // worker would and checked against max_model_len.
  for (Prompt& p : prompts) {
    if (!p.has_ids && tokenizer != nullptr) {
      if (auto e = CheckTextFits(p.text.size(), context, "prompt")) return Error(*e);
      p.ids = tokenizer->Encode(p.text);
      p.has_ids = p.from_text = true;
    }
    if (p.has_ids && context.max_model_len > 0 &&
        p.ids.size() >= static_cast<size_t>(context.max_model_len)) {
      return Error(ContextTooLong(p.ids.size(), context.max_model_len, chat ? "messages" : "prompt"));
    }
  }

  OpenAiRequest r;
  int64_t default_max = 16;  // OpenAI's for completions
  if (chat) {
    // vLLM's default: what the context has left.
    default_max = std::max<int64_t>(1, context.max_model_len - static_cast<int64_t>(prompts[0].ids.size()));
  }
  CompletionSpec& spec = r.spec;
  spec.model = model_name;
  spec.chat = chat;
  spec.thinking = thinking;
  spec.tools = chat && offered_tools;
  spec.tool_properties = std::move(tool_properties);
  if (auto e = Fields(body).Bool("parallel_tool_calls", &spec.parallel_tool_calls)) return Error(*e);
  spec.tokens_as_ids = context.return_tokens_as_token_ids;
  if (auto e = Fields(body).Bool("return_tokens_as_token_ids", &spec.tokens_as_ids)) return Error(*e);
  v1::GenerateRequest common;
  if (auto e = ParseCommon(body, chat, default_max, context, &common, &spec)) {
    return Error(*e);
  }
  common.set_lora_name(lora_name);
  spec.eos_token_id = context.eos_token_id;
  spec.ignore_eos = common.sampling().ignore_eos();
  if (chat) {
    if (auto e = ForcedToolCall(body, &spec, common.mutable_sampling())) return Error(*e);
  }
  // Mistral's calls open with its [TOOL_CALLS] token (v11 on: and [ARGS]
  // between name and arguments), special tokens that skip_special_tokens
  // would drop: kept in the reply when tools are offered and the model may
  // call them, as vLLM's mistral parser asks.
  if (spec.tools && spec.forced_function.empty() && !spec.tool_choice_required &&
      IsMistralToolCallToken(tokenizer)) {
    common.mutable_sampling()->mutable_skip_special_tokens()->set_value(false);
  }
  std::optional<int64_t> n;
  if (auto e = Fields(body).Int("n", 1, kMaxChoices, &n)) return Error(*e);
  const size_t per_prompt = static_cast<size_t>(n.value_or(1));
  if (per_prompt * prompts.size() > kMaxChoices) {
    return Error({400, absl::StrCat("n=", per_prompt, " for each of ", prompts.size(), " prompts is ",
                                    per_prompt * prompts.size(), " completions; the limit is ",
                                    kMaxChoices, " a request"), "n"});
  }
  r.n = per_prompt;
  bool echo = false;
  if (!chat) {
    if (auto e = Fields(body).Bool("echo", &echo)) return Error(*e);
    if (echo && tokenizer == nullptr) return Error({400, "echo needs a tokenizer", "echo"});
    // echo with logprobs: the echoed prompt's tokens lead the choice's
    // logprobs (the first with none), as vLLM's (and lm-eval's loglikelihood
    // requests read them).
    if (echo && spec.logprobs) {
      spec.echo_logprobs = true;
      if (!common.sampling().has_prompt_logprobs()) {
        common.mutable_sampling()->mutable_prompt_logprobs()->set_value(common.sampling().logprobs().value());
      }
    }
  }
  // Choice p * n + j is sample j of prompt p; with a seed, sample j draws
  // with seed + j (vLLM's parallel sampling).
  for (const Prompt& p : prompts) {
    for (size_t j = 0; j < per_prompt; ++j) {
      OpenAiChoice& c = r.choices.emplace_back();
      c.generate = common;
      if (p.has_ids) {
        c.generate.mutable_prompt_token_ids()->Add(p.ids.begin(), p.ids.end());
      } else {
        c.generate.set_prompt(p.text);
      }
      if (common.sampling().has_seed()) {
        c.generate.mutable_sampling()->mutable_seed()->set_value(common.sampling().seed().value() + j);
      }
      if (echo) c.echo = p.has_ids && !p.from_text ? tokenizer->Decode(p.ids) : p.text;
      c.counts_prompt = j == 0;
    }
  }
  return r;
}

}  // namespace tandem
