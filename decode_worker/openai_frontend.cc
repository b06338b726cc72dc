#include "decode_worker/openai_frontend.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "common/engine/sampling.h"
#include "common/serving/status_convert.h"
#include "decode_worker/decode_service.h"
#include "decode_worker/tool_calls.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

struct HttpError {
  int status;
  std::string message;
  std::string param;  // the field at fault, or ""
};

std::string ErrorType(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 404: return "not_found_error";
    case 409: return "conflict_error";
    case 429: return "rate_limit_error";
    case 499: return "cancelled";
    case 501: return "not_implemented_error";
    case 503: return "service_unavailable_error";
    case 504: return "timeout_error";
    default: return "internal_error";
  }
}

std::string ErrorBody(const HttpError& e) {
  Json err = {{"message", e.message}, {"type", ErrorType(e.status)},
              {"param", e.param.empty() ? Json(nullptr) : Json(e.param)}, {"code", e.status}};
  return Json{{"error", err}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void SendError(HttpServer::Stream& stream, const HttpError& e) {
  stream.Respond(e.status, "application/json", ErrorBody(e));
}

void SendJson(HttpServer::Stream& stream, const Json& body) {
  stream.Respond(200, "application/json", body.dump(-1, ' ', false, Json::error_handler_t::replace));
}

std::string Sse(const Json& chunk) {
  return absl::StrCat("data: ", chunk.dump(-1, ' ', false, Json::error_handler_t::replace), "\n\n");
}

// Not thread_local: static TLS is carved from every thread's stack, and the
// metrics server's threads are small (with OpenBLAS's 60 KB of TLS, 2.5 KB
// more overflowed them under ASan).
std::string RandomHex(int n) {
  static Mutex mu;
  static std::mt19937_64 rng ABSL_GUARDED_BY(mu){std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string s;
  MutexLock lock(&mu);
  for (int i = 0; i < n; ++i) s += kHex[rng() % 16];
  return s;
}

// The typed fields of a request body; each error names the field.
class Fields {
 public:
  explicit Fields(const Json& body) : body_(body) {}

  bool Has(const char* name) const { return body_.contains(name) && !body_[name].is_null(); }

  std::optional<HttpError> Int(const char* name, int64_t lo, int64_t hi, std::optional<int64_t>* out) const {
    if (!Has(name)) return std::nullopt;
    const Json& v = body_[name];
    if (!v.is_number_integer() && !v.is_number_unsigned()) {
      return Bad(name, absl::StrCat(name, " must be an integer, got ", v.dump()));
    }
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) {
      return Bad(name, absl::StrCat(name, " must be in [", lo, ", ", hi, "], got ", i));
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
  static HttpError Bad(const char* name, std::string message) { return {400, std::move(message), name}; }

 private:
  const Json& body_;
};

// Fills `req` with what chat and completions share; `default_max_tokens`
// when the client gives none.
std::optional<HttpError> ParseCommon(const Json& body, bool chat, int64_t default_max_tokens,
                                     int max_model_len, v1::GenerateRequest* req, bool* stream,
                                     bool* include_usage) {
  Fields f(body);
  v1::SamplingParams* s = req->mutable_sampling();
  std::optional<int64_t> i;
  std::optional<double> d;
  const int64_t token_limit = max_model_len > 0 ? max_model_len : (int64_t{1} << 31) - 1;
  const char* max_name = chat && f.Has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto e = f.Int(max_name, 1, token_limit, &i)) return e;
  s->set_max_tokens(static_cast<uint32_t>(i.value_or(default_max_tokens)));
  i.reset();
  d.reset();
  if (auto e = f.Number("temperature", 0, 2, &d)) return e;
  s->set_temperature(static_cast<float>(d.value_or(1.0)));
  d.reset();
  if (auto e = f.Number("top_p", 1e-9, 1, &d)) return e;
  if (d) s->set_top_p(static_cast<float>(*d));
  if (auto e = f.Int("top_k", -1, 1 << 30, &i)) return e;
  if (i) s->set_top_k(static_cast<int32_t>(*i));
  i.reset();
  if (auto e = f.Int("seed", INT64_MIN, INT64_MAX, &i)) return e;
  if (i) s->set_seed(static_cast<uint64_t>(*i));
  i.reset();
  if (auto e = f.Int("n", 1, 1, &i)) return e;
  if (auto e = f.Int("best_of", 1, 1, &i)) return e;
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
  if (f.Has("stop_token_ids")) {
    if (!body["stop_token_ids"].is_array()) return Fields::Bad("stop_token_ids", "stop_token_ids must be a list of integers");
    for (const Json& t : body["stop_token_ids"]) {
      if (!t.is_number_integer()) return Fields::Bad("stop_token_ids", "stop_token_ids must be a list of integers");
      s->add_stop_token_ids(t.get<int32_t>());
    }
  }
  if (auto e = f.Bool("include_stop_str_in_output", &flag)) return e;
  s->set_include_stop_str_in_output(flag);
  d.reset();
  if (auto e = f.Number("min_p", 0, 1, &d)) return e;
  s->set_min_p(static_cast<float>(d.value_or(0)));
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
  // vLLM's fields that would constrain or score the output: refused rather
  // than ignored, so that no client takes free text for constrained text.
  for (const char* name : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                           "structured_outputs", "allowed_token_ids", "prompt_logprobs",
                           "truncate_prompt_tokens"}) {
    if (auto e = f.Neutral(name, nullptr)) return e;
  }
  if (auto e = f.Neutral("bad_words", Json::array())) return e;
  if (auto e = f.Neutral("use_beam_search", false)) return e;
  if (chat) {
    // OpenAI's chat form: logprobs (bool), top_logprobs (0..20, needs logprobs).
    bool logprobs = false;
    if (auto e = f.Bool("logprobs", &logprobs)) return e;
    i.reset();
    if (auto e = f.Int("top_logprobs", 0, kMaxLogprobs, &i)) return e;
    if (i && *i > 0 && !logprobs) {
      return Fields::Bad("top_logprobs", "top_logprobs needs logprobs=true");
    }
    if (logprobs) s->mutable_logprobs()->set_value(static_cast<int32_t>(i.value_or(0)));
    i.reset();
    if (f.Has("response_format") && body["response_format"].value("type", "") != "text") {
      return Fields::Bad("response_format", "response_format: only {\"type\": \"text\"} is supported");
    }
  } else {
    // The completions form: logprobs = how many top tokens (0..20).
    if (auto e = f.Int("logprobs", 0, kMaxLogprobs, &i)) return e;
    if (i) s->mutable_logprobs()->set_value(static_cast<int32_t>(*i));
    i.reset();
    if (auto e = f.Neutral("suffix", "")) return e;
  }
  *stream = false;
  if (auto e = f.Bool("stream", stream)) return e;
  *include_usage = false;
  if (f.Has("stream_options")) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) return Fields::Bad("stream_options", "stream_options must be an object");
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean()) {
        return Fields::Bad("stream_options", "stream_options.include_usage must be true or false");
      }
      *include_usage = so["include_usage"].get<bool>();
    }
  }
  return std::nullopt;
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\n\r");
  return s.substr(b, e - b + 1);
}

