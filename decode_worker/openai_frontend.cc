#include "decode_worker/openai_frontend.h"

#include <algorithm>
#include <ctime>
#include <exception>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "decode_worker/decode_service.h"
#include "decode_worker/openai_request.h"
#include "decode_worker/tool_calls.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

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
  // The request's CompletionSpec and what the server adds.
  struct Spec : CompletionSpec {
    std::string model;
    int64_t created = 0;
    std::string prefiller;  // the gateway's x-prefiller-host-port, passed on
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
    // gRPC's codes are absl's (both the canonical codes).
    const HttpError e{HttpStatusFor(static_cast<absl::StatusCode>(status.error_code())),
                      status.error_message(), ""};
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
  OpenAiRoute route;
  if (path == "/v1/chat/completions") {
    route = OpenAiRoute::kChatCompletions;
  } else if (path == "/v1/completions") {
    route = OpenAiRoute::kCompletions;
  } else if (path == "/tokenize") {
    route = OpenAiRoute::kTokenize;
  } else if (path == "/detokenize") {
    route = OpenAiRoute::kDetokenize;
  } else {
    return SendError(*stream, {404, absl::StrCat("no route for ", request.method, " ", path), ""});
  }
  if (!only("POST")) return;
  OpenAiRequest parsed = ParseOpenAiRequest(
      route, request.body, {options_.served_model_name, max_model_len_.load(), tokenizer_, chat_template_});
  if (parsed.error) return SendError(*stream, *parsed.error);
  if (parsed.reply) return SendJson(*stream, *parsed.reply);
  v1::GenerateRequest req = std::move(parsed.generate);
  std::string id = request.Header("X-Request-Id");
  if (id.empty()) id = RandomHex(32);
  req.set_request_id(id);
  CompletionCall::Spec spec;
  static_cast<CompletionSpec&>(spec) = std::move(parsed.spec);
  spec.model = options_.served_model_name;
  spec.created = static_cast<int64_t>(std::time(nullptr));
  spec.prefiller = request.Header(kPrefillerHeader);
  spec.tokenizer = tokenizer_;
  CompletionCall::Run(stub_.get(), std::move(req), std::move(spec), std::move(stream));
}

}  // namespace tandem