// One completion: a Generate call on the in-process channel, written to the
// HTTP stream as it streams (SSE) or whole at the end.
class CompletionCall final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  struct Spec {
    bool chat = false;
    bool stream = false;
    bool include_usage = false;
    bool tools = false;     // the request offered tools: look for calls in the reply
    std::string echo;       // completions with echo: the prompt text, sent first
    std::string model;
    int64_t created = 0;
    std::string prefiller;  // the gateway's x-prefiller-host-port, passed on
    bool return_token_ids = false;  // vLLM's extension: token ids in each choice
    bool logprobs = false;          // the request set sampling.logprobs
    const Tokenizer* tokenizer = nullptr;  // a token's text in logprobs
  };

  // Deletes itself when the call ends.
  static void Run(v1::Decode::Stub* stub, v1::GenerateRequest request, Spec spec,
                  std::shared_ptr<HttpServer::Stream> http) {
    auto* call = new CompletionCall(std::move(request), std::move(spec), std::move(http));
    // A client that goes away cancels the call (its KV blocks are freed).
    auto guard = call->guard_;
    call->http_->OnClose([guard] {
      MutexLock lock(&guard->mu);
      if (guard->call != nullptr) guard->call->context_.TryCancel();
    });
    if (!call->spec_.prefiller.empty()) {
      call->context_.AddMetadata(kPrefillerHeader, call->spec_.prefiller);
    }
    stub->async()->Generate(&call->context_, &call->request_, call);
    call->StartRead(&call->msg_);
    call->StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    Consume(msg_);
    StartRead(&msg_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      MutexLock lock(&guard_->mu);
      guard_->call = nullptr;
    }
    if (!status.ok()) {
      Fail(status);
    } else if (spec_.stream) {
      FinishStream();
    } else {
      FinishWhole();
    }
    delete this;
  }

 private:
  struct Guard {
    Mutex mu;
    CompletionCall* call ABSL_GUARDED_BY(mu);
  };

  CompletionCall(v1::GenerateRequest request, Spec spec, std::shared_ptr<HttpServer::Stream> http)
      : request_(std::move(request)), spec_(std::move(spec)), http_(std::move(http)),
        guard_(std::make_shared<Guard>()) {
    {
      MutexLock lock(&guard_->mu);
      guard_->call = this;
    }
    id_ = absl::StrCat(spec_.chat ? "chatcmpl-" : "cmpl-", request_.request_id());
  }

  Json Envelope(bool chunk) const {
    return {{"id", id_},
            {"object", spec_.chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                  : "text_completion"},
            {"created", spec_.created},
            {"model", spec_.model}};
  }

  // Streams hold back nothing, except when tools were offered (a call is
  // known only once the reply is whole).
  bool holding() const { return spec_.stream && spec_.tools; }

  void Consume(const v1::GenerateResponse& m) {
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      finish_ = m.finish_reason() == v1::FINISH_REASON_LENGTH ? "length" : "stop";
      prompt_tokens_ = m.usage().prompt_tokens();
      completion_tokens_ = m.usage().completion_tokens();
    }
    text_ += m.text();
    token_ids_.insert(token_ids_.end(), m.token_ids().begin(), m.token_ids().end());
    if (spec_.logprobs) {
      for (int i = 0; i < m.token_ids_size(); ++i) {
        AddLogprobs(m.token_ids(i), i < m.logprobs_size() ? m.logprobs(i) : v1::TokenLogprobs());
      }
    }
    if (!spec_.stream || holding()) return;
    if (!started_) {
      started_ = true;
      http_->Start(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      if (spec_.chat) {
        Json first = Envelope(true);
        first["choices"] = Json::array({{{"index", 0},
                                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr},
                                         {"finish_reason", nullptr}}});
        http_->Write(Sse(first));
      }
      if (!spec_.echo.empty()) WriteDelta(spec_.echo);
    }
    // A chunk per message that carries tokens, even when their text is not
    // out yet (an incomplete character; a model without a tokenizer): the
    // client sees every step. Its token ids go with it on request (vLLM's
    // return_token_ids) or when there is no text.
    if (!m.text().empty() || m.token_ids_size() > 0) {
      std::vector<int32_t> ids;
      if (spec_.return_token_ids || m.text().empty()) ids.assign(m.token_ids().begin(), m.token_ids().end());
      WriteDelta(m.text(), ids, LogprobsJson(token_ids_.size() - m.token_ids_size(), token_ids_.size()));
    }
  }

  // A token as logprobs show it: its text (invalid UTF-8 replaced), or
  // vLLM's "token_id:N" without a tokenizer.
  std::string TokenText(int32_t id) const {
    return spec_.tokenizer != nullptr ? spec_.tokenizer->Decode({id})
                                      : absl::StrCat("token_id:", id);
  }

  void AddLogprobs(int32_t id, const v1::TokenLogprobs& lp) {
    // vLLM's floor for a logprob JSON cannot hold (-inf).
    auto finite = [](float x) { return std::max(x, -9999.f); };
    Logprob entry{TokenText(id), finite(lp.logprob()), {}, text_offset_};
    for (int i = 0; i < std::min(lp.top_token_ids_size(), lp.top_logprobs_size()); ++i) {
      entry.top.emplace_back(TokenText(lp.top_token_ids(i)), finite(lp.top_logprobs(i)));
    }
    // Completions' text_offset counts characters, as Python's len() does.
    for (char c : entry.token) text_offset_ += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
    logprobs_.push_back(std::move(entry));
  }

  // A choice's `logprobs` for output tokens [begin, end): OpenAI's chat form
  // ({"content": [...]}, each entry's top_logprobs the n most likely) or the
  // completions form (parallel lists, each top_logprobs a dict that also
  // holds the sampled token); null when the request did not ask.
  Json LogprobsJson(size_t begin, size_t end) const {
    if (!spec_.logprobs) return nullptr;
    auto bytes = [](const std::string& t) {
      Json b = Json::array();
      for (char c : t) b.push_back(static_cast<uint8_t>(c));
      return b;
    };
    if (spec_.chat) {
      Json content = Json::array();
      for (size_t i = begin; i < end && i < logprobs_.size(); ++i) {
        const Logprob& e = logprobs_[i];
        Json top = Json::array();
        for (const auto& [token, logprob] : e.top) {
          top.push_back({{"token", token}, {"logprob", logprob}, {"bytes", bytes(token)}});
        }
        content.push_back({{"token", e.token}, {"logprob", e.logprob}, {"bytes", bytes(e.token)},
                           {"top_logprobs", top}});
      }
      return {{"content", content}};
    }
    Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
         offsets = Json::array();
    for (size_t i = begin; i < end && i < logprobs_.size(); ++i) {
      const Logprob& e = logprobs_[i];
      tokens.push_back(e.token);
      token_logprobs.push_back(e.logprob);
      Json dict = Json::object();
      for (const auto& [token, logprob] : e.top) dict[token] = logprob;
      dict[e.token] = e.logprob;
      top.push_back(dict);
      offsets.push_back(e.text_offset);
    }
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top},
            {"text_offset", offsets}};
  }

  void WriteDelta(const std::string& text, const std::vector<int32_t>& token_ids = {},
                  Json logprobs = nullptr) {
    Json chunk = Envelope(true);
    Json choice = {{"index", 0}};
    if (spec_.chat) {
      choice["delta"] = {{"content", text}};
    } else {
      choice["text"] = text;
    }
    if (!token_ids.empty()) choice["token_ids"] = token_ids;
    choice["logprobs"] = std::move(logprobs);
    choice["finish_reason"] = nullptr;
    chunk["choices"] = Json::array({choice});
    http_->Write(Sse(chunk));
  }

  Json Usage() const {
    return {{"prompt_tokens", prompt_tokens_},
            {"completion_tokens", completion_tokens_},
            {"total_tokens", prompt_tokens_ + completion_tokens_}};
  }

  // The reply's message: content, or tool calls when the request offered tools.
  Json Message(std::string* finish) const {
    Json message = {{"role", "assistant"}};
    std::string rest;
    Json calls = spec_.tools ? ParseToolCalls(text_, &rest, [] { return "call_" + RandomHex(24); })
                             : Json::array();
    if (!calls.empty()) {
      const std::string content = Trim(rest);
      message["content"] = content.empty() ? Json(nullptr) : Json(content);
      message["tool_calls"] = calls;
      *finish = "tool_calls";
    } else {
      message["content"] = text_;
    }
    return message;
  }

  void FinishWhole() {
    Json body = Envelope(false);
    std::string finish = finish_;
    Json choice = {{"index", 0}};
    if (spec_.chat) {
      choice["message"] = Message(&finish);
    } else {
      choice["text"] = spec_.echo + text_;
    }
    if (spec_.return_token_ids) choice["token_ids"] = token_ids_;
    choice["logprobs"] = LogprobsJson(0, logprobs_.size());
    choice["finish_reason"] = finish;
    body["choices"] = Json::array({choice});
    body["usage"] = Usage();
    SendJson(*http_, body);
  }

  void FinishStream() {
    std::string finish = finish_;
    if (!started_) {
      started_ = true;
      http_->Start(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      if (holding()) {
        Json chunk = Envelope(true);
        Json delta = Message(&finish);
        chunk["choices"] = Json::array({{{"index", 0}, {"delta", delta},
                                         {"logprobs", LogprobsJson(0, logprobs_.size())},
                                         {"finish_reason", nullptr}}});
        http_->Write(Sse(chunk));
      }
    }
    Json last = Envelope(true);
    Json choice = {{"index", 0}};
    if (spec_.chat) {
      choice["delta"] = Json::object();
    } else {
      choice["text"] = "";
    }
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = finish;
    last["choices"] = Json::array({choice});
    http_->Write(Sse(last));
    if (spec_.include_usage) {
      Json usage = Envelope(true);
      usage["choices"] = Json::array();
      usage["usage"] = Usage();
      http_->Write(Sse(usage));
    }
    http_->Write("data: [DONE]\n\n");
    http_->End();
  }

  void Fail(const grpc::Status& status) {
    const HttpError e{HttpStatusFor(status.error_code()), status.error_message(), ""};
    if (!started_) return SendError(*http_, e);
    // Mid-stream: the error as an event, then the end (as vLLM does).
    http_->Write(Sse(Json::parse(ErrorBody(e))));
    http_->Write("data: [DONE]\n\n");
    http_->End();
  }

  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse msg_;
  Spec spec_;
  std::shared_ptr<HttpServer::Stream> http_;
  std::shared_ptr<Guard> guard_;
  std::string id_;
  // gRPC's callbacks for one call do not overlap: no lock needed.
  bool started_ = false;
  std::string text_;
  std::vector<int32_t> token_ids_;
  struct Logprob {
    std::string token;
    float logprob;
    std::vector<std::pair<std::string, float>> top;
    size_t text_offset;
  };
  std::vector<Logprob> logprobs_;  // per output token, when asked
  size_t text_offset_ = 0;
  std::string finish_ = "stop";
  uint32_t prompt_tokens_ = 0, completion_tokens_ = 0;
};

// OpenAI content: a string, null, or parts of which only text is supported.
std::optional<HttpError> FlattenContent(Json* message, size_t index) {
  if (!message->contains("content")) return std::nullopt;
  Json& content = (*message)["content"];
  if (content.is_string() || content.is_null()) return std::nullopt;
  if (!content.is_array()) {
    return Fields::Bad("messages", absl::StrCat("messages[", index, "].content must be a string or a list of parts"));
  }
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
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
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (Json& call : m["tool_calls"]) {
        if (call.contains("function") && call["function"].contains("arguments") &&
            call["function"]["arguments"].is_string()) {
          Json args = Json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
          if (!args.is_discarded()) call["function"]["arguments"] = args;
        }
      }
    }
  }
  return std::nullopt;
}

}  // namespace

OpenAiFrontend::OpenAiFrontend(OpenAiOptions options, WorkerState* state, const Tokenizer* tokenizer,
                               const ChatTemplate* chat_template)
    : options_(std::move(options)),
      state_(state),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      created_(static_cast<int64_t>(std::time(nullptr))) {}

OpenAiFrontend::~OpenAiFrontend() { Stop(); }

absl::Status OpenAiFrontend::Start(grpc::Server* server) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  stub_ = v1::Decode::NewStub(server->InProcessChannel(args));
  auto http = HttpServer::Start(options_.http_address,
                                [this](const HttpServer::Request& r, std::shared_ptr<HttpServer::Stream> s) {
                                  Handle(r, std::move(s));
                                });
  if (!http.ok()) return http.status();
  http_ = *std::move(http);
  const std::string host = options_.http_address.substr(0, options_.http_address.rfind(':'));
  TANDEM_LOG(INFO) << "decode worker: OpenAI API on http://" << host << ":" << http_->port()
                   << "/v1 (model '" << options_.served_model_name << "'"
                   << (chat_template_ != nullptr ? ", chat template from " + chat_template_->origin()
                                                 : ", no chat template")
                   << ")";
  return absl::OkStatus();
}

void OpenAiFrontend::Stop() {
  if (http_ != nullptr) http_->Stop();
}

void OpenAiFrontend::SetModelInfo(int max_model_len, int vocab_size) {
  max_model_len_ = max_model_len;
  vocab_size_ = vocab_size;
}

void OpenAiFrontend::Handle(const HttpServer::Request& request,
                            std::shared_ptr<HttpServer::Stream> stream) {
  const std::string& path = request.path;
  auto only = [&](const char* method) {
    if (request.method == method || (request.method == "HEAD" && std::string(method) == "GET")) return true;
    SendError(*stream, {405, absl::StrCat(path, " takes ", method, ", not ", request.method), ""});
    return false;
  };
  if (path == "/health" || path == "/ping") {
    if (!only("GET")) return;
    const grpc::Status admit = state_->Admit();
    if (!admit.ok() || !state_->upstream_usable.load()) {
      return SendError(*stream, {503, admit.ok() ? "no prefill worker is usable" : admit.error_message(), ""});
    }
    return stream->Respond(200, "application/json", "{}");
  }
  if (path == "/version") {
    if (!only("GET")) return;
    return SendJson(*stream, {{"version", "tandem"}});
  }
  if (path == "/v1/models") {
    if (!only("GET")) return;
    if (max_model_len_.load() == 0) return SendError(*stream, {503, "the model is still loading", ""});
    Json model = {{"id", options_.served_model_name}, {"object", "model"}, {"created", created_},
                  {"owned_by", "tandem"}, {"root", options_.served_model_name},
                  {"max_model_len", max_model_len_.load()}, {"vocab_size", vocab_size_.load()}};
    return SendJson(*stream, {{"object", "list"}, {"data", Json::array({model})}});
  }
  const bool chat = path == "/v1/chat/completions";
  const bool completions = path == "/v1/completions";
  const bool tokenize = path == "/tokenize";
  const bool detokenize = path == "/detokenize";
  if (!chat && !completions && !tokenize && !detokenize) {
    return SendError(*stream, {404, absl::StrCat("no route for ", request.method, " ", path), ""});
  }
  if (!only("POST")) return;
  Json body = Json::parse(request.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    return SendError(*stream, {400, "the request body must be a JSON object", ""});
  }
  if (body.contains("model") && !body["model"].is_null() &&
      body["model"] != Json(options_.served_model_name)) {
    // A name as the client wrote it (not JSON-quoted); anything else as JSON.
    const Json& model = body["model"];
    return SendError(*stream, {404, absl::StrCat("The model `",
                                                 model.is_string() ? model.get<std::string>()
                                                                   : model.dump(),
                                                 "` does not exist; this server serves `",
                                                 options_.served_model_name, "`"),
                               "model"});
  }
  if (detokenize) {
    if (tokenizer_ == nullptr) return SendError(*stream, {400, "this model has no tokenizer", ""});
    if (!body.contains("tokens") || !body["tokens"].is_array()) {
      return SendError(*stream, {400, "tokens must be a list of token ids", "tokens"});
    }
    std::vector<int32_t> ids;
    for (const Json& t : body["tokens"]) {
      if (!t.is_number_integer()) return SendError(*stream, {400, "tokens must be a list of token ids", "tokens"});
      ids.push_back(t.get<int32_t>());
    }
    return SendJson(*stream, {{"prompt", tokenizer_->Decode(ids)}});
  }

  // The prompt: chat messages through the template, or the completion prompt.
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;
  bool has_ids = false;
  if (chat || (tokenize && body.contains("messages"))) {
    if (tokenizer_ == nullptr || chat_template_ == nullptr) {
      return SendError(*stream, {400, tokenizer_ == nullptr
                                          ? "chat needs a tokenizer, and this model has none"
                                          : "this model has no chat template; start the decode "
                                            "worker with --chat-template=FILE",
                                 "messages"});
    }
    Json messages = body.value("messages", Json());
    if (auto e = NormalizeMessages(&messages)) return SendError(*stream, *e);
    Json tools = body.value("tools", Json());
    if (!tools.is_null() && !tools.is_array()) {
      return SendError(*stream, {400, "tools must be a list", "tools"});
    }
    if (body.contains("tool_choice") && body["tool_choice"].is_string() &&
        body["tool_choice"] == "none") {
      tools = nullptr;
    }
    bool add_generation_prompt = true;
    if (auto e = Fields(body).Bool("add_generation_prompt", &add_generation_prompt)) {
      return SendError(*stream, *e);
    }
    Json kwargs = body.value("chat_template_kwargs", Json());
    if (!kwargs.is_null() && !kwargs.is_object()) {
      return SendError(*stream, {400, "chat_template_kwargs must be an object", "chat_template_kwargs"});
    }
    auto rendered = chat_template_->Render(messages, tools, add_generation_prompt, kwargs);
    if (!rendered.ok()) {
      return SendError(*stream, {HttpStatusFor(ToGrpcStatus(rendered.status()).error_code()),
                                 std::string(rendered.status().message()), "messages"});
    }
    // The template writes the special tokens itself (transformers and vLLM
    // tokenize its output without adding any).
    prompt_ids = tokenizer_->Encode(*rendered, /*add_special_tokens=*/false);
    has_ids = true;
  } else {
    const Json& prompt = body.contains("prompt") ? body["prompt"] : Json();
    if (prompt.is_string()) {
      prompt_text = prompt.get<std::string>();
    } else if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) {
      prompt_text = prompt[0].get<std::string>();
    } else if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) {
      for (const Json& t : prompt) {
        if (!t.is_number_integer()) return SendError(*stream, {400, "prompt: a list of token ids holds only integers", "prompt"});
        prompt_ids.push_back(t.get<int32_t>());
      }
      has_ids = true;
    } else {
      return SendError(*stream, {400, "prompt must be a string or a list of token ids (one prompt per request)", "prompt"});
    }
  }
  if (tokenize) {
    if (!has_ids) {
      if (tokenizer_ == nullptr) return SendError(*stream, {400, "this model has no tokenizer", ""});
      bool add_special = true;
      if (auto e = Fields(body).Bool("add_special_tokens", &add_special)) return SendError(*stream, *e);
      prompt_ids = tokenizer_->Encode(prompt_text, add_special);
    }
    return SendJson(*stream, {{"count", prompt_ids.size()}, {"max_model_len", max_model_len_.load()},
                              {"tokens", prompt_ids}});
  }

  v1::GenerateRequest req;
  std::string id = request.Header("X-Request-Id");
  if (id.empty()) id = RandomHex(32);
  req.set_request_id(id);
  const int max_len = max_model_len_.load();
  int64_t default_max = 16;  // OpenAI's for completions
  if (chat) {
    // vLLM's default: what the context has left.
    default_max = std::max<int64_t>(1, max_len - static_cast<int64_t>(prompt_ids.size()));
  }
  CompletionCall::Spec spec;
  spec.chat = chat;
  spec.model = options_.served_model_name;
  spec.created = static_cast<int64_t>(std::time(nullptr));
  spec.prefiller = request.Header(kPrefillerHeader);
  spec.tools = chat && body.contains("tools") && body["tools"].is_array() && !body["tools"].empty() &&
               !(body.contains("tool_choice") && body["tool_choice"] == "none");
  if (auto e = ParseCommon(body, chat, default_max, max_len, &req, &spec.stream, &spec.include_usage)) {
    return SendError(*stream, *e);
  }
  if (auto e = Fields(body).Bool("return_token_ids", &spec.return_token_ids)) {
    return SendError(*stream, *e);
  }
  spec.logprobs = req.sampling().has_logprobs();
  spec.tokenizer = tokenizer_;
  if (!chat) {
    bool echo = false;
    if (auto e = Fields(body).Bool("echo", &echo)) return SendError(*stream, *e);
    if (echo && spec.logprobs) {
      return SendError(*stream, {400, "echo with logprobs (the prompt's log-probabilities) is not "
                                      "supported; send echo or logprobs", "echo"});
    }
    if (echo) {
      if (tokenizer_ == nullptr) return SendError(*stream, {400, "echo needs a tokenizer", "echo"});
      spec.echo = has_ids ? tokenizer_->Decode(prompt_ids) : prompt_text;
    }
  }
  if (has_ids) {
    for (int32_t t : prompt_ids) req.add_prompt_token_ids(t);
  } else {
    req.set_prompt(prompt_text);
  }
  CompletionCall::Run(stub_.get(), std::move(req), std::move(spec), std::move(stream));
}

}  // namespace tandem
