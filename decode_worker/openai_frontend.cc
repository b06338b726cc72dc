#include "decode_worker/openai_frontend.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <ctime>
#include <exception>
#include <new>
#include <random>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "common/base/thread_pool.h"
#include "common/serving/request_id.h"
#include "decode_worker/decode_service.h"
#include "decode_worker/openai_request.h"
#include "decode_worker/reasoning.h"
#include "decode_worker/tool_calls.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

std::string ErrorType(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "invalid_request_error";
    case 413: return "invalid_request_error";
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
              {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
              {"code", e.code.empty() ? Json(e.status) : Json(e.code)}};
  return Json{{"error", err}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void SendError(HttpServer::Stream& stream, const HttpError& e) {
  std::vector<std::pair<std::string, std::string>> headers;
  if (e.status == 429 || e.status == 503) headers.emplace_back("Retry-After", "1");
  stream.Respond(e.status, "application/json", ErrorBody(e), std::move(headers));
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

// Whether `authorization` is "Bearer KEY" for one of `keys`. Every key's
// bytes are compared in full, so the time taken does not tell how much of a
// guess was right (only, at most, its length).
bool Authorized(const std::string& authorization, const std::vector<std::string>& keys) {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() < kBearer.size() ||
      !std::equal(kBearer.begin(), kBearer.end(), authorization.begin(),
                  [](char a, char b) { return std::tolower(a) == std::tolower(b); })) {
    return false;
  }
  const std::string_view given = std::string_view(authorization).substr(kBearer.size());
  bool match = false;
  for (const std::string& key : keys) {
    unsigned char diff = given.size() == key.size() ? 0 : 1;
    for (size_t i = 0; i < key.size(); ++i) {
      diff |= static_cast<unsigned char>(key[i] ^ (i < given.size() ? given[i] : 0));
    }
    match |= diff == 0;
  }
  return match;
}

// A tool call's id, as OpenAI's look.
std::string NewCallId() { return "call_" + RandomHex(24); }

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\n\r");
  return s.substr(b, e - b + 1);
}

// One completion request: a Generate call on the in-process channel for each
// of its choices (n samples of each prompt), written to the HTTP stream as
// they stream (SSE, each chunk naming its choice) or whole when all are done.
// One failed call fails the request and cancels the others (as vLLM fails a
// parent request); a client that goes away cancels them all.
class Completion {
 public:
  // The request's CompletionSpec and what the server adds.
  struct Spec : CompletionSpec {
    std::string id;  // the response's id
    int64_t created = 0;
    std::string prefiller;  // the gateway's x-prefiller-host-port, passed on
    const Tokenizer* tokenizer = nullptr;  // a token's text in logprobs
    ReasoningParser reasoning = ReasoningParser::kNone;  // chat: split off the reasoning
  };

  // `requests[i]` (with its request id) is choice i. Deletes itself when the
  // last call ends.
  static void Run(v1::Decode::Stub* stub, std::vector<OpenAiChoice> requests, Spec spec,
                  std::shared_ptr<HttpServer::Stream> http) {
    auto* completion = new Completion(std::move(spec), std::move(http));
    std::vector<Call*> calls;
    {
      MutexLock lock(&completion->mu_);
      for (size_t i = 0; i < requests.size(); ++i) {
        completion->choices_.emplace_back(completion->spec_);
        completion->choices_.back().echo = std::move(requests[i].echo);
        completion->choices_.back().counts_prompt = requests[i].counts_prompt;
        calls.push_back(new Call(completion, i, std::move(requests[i].generate)));
      }
      completion->calls_ = calls;
      completion->running_ = calls.size();
    }
    // A client that goes away cancels every call (their KV blocks are freed).
    // The callback runs on the HTTP loop and may outlive the completion.
    auto guard = completion->guard_;
    completion->http_->OnClose([guard] {
      MutexLock lock(&guard->mu);
      if (guard->completion != nullptr) guard->completion->CancelAll();
    });
    for (Call* call : calls) call->Start(stub);
  }

 private:
  // A choice's Generate call; deletes itself when it ends.
  class Call final : public grpc::ClientReadReactor<v1::GenerateResponse> {
   public:
    Call(Completion* parent, size_t index, v1::GenerateRequest request)
        : parent_(parent), index_(index), request_(std::move(request)) {
      if (!parent_->spec_.prefiller.empty()) context_.AddMetadata(kPrefillerHeader, parent_->spec_.prefiller);
    }
    void Start(v1::Decode::Stub* stub) {
      stub->async()->Generate(&context_, &request_, this);
      StartRead(&msg_);
      StartCall();
    }
    void Cancel() { context_.TryCancel(); }
    void OnReadDone(bool ok) override {
      if (!ok) return;  // OnDone follows
      parent_->OnMessage(index_, msg_);
      StartRead(&msg_);
    }
    void OnDone(const grpc::Status& status) override {
      parent_->OnCallDone(index_, status);
      delete this;
    }

   private:
    Completion* parent_;
    const size_t index_;
    grpc::ClientContext context_;
    v1::GenerateRequest request_;
    v1::GenerateResponse msg_;
  };

  struct Guard {
    Mutex mu;
    Completion* completion ABSL_GUARDED_BY(mu) = nullptr;
  };

  struct Logprob {
    std::string token;
    std::optional<float> logprob;  // none: the prompt's first token (echo)
    std::vector<std::pair<std::string, float>> top;
    size_t text_offset;
  };

  // A Responses API function_call item.
  struct CallOut {
    std::string item_id, call_id, name, arguments;
    size_t output_index = 0;
  };

  // What one choice has produced so far.
  struct Choice {
    explicit Choice(const Spec& spec)
        : splitter(spec.reasoning, spec.thinking),
          answer(NewCallId, spec.tool_properties, spec.tool_choice_required) {}
    ReasoningSplitter splitter;  // a streamed reply's reasoning and answer
    ToolCallStream answer;       // with tools offered: the answer, its calls as they come
    std::string call_id;         // a forced named call's, once its first chunk is out
    // Responses API streams: the output items done so far, the text item
    // being streamed ("reasoning" or "message"; none when empty), and the
    // function_call items streamed (done once `calls_done` counts them).
    Json items = Json::array();
    std::string open_kind, open_id, open_text;
    std::vector<CallOut> calls;
    size_t calls_done = 0;
    std::string echo;
    bool counts_prompt = false;
    bool seen = false;  // a message came (its echo is out)
    std::string text;
    std::vector<int32_t> token_ids;
    std::vector<Logprob> logprobs;  // per output token (after the prompt's, with echo), when asked
    Json prompt_logprobs = nullptr;  // vLLM's form, when asked
    size_t text_offset = 0;
    std::string finish = "stop";
    Json stop_reason = nullptr;  // vLLM's (StopReason)
    uint32_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  };

  Completion(Spec spec, std::shared_ptr<HttpServer::Stream> http)
      : spec_(std::move(spec)), http_(std::move(http)), guard_(std::make_shared<Guard>()) {
    MutexLock lock(&guard_->mu);
    guard_->completion = this;
  }

  void CancelAll() {
    MutexLock lock(&mu_);
    for (Call* call : calls_) {
      if (call != nullptr) call->Cancel();
    }
  }

  void OnMessage(size_t index, const v1::GenerateResponse& message) {
    MutexLock lock(&mu_);
    if (failure_) return;
    // vLLM's echo with max_tokens 0: one token is generated (the engine's
    // least) and left out of the reply, which is the prompt alone.
    v1::GenerateResponse prompt_only;
    if (spec_.echo_only) {
      prompt_only = message;
      prompt_only.clear_token_ids();
      prompt_only.clear_text();
      prompt_only.clear_logprobs();
      prompt_only.mutable_usage()->set_completion_tokens(0);
    }
    const v1::GenerateResponse& m = spec_.echo_only ? prompt_only : message;
    Choice& c = choices_[index];
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      c.finish = m.finish_reason() == v1::FINISH_REASON_LENGTH ? "length" : "stop";
      c.prompt_tokens = m.usage().prompt_tokens();
      c.cached_tokens = m.usage().cached_tokens();
      c.completion_tokens = m.usage().completion_tokens();
    }
    c.text += m.text();
    c.token_ids.insert(c.token_ids.end(), m.token_ids().begin(), m.token_ids().end());
    if (m.finish_reason() == v1::FINISH_REASON_STOP) c.stop_reason = StopReason(m, c);
    const size_t echoed = c.logprobs.size();
    if (m.prompt_token_ids_size() > 0) AddPromptLogprobs(&c, m);
    if (spec_.logprobs) {
      for (int i = 0; i < m.token_ids_size(); ++i) {
        const v1::TokenLogprobs none;
        AddLogprobs(&c, m.token_ids(i), i < m.logprobs_size() ? &m.logprobs(i) : &none);
      }
    }
    if (!spec_.stream) return;
    EnsureStarted();
    if (!c.seen) {
      c.seen = true;
      // With logprobs, the echoed prompt's lead (this message brought them).
      const size_t output_begin = c.logprobs.size() - (spec_.logprobs ? m.token_ids_size() : 0);
      if (!c.echo.empty()) {
        WriteDelta(index, c.echo, {},
                   spec_.echo_logprobs ? LogprobsJson(c, echoed, output_begin) : Json(nullptr));
      }
    }
    // A chunk per message that carries tokens, even when their text is not
    // out yet (an incomplete character; a model without a tokenizer): the
    // client sees every step. Its token ids go with it on request (vLLM's
    // return_token_ids) or when there is no text.
    if (!m.text().empty() || m.token_ids_size() > 0) {
      std::vector<int32_t> ids;
      if (spec_.return_token_ids || m.text().empty()) ids.assign(m.token_ids().begin(), m.token_ids().end());
      ReasoningSplitter::Parts parts = c.splitter.Add(m.text());
      ToolCallStream::Out answer;
      if (!spec_.forced_function.empty()) {
        // A forced named call: the answer is its arguments, as they come.
        answer.calls.push_back({0, c.call_id.empty() ? c.call_id = NewCallId() : "", spec_.forced_function,
                                std::move(parts.content)});
        parts.content.clear();
      } else if (spec_.tools) {
        answer = c.answer.Add(parts.content);
        parts.content = std::move(answer.content);
        Allowed(&answer.calls);
      }
      if (spec_.responses) {
        StreamText(index, "reasoning", parts.reasoning);
        StreamText(index, "message", parts.content);
        return StreamCalls(index, answer.calls);
      }
      if (!spec_.forced_function.empty()) {
        if (!parts.reasoning.empty()) WriteDelta(index, "", {}, nullptr, parts.reasoning);
        // Every message has its chunk, an empty piece of arguments too.
        return WriteChunk(index, "delta", {{"tool_calls", ToolCallPiecesJson(answer.calls)}},
                          LogprobsJson(c, c.logprobs.size() - m.token_ids_size(), c.logprobs.size()), ids);
      }
      WriteDelta(index, parts.content, ids,
                 LogprobsJson(c, c.logprobs.size() - m.token_ids_size(), c.logprobs.size()),
                 parts.reasoning, answer.calls);
    }
  }

  void OnCallDone(size_t index, const grpc::Status& status) {
    bool last = false;
    {
      MutexLock lock(&mu_);
      calls_[index] = nullptr;
      if (!status.ok() && !failure_) {
        failure_ = status;
        for (Call* call : calls_) {
          if (call != nullptr) call->Cancel();
        }
      }
      if (status.ok() && !failure_ && spec_.stream) FinishChoiceStream(index);
      last = --running_ == 0;
      if (last) {
        if (failure_) {
          Fail(*failure_);
        } else if (spec_.stream) {
          FinishStream();
        } else {
          FinishWhole();
        }
      }
    }
    if (!last) return;
    {
      MutexLock lock(&guard_->mu);
      guard_->completion = nullptr;
    }
    delete this;
  }

  Json Envelope(bool chunk) const {
    return {{"id", spec_.id},
            {"object", spec_.chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                  : "text_completion"},
            {"created", spec_.created},
            {"model", spec_.model}};
  }

  // The SSE response's start and, for chat, each choice's role (as vLLM
  // sends them, all at once).
  void EnsureStarted() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (started_) return;
    started_ = true;
    http_->Start(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    if (spec_.responses) {
      const Json response = ResponseJson("in_progress", Json::array());
      Event("response.created", {{"response", response}});
      Event("response.in_progress", {{"response", response}});
      return;
    }
    if (!spec_.chat) return;
    for (size_t i = 0; i < choices_.size(); ++i) {
      Json first = Envelope(true);
      first["choices"] = Json::array({{{"index", i},
                                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                                       {"logprobs", nullptr},
                                       {"finish_reason", nullptr}}});
      http_->Write(Sse(first));
    }
  }

  // A token as logprobs show it: its text (invalid UTF-8 replaced), or
  // vLLM's "token_id:N" without a tokenizer or when the request asks
  // (return_tokens_as_token_ids).
  std::string TokenText(int32_t id) const {
    return spec_.tokens_as_ids ? absl::StrCat("token_id:", id) : DecodedToken(id);
  }
  // prompt_logprobs' decoded_token: the text whatever the request asked, as
  // vLLM's.
  std::string DecodedToken(int32_t id) const {
    return spec_.tokenizer != nullptr ? spec_.tokenizer->Decode({id})
                                      : absl::StrCat("token_id:", id);
  }

  // vLLM's stop_reason: the stop string that ended the choice, or the stop
  // id other than the eos token (a stop_token_ids id, or another of the
  // model's end ids, which vLLM adds to stop_token_ids); null for the eos
  // token, as vLLM's check_stop leaves it.
  Json StopReason(const v1::GenerateResponse& m, const Choice& c) const {
    if (!m.stop_string().empty()) return m.stop_string();
    if (c.token_ids.empty()) return nullptr;
    const int32_t last = c.token_ids.back();
    if (last == spec_.eos_token_id && !spec_.ignore_eos) return nullptr;
    return last;
  }

  // vLLM's floor for a logprob: JSON cannot hold (-inf).
  static float Finite(float x) { return std::max(x, -9999.f); }

  // `lp` null: the prompt's first token, which has none.
  void AddLogprobs(Choice* c, int32_t id, const v1::TokenLogprobs* lp) const {
    Logprob entry{TokenText(id), std::nullopt, {}, c->text_offset};
    if (lp != nullptr) {
      entry.logprob = Finite(lp->logprob());
      for (int i = 0; i < std::min(lp->top_token_ids_size(), lp->top_logprobs_size()); ++i) {
        entry.top.emplace_back(TokenText(lp->top_token_ids(i)), Finite(lp->top_logprobs(i)));
      }
    }
    // Completions' text_offset counts characters, as Python's len() does.
    for (char ch : entry.token) c->text_offset += (static_cast<uint8_t>(ch) & 0xC0) != 0x80;
    c->logprobs.push_back(std::move(entry));
  }

  // The prompt's logprobs, on the message that brings them: vLLM's
  // `prompt_logprobs` (null for the first token, then {id: {logprob, rank,
  // decoded_token}} for the token and the most likely ones) and, with echo,
  // the entries that lead the choice's logprobs.
  void AddPromptLogprobs(Choice* c, const v1::GenerateResponse& m) const {
    c->prompt_logprobs = Json::array({nullptr});
    for (int i = 1; i < m.prompt_token_ids_size() && i - 1 < m.prompt_logprobs_size(); ++i) {
      const v1::TokenLogprobs& lp = m.prompt_logprobs(i - 1);
      Json entry = Json::object();
      auto add = [&](int32_t id, float logprob, int rank) {
        const std::string key = std::to_string(id);
        if (entry.contains(key)) return;
        entry[key] = {{"logprob", Finite(logprob)}, {"rank", rank}, {"decoded_token", DecodedToken(id)}};
      };
      add(m.prompt_token_ids(i), lp.logprob(), lp.rank());
      for (int k = 0; k < std::min(lp.top_token_ids_size(), lp.top_logprobs_size()); ++k) {
        add(lp.top_token_ids(k), lp.top_logprobs(k), k + 1);
      }
      c->prompt_logprobs.push_back(std::move(entry));
    }
    if (!spec_.echo_logprobs) return;
    for (int i = 0; i < m.prompt_token_ids_size(); ++i) {
      AddLogprobs(c, m.prompt_token_ids(i),
                  i > 0 && i - 1 < m.prompt_logprobs_size() ? &m.prompt_logprobs(i - 1) : nullptr);
    }
  }

  // A choice's `logprobs` for output tokens [begin, end): OpenAI's chat form
  // ({"content": [...]}, each entry's top_logprobs the n most likely) or the
  // completions form (parallel lists, each top_logprobs a dict that also
  // holds the sampled token); null when the request did not ask.
  Json LogprobsJson(const Choice& c, size_t begin, size_t end) const {
    if (!spec_.logprobs) return nullptr;
    auto bytes = [](const std::string& t) {
      Json b = Json::array();
      for (char ch : t) b.push_back(static_cast<uint8_t>(ch));
      return b;
    };
    if (spec_.chat) {
      Json content = Json::array();
      for (size_t i = begin; i < end && i < c.logprobs.size(); ++i) {
        const Logprob& e = c.logprobs[i];
        Json top = Json::array();
        for (const auto& [token, logprob] : e.top) {
          top.push_back({{"token", token}, {"logprob", logprob}, {"bytes", bytes(token)}});
        }
        content.push_back({{"token", e.token}, {"logprob", e.logprob.value_or(0.f)}, {"bytes", bytes(e.token)},
                           {"top_logprobs", top}});
      }
      return {{"content", content}};
    }
    Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
         offsets = Json::array();
    for (size_t i = begin; i < end && i < c.logprobs.size(); ++i) {
      const Logprob& e = c.logprobs[i];
      tokens.push_back(e.token);
      offsets.push_back(e.text_offset);
      if (!e.logprob.has_value()) {  // the echoed prompt's first token
        token_logprobs.push_back(nullptr);
        top.push_back(nullptr);
        continue;
      }
      token_logprobs.push_back(*e.logprob);
      Json dict = Json::object();
      for (const auto& [token, logprob] : e.top) dict[token] = logprob;
      dict[e.token] = *e.logprob;
      top.push_back(dict);
    }
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top},
            {"text_offset", offsets}};
  }

  // A chunk of choice `index`: its new text (and, for chat, reasoning and
  // pieces of tool calls).
  void WriteDelta(size_t index, const std::string& text, const std::vector<int32_t>& token_ids = {},
                  Json logprobs = nullptr, const std::string& reasoning = "",
                  const std::vector<ToolCallPiece>& calls = {}) {
    if (!spec_.chat) return WriteChunk(index, "text", text, std::move(logprobs), token_ids);
    Json delta = Json::object();
    SetReasoning(&delta, reasoning);
    if (!text.empty() || (reasoning.empty() && calls.empty())) delta["content"] = text;
    if (!calls.empty()) delta["tool_calls"] = ToolCallPiecesJson(calls);
    WriteChunk(index, "delta", std::move(delta), std::move(logprobs), token_ids);
  }

  // A chunk of choice `index` whose `key` ("delta" for chat, "text") is `value`.
  void WriteChunk(size_t index, const char* key, Json value, Json logprobs,
                  const std::vector<int32_t>& token_ids = {}) {
    Json chunk = Envelope(true);
    Json choice = {{"index", index}, {key, std::move(value)}};
    if (!token_ids.empty()) choice["token_ids"] = token_ids;
    choice["logprobs"] = std::move(logprobs);
    choice["finish_reason"] = nullptr;
    chunk["choices"] = Json::array({std::move(choice)});
    http_->Write(Sse(chunk));
  }

  // parallel_tool_calls false: the pieces of a reply's first call only.
  void Allowed(std::vector<ToolCallPiece>* pieces) const {
    if (spec_.parallel_tool_calls) return;
    pieces->erase(std::remove_if(pieces->begin(), pieces->end(),
                                 [](const ToolCallPiece& p) { return p.index > 0; }),
                  pieces->end());
  }

  // Usage over every choice, each prompt counted once, with OpenAI's
  // prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache
  // served (vLLM's, with --enable-prompt-tokens-details).
  Json Usage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t prompt = 0, completion = 0, cached = 0;
    for (const Choice& c : choices_) {
      if (c.counts_prompt) {
        prompt += c.prompt_tokens;
        cached += c.cached_tokens;
      }
      completion += c.completion_tokens;
    }
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion},
            {"total_tokens", prompt + completion}, {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  // vLLM's `reasoning`, and `reasoning_content` (its earlier name, which
  // many clients still read), when there is any.
  static void SetReasoning(Json* message, const std::string& reasoning) {
    if (reasoning.empty()) return;
    (*message)["reasoning"] = reasoning;
    (*message)["reasoning_content"] = reasoning;
  }

  // A choice's message: its reasoning, and content or tool calls when the
  // request offered tools (looked for in the answer, not the reasoning).
  Json Message(const Choice& c, std::string* finish) const {
    Json message = {{"role", "assistant"}};
    const ReasoningSplitter::Parts parts = ReasoningSplitter::Split(spec_.reasoning, spec_.thinking, c.text);
    SetReasoning(&message, parts.reasoning);
    if (!spec_.forced_function.empty() || spec_.tool_choice_required) {
      // A forced call (vLLM's named and required tool_choice): the reply was
      // held to the tools' schemas; content "", finish_reason unchanged.
      Json calls =
          spec_.forced_function.empty()
              ? ParseToolCallList(parts.content, NewCallId)
              : Json::array({{{"id", NewCallId()}, {"type", "function"},
                              {"function", {{"name", spec_.forced_function}, {"arguments", parts.content}}}}});
      if (!calls.empty()) {
        if (!spec_.parallel_tool_calls) calls.erase(calls.begin() + 1, calls.end());
        message["content"] = "";
        message["tool_calls"] = calls;
        return message;
      }
    }
    std::string rest;
    Json calls = spec_.tools ? ParseToolCalls(parts.content, &rest, NewCallId, spec_.tool_properties)
                             : Json::array();
    if (!calls.empty()) {
      if (!spec_.parallel_tool_calls) calls.erase(calls.begin() + 1, calls.end());
      const std::string content = Trim(rest);
      message["content"] = content.empty() ? Json(nullptr) : Json(content);
      message["tool_calls"] = calls;
      *finish = "tool_calls";
    } else {
      // With a parser, an answer that never came is null (as vLLM's).
      message["content"] = parts.content.empty() && spec_.reasoning != ReasoningParser::kNone
                               ? Json(nullptr)
                               : Json(parts.content);
    }
    return message;
  }

  void FinishWhole() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (spec_.responses) {
      const Choice& c = choices_[0];
      std::string finish = c.finish;
      const Json message = Message(c, &finish);
      Json items = Json::array();
      if (message.contains("reasoning")) {
        items.push_back(TextItem("reasoning", NewItemId("rs_"), message["reasoning"], "completed"));
      }
      if (message["content"].is_string() && !message["content"].get<std::string>().empty()) {
        items.push_back(TextItem("message", NewItemId("msg_"), message["content"], "completed"));
      }
      if (message.contains("tool_calls")) {
        for (const ToolCallPiece& call : WholeCallPieces(message["tool_calls"])) {
          items.push_back(CallItem({NewItemId("fc_"), call.id, call.name, call.arguments}));
        }
      }
      return SendJson(*http_, ResponseJson(c.finish == "length" ? "incomplete" : "completed", items));
    }
    Json body = Envelope(false);
    body["choices"] = Json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      std::string finish = c.finish;
      Json choice = {{"index", i}};
      if (spec_.chat) {
        choice["message"] = Message(c, &finish);
      } else {
        choice["text"] = c.echo + c.text;
      }
      if (spec_.return_token_ids) choice["token_ids"] = c.token_ids;
      choice["logprobs"] = LogprobsJson(c, 0, c.logprobs.size());
      choice["finish_reason"] = finish;
      choice["stop_reason"] = c.stop_reason;
      if (!spec_.chat && (spec_.prompt_logprobs || spec_.echo_logprobs)) {
        choice["prompt_logprobs"] = c.prompt_logprobs;
      }
      body["choices"].push_back(std::move(choice));
    }
    // vLLM's chat response carries them once, beside the choices.
    if (spec_.chat && spec_.prompt_logprobs) body["prompt_logprobs"] = choices_[0].prompt_logprobs;
    body["usage"] = Usage();
    SendJson(*http_, body);
  }

  // A streamed choice's end: what was held back (a tool call), then its
  // finish_reason.
  void FinishChoiceStream(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    EnsureStarted();
    if (spec_.responses) return FinishResponseItems(index);
    Choice& c = choices_[index];
    std::string finish = c.finish;
    // Reasoning held back in case it ended in a tag.
    const ReasoningSplitter::Parts rest = c.splitter.Finish();
    if (!rest.reasoning.empty()) WriteDelta(index, "", {}, nullptr, rest.reasoning);
    if (spec_.tools && spec_.chat && spec_.forced_function.empty()) FinishAnswer(index, &finish);
    Json last = Envelope(true);
    Json choice = {{"index", index}};
    if (spec_.chat) {
      choice["delta"] = Json::object();
    } else {
      choice["text"] = "";
    }
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = finish;
    choice["stop_reason"] = c.stop_reason;
    last["choices"] = Json::array({choice});
    http_->Write(Sse(last));
  }

  // A streamed answer's end with tools offered: what of its calls has not
  // gone out, with the text outside them that has not, or (no call after
  // all) what was held.
  void FinishAnswer(size_t index, std::string* finish) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Choice& c = choices_[index];
    const Json message = Message(c, finish);
    if (!message.contains("tool_calls")) {
      if (!c.answer.held().empty()) WriteDelta(index, std::string(c.answer.held()));
      return;
    }
    Json delta = Json::object();
    if (const std::string rest = UnsentOutsideCalls(c, message); !rest.empty()) delta["content"] = rest;
    std::vector<ToolCallPiece> pieces = c.answer.Finish(message["tool_calls"]);
    Allowed(&pieces);
    if (!pieces.empty()) delta["tool_calls"] = ToolCallPiecesJson(pieces);
    if (!delta.empty()) WriteChunk(index, "delta", std::move(delta), nullptr);
  }

  // With tools offered, the text outside the calls of `message` (Message's,
  // trimmed as a whole reply's) that has not gone out: past what the
  // answer's stream released, itself without the blanks it began with.
  static std::string UnsentOutsideCalls(const Choice& c, const Json& message) {
    if (!message["content"].is_string()) return "";
    const std::string sent = Trim(std::string(c.answer.released()));
    const std::string content = message["content"].get<std::string>();
    if (content.size() > sent.size() && content.compare(0, sent.size(), sent) == 0) {
      return content.substr(sent.size());
    }
    return "";
  }

  // The Responses API (a request on /v1/responses, one choice).
  static std::string NewItemId(const char* prefix) { return prefix + RandomHex(24); }

  // An output item of text: reasoning (its reasoning_text) or the
  // assistant's message (its output_text); no text while it is in progress.
  static Json TextItem(const std::string& kind, const std::string& id, const Json& text,
                       const char* status) {
    const bool reasoning = kind == "reasoning";
    Json content = Json::array();
    if (!text.is_null()) {
      content.push_back(reasoning ? Json{{"type", "reasoning_text"}, {"text", text}}
                                  : Json{{"type", "output_text"}, {"text", text},
                                         {"annotations", Json::array()}, {"logprobs", Json::array()}});
    }
    if (reasoning) {
      return {{"type", "reasoning"}, {"id", id}, {"summary", Json::array()}, {"content", content},
              {"status", status}};
    }
    return {{"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"},
            {"content", content}};
  }

  // A function_call item, done.
  static Json CallItem(const CallOut& call) {
    return {{"type", "function_call"}, {"id", call.item_id}, {"call_id", call.call_id},
            {"name", call.name}, {"arguments", call.arguments}, {"status", "completed"}};
  }

  Json ResponseJson(const char* status, const Json& output) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const bool done = std::string(status) != "in_progress";
    const Json usage = Usage();
    return {{"id", spec_.id},
            {"object", "response"},
            {"created_at", spec_.created},
            {"status", status},
            {"model", spec_.model},
            {"output", output},
            {"error", nullptr},
            {"incomplete_details", std::string(status) == "incomplete"
                                       ? Json{{"reason", "max_output_tokens"}}
                                       : Json(nullptr)},
            {"instructions", nullptr},
            {"metadata", Json::object()},
            {"parallel_tool_calls", spec_.parallel_tool_calls},
            {"tool_choice", "auto"},
            {"tools", Json::array()},
            {"usage", done ? Json{{"input_tokens", usage["prompt_tokens"]},
                                  {"input_tokens_details", usage["prompt_tokens_details"]},
                                  {"output_tokens", usage["completion_tokens"]},
                                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                                  {"total_tokens", usage["total_tokens"]}}
                           : Json(nullptr)}};
  }

  // One server-sent event of the Responses API: its type, its number in the
  // stream, then `fields`.
  void Event(const char* type, const Json& fields) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Json event = {{"type", type}, {"sequence_number", sequence_++}};
    for (const auto& [key, value] : fields.items()) event[key] = value;
    http_->Write(absl::StrCat("event: ", type, "\n", Sse(event)));
  }

  // `delta` of a text item of `kind` ("reasoning" or "message"): the item
  // and its part opened first when another kind (or none) was streaming.
  void StreamText(size_t index, const std::string& kind, const std::string& delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (delta.empty()) return;
    Choice& c = choices_[index];
    const size_t output_index = c.items.size();
    const bool reasoning = kind == "reasoning";
    if (c.open_kind != kind) {
      CloseText(index);
      c.open_kind = kind;
      c.open_id = NewItemId(reasoning ? "rs_" : "msg_");
      c.open_text.clear();
      Event("response.output_item.added",
            {{"output_index", output_index}, {"item", TextItem(kind, c.open_id, nullptr, "in_progress")}});
      Event("response.content_part.added",
            {{"item_id", c.open_id}, {"output_index", output_index}, {"content_index", 0},
             {"part", TextItem(kind, c.open_id, "", "in_progress")["content"][0]}});
    }
    c.open_text += delta;
    Json fields = {{"item_id", c.open_id}, {"output_index", output_index}, {"content_index", 0},
                   {"delta", delta}};
    if (!reasoning) fields["logprobs"] = Json::array();
    Event(reasoning ? "response.reasoning_text.delta" : "response.output_text.delta", fields);
  }

  // The streaming text item's end: its text, its part and the item done.
  void CloseText(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Choice& c = choices_[index];
    if (c.open_kind.empty()) return;
    const bool reasoning = c.open_kind == "reasoning";
    const size_t output_index = c.items.size();
    const Json item = TextItem(c.open_kind, c.open_id, c.open_text, "completed");
    Json fields = {{"item_id", c.open_id}, {"output_index", output_index}, {"content_index", 0},
                   {"text", c.open_text}};
    if (!reasoning) fields["logprobs"] = Json::array();
    Event(reasoning ? "response.reasoning_text.done" : "response.output_text.done", fields);
    Event("response.content_part.done", {{"item_id", c.open_id}, {"output_index", output_index},
                                         {"content_index", 0}, {"part", item["content"][0]}});
    Event("response.output_item.done", {{"output_index", output_index}, {"item", item}});
    c.items.push_back(item);
    c.open_kind.clear();
  }

  // A streamed response's last items: reasoning held back, then (with
  // tools) what of the calls has not gone out and the calls' items done,
  // then the text outside them not yet out, or (no call after all) the text
  // held where a call may have begun.
  void FinishResponseItems(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Choice& c = choices_[index];
    std::string finish = c.finish;
    StreamText(index, "reasoning", c.splitter.Finish().reasoning);
    if (!spec_.forced_function.empty()) {  // its arguments went out as they came
      if (c.call_id.empty()) StreamCalls(index, WholeCallPieces(Message(c, &finish)["tool_calls"]));
      CloseText(index);
      return CloseCalls(index);
    }
    if (spec_.tools) {
      const Json message = Message(c, &finish);
      const bool calls = message.contains("tool_calls");
      if (calls) {
        std::vector<ToolCallPiece> pieces = c.answer.Finish(message["tool_calls"]);
        Allowed(&pieces);
        StreamCalls(index, pieces);
      }
      CloseCalls(index);
      StreamText(index, "message", calls ? UnsentOutsideCalls(c, message) : std::string(c.answer.held()));
    }
    CloseText(index);
  }

  // Pieces of tool calls as function_call items: a call's first piece adds
  // its item (the text item before it done), each piece's arguments a delta.
  void StreamCalls(size_t index, const std::vector<ToolCallPiece>& pieces) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Choice& c = choices_[index];
    for (const ToolCallPiece& piece : pieces) {
      if (!piece.id.empty()) {
        CloseText(index);
        c.calls.push_back({NewItemId("fc_"), piece.id, piece.name, "", c.items.size() + c.calls.size() - c.calls_done});
        Json added = CallItem(c.calls.back());
        added["status"] = "in_progress";
        Event("response.output_item.added", {{"output_index", c.calls.back().output_index}, {"item", added}});
      }
      if (piece.arguments.empty() || piece.index >= c.calls.size()) continue;
      CallOut& call = c.calls[piece.index];
      call.arguments += piece.arguments;
      Event("response.function_call_arguments.delta",
            {{"item_id", call.item_id}, {"output_index", call.output_index}, {"delta", piece.arguments}});
    }
  }

  // The streamed function_call items done, in order.
  void CloseCalls(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Choice& c = choices_[index];
    for (; c.calls_done < c.calls.size(); ++c.calls_done) {
      const CallOut& call = c.calls[c.calls_done];
      Event("response.function_call_arguments.done",
            {{"item_id", call.item_id}, {"output_index", call.output_index}, {"name", call.name},
             {"arguments", call.arguments}});
      const Json item = CallItem(call);
      Event("response.output_item.done", {{"output_index", call.output_index}, {"item", item}});
      c.items.push_back(item);
    }
  }

  void FinishStream() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    EnsureStarted();
    if (spec_.responses) {
      const Choice& c = choices_[0];
      const bool incomplete = c.finish == "length";
      Event(incomplete ? "response.incomplete" : "response.completed",
            {{"response", ResponseJson(incomplete ? "incomplete" : "completed", c.items)}});
      return http_->End();
    }
    if (spec_.include_usage) {
      Json usage = Envelope(true);
      usage["choices"] = Json::array();
      usage["usage"] = Usage();
      http_->Write(Sse(usage));
    }
    http_->Write("data: [DONE]\n\n");
    http_->End();
  }

  void Fail(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // gRPC's codes are absl's (both the canonical codes).
    const HttpError e{HttpStatusFor(static_cast<absl::StatusCode>(status.error_code())),
                      status.error_message(), ""};
    if (!started_) return SendError(*http_, e);
    if (spec_.responses) {  // the Responses API's error event
      Event("error", {{"code", absl::StrCat(e.status)}, {"message", e.message}, {"param", nullptr}});
      return http_->End();
    }
    // Mid-stream: the error as an event, then the end (as vLLM does).
    http_->Write(Sse(Json::parse(ErrorBody(e))));
    http_->Write("data: [DONE]\n\n");
    http_->End();
  }

  const Spec spec_;
  std::shared_ptr<HttpServer::Stream> http_;
  std::shared_ptr<Guard> guard_;
  // The calls' callbacks come on gRPC's threads, several at once.
  Mutex mu_;
  std::vector<Call*> calls_ ABSL_GUARDED_BY(mu_);  // null once a call is done
  std::vector<Choice> choices_ ABSL_GUARDED_BY(mu_);
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<grpc::Status> failure_ ABSL_GUARDED_BY(mu_);  // the first call that failed
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  int64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;  // Responses API events sent
};

}  // namespace

OpenAiFrontend::OpenAiFrontend(OpenAiOptions options, WorkerState* state, const Tokenizer* tokenizer,
                               const ChatTemplate* chat_template)
    : options_(std::move(options)),
      state_(state),
      tokenizer_(tokenizer),
      chat_template_(chat_template),
      created_(static_cast<int64_t>(std::time(nullptr))) {
  if (tokenizer_ != nullptr) {
    for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
      max_token_bytes_ = std::max(max_token_bytes_, tokenizer_->TokenBytes(id).size());
    }
  }
}

OpenAiFrontend::~OpenAiFrontend() { Stop(); }

absl::Status OpenAiFrontend::Start(grpc::Server* server) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  // A request's prompt is checked against max_model_len before it is sent,
  // so what crosses this channel is bounded by the model, not by gRPC's
  // default 4 MiB (a refusal there would read as RESOURCE_EXHAUSTED: 429).
  args.SetMaxSendMessageSize(-1);
  stub_ = v1::Decode::NewStub(server->InProcessChannel(args));
  const int threads = options_.api_threads > 0 ? options_.api_threads
                                               : std::min(4, ThreadPool::AvailableCpus());
  work_ = std::make_unique<WorkQueue>(threads, options_.api_queue, "--api-queue", options_.api_priority);
  auto http = HttpServer::Start(options_.http_address,
                                [this](HttpServer::Request r, std::shared_ptr<HttpServer::Stream> s) {
                                  Handle(std::move(r), std::move(s));
                                },
                                options_.http_limits);
  if (!http.ok()) return http.status();
  http_ = *std::move(http);
  const std::string host = options_.http_address.substr(0, options_.http_address.rfind(':'));
  TANDEM_LOG(INFO) << "decode worker: OpenAI API on http://" << host << ":" << http_->port()
                   << "/v1 (model '" << options_.served_model_name << "'"
                   << (chat_template_ != nullptr ? ", chat template from " + chat_template_->origin()
                                                 : ", no chat template")
                   << (options_.api_keys.empty() ? "" : ", an API key required on /v1/") << "; "
                   << threads << " parsing thread(s), " << options_.api_queue << " may wait)";
  return absl::OkStatus();
}

void OpenAiFrontend::Stop() {
  if (http_ != nullptr) http_->Stop();
  work_.reset();  // what waits still runs: its stream is closed, its calls end at once
}

void OpenAiFrontend::SetModelInfo(int max_model_len, int vocab_size) {
  max_model_len_ = max_model_len;
  vocab_size_ = vocab_size;
}

// One served model's entry in /v1/models (`parent`: an adapter's base).
Json OpenAiFrontend::ModelCard(const std::string& name, const std::string& parent) const {
  Json card = {{"id", name}, {"object", "model"}, {"created", created_}, {"owned_by", "tandem"},
               {"root", parent.empty() ? options_.served_model_name : name}};
  if (!parent.empty()) card["parent"] = parent;
  card["max_model_len"] = max_model_len_.load();
  card["vocab_size"] = vocab_size_.load();
  return card;
}

void OpenAiFrontend::Handle(HttpServer::Request request, std::shared_ptr<HttpServer::Stream> stream) {
  const std::string& path = request.path;
  auto only = [&](const char* method) {
    if (request.method == method || (request.method == "HEAD" && std::string(method) == "GET")) return true;
    SendError(*stream, {405, absl::StrCat(EchoClientText(path), " takes ", method, ", not ",
                                          EchoClientText(request.method)), ""});
    return false;
  };
  // vLLM asks for the key on every route but the probes and metrics.
  const bool open_route = path == "/health" || path == "/ping" || path == "/version" || path == "/metrics";
  if (!options_.api_keys.empty() && request.method != "OPTIONS" && !open_route &&
      !Authorized(request.Header("Authorization"), options_.api_keys)) {
    return SendError(*stream, {401, "a missing or wrong API key: send `Authorization: Bearer KEY` "
                                    "with a key this server was started with (--api-key)", ""});
  }
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
  if (path == "/metrics" && options_.metrics_text) {
    if (!only("GET")) return;
    return stream->Respond(200, "text/plain; version=0.0.4", options_.metrics_text());
  }
  if (path == "/v1/models" || absl::StartsWith(path, "/v1/models/")) {
    if (!only("GET")) return;
    if (max_model_len_.load() == 0) return SendError(*stream, {503, "the model is still loading", ""});
    // Each served name (vLLM lists them all), the first the model's own.
    std::vector<std::string> names = {options_.served_model_name};
    names.insert(names.end(), options_.model_aliases.begin(), options_.model_aliases.end());
    const std::vector<std::string> adapters = LoraAdapters();
    if (path != "/v1/models") {  // GET /v1/models/{id}: that model alone
      const std::string id = path.substr(strlen("/v1/models/"));
      if (absl::c_linear_search(names, id)) return SendJson(*stream, ModelCard(id, ""));
      if (absl::c_linear_search(adapters, id)) return SendJson(*stream, ModelCard(id, options_.served_model_name));
      return SendError(*stream, {404, absl::StrCat("The model `", EchoClientText(id), "` does not exist"), "model"});
    }
    Json data = Json::array();
    for (const std::string& name : names) data.push_back(ModelCard(name, ""));
    for (const std::string& name : adapters) data.push_back(ModelCard(name, options_.served_model_name));
    return SendJson(*stream, {{"object", "list"}, {"data", data}});
  }
  if (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter") {
    if (!only("POST")) return;
    return UpdateLora(path == "/v1/load_lora_adapter", request, std::move(stream));
  }
  OpenAiRoute route;
  if (path == "/v1/chat/completions") {
    route = OpenAiRoute::kChatCompletions;
  } else if (path == "/v1/responses") {
    route = OpenAiRoute::kResponses;
  } else if (path == "/v1/completions") {
    route = OpenAiRoute::kCompletions;
  } else if (path == "/tokenize") {
    route = OpenAiRoute::kTokenize;
  } else if (path == "/detokenize") {
    route = OpenAiRoute::kDetokenize;
  } else {
    return SendError(*stream, {404, absl::StrCat("no route for ", EchoClientText(request.method), " ",
                                                 EchoClientText(path)), ""});
  }
  if (!only("POST")) return;
  // What is forwarded (the request id into every call and reply, the
  // gateway's prefiller into gRPC metadata) is checked before anything
  // else: gRPC aborts on a metadata value it cannot send.
  for (const char* header : {"X-Request-Id", kPrefillerHeader}) {
    if (absl::Status s = CheckHeaderValue(header, request.Header(header)); !s.ok()) {
      return SendError(*stream, {400, std::string(s.message()), header});
    }
  }
  if ((route == OpenAiRoute::kTokenize || route == OpenAiRoute::kDetokenize) &&
      request.body.size() > options_.max_tokenize_bytes) {
    return SendError(*stream, {413, absl::StrCat(path, ": the body has ", request.body.size(),
                                                 " bytes; the limit is ", options_.max_tokenize_bytes,
                                                 " (--max-tokenize-bytes)"), ""});
  }
  // Off the loop: the body may take seconds to parse, render and tokenize.
  auto task = [this, route, request = std::make_shared<HttpServer::Request>(std::move(request)), stream] {
    Process(route, *request, stream);
  };
  if (absl::Status s = work_->Post(std::move(task)); !s.ok()) {
    return SendError(*stream, {429, std::string(s.message()), ""});
  }
}

void OpenAiFrontend::Process(OpenAiRoute route, const HttpServer::Request& request,
                             std::shared_ptr<HttpServer::Stream> stream) {
  // An exception out of a WorkQueue task would end the process, and every
  // request in flight with it: this request fails instead. Handlers are
  // written not to throw (fuzz/openai_request_fuzzer.cc); this is the net.
  try {
    Prepare(route, request, stream);
  } catch (const std::bad_alloc&) {
    // A body or template that asks for more memory than there is.
    SendError(*stream, {400, "the request needs more memory than the server gives one request", ""});
  } catch (const std::exception& e) {
    TANDEM_LOG(ERROR) << "HTTP " << request.method << " " << request.path.substr(0, 64)
                      << ": the handler threw: " << e.what();
    SendError(*stream, {500, absl::StrCat("internal error: ", e.what()), ""});
  }
}

void OpenAiFrontend::Prepare(OpenAiRoute route, const HttpServer::Request& request,
                             std::shared_ptr<HttpServer::Stream> stream) {
  OpenAiContext context{options_.served_model_name, max_model_len_.load(), tokenizer_, chat_template_,
                        options_.model_aliases, LoraAdapters(), options_.generation_defaults,
                        options_.return_tokens_as_token_ids, options_.eos_token_id, options_.max_logprobs};
  context.trust_request_chat_template = options_.trust_request_chat_template;
  context.max_token_bytes = max_token_bytes_;
  OpenAiRequest parsed = ParseOpenAiRequest(route, request.body.str(), context);
  if (parsed.error) return SendError(*stream, *parsed.error);
  if (parsed.reply) return SendJson(*stream, *parsed.reply);
  std::string id = request.Header("X-Request-Id");
  if (id.empty()) id = RandomHex(32);
  // Each call's request id, as vLLM names them: "{id}-{prompt}" for a batch
  // of prompts, "{sample}_{...}" for n > 1.
  const size_t n = parsed.n, prompts = parsed.choices.size() / n;
  for (size_t i = 0; i < parsed.choices.size(); ++i) {
    std::string call_id = prompts > 1 ? absl::StrCat(id, "-", i / n) : id;
    if (n > 1) call_id = absl::StrCat(i % n, "_", call_id);
    parsed.choices[i].generate.set_request_id(std::move(call_id));
  }
  Completion::Spec spec;
  static_cast<CompletionSpec&>(spec) = std::move(parsed.spec);
  spec.id = absl::StrCat(spec.responses ? "resp_" : spec.chat ? "chatcmpl-" : "cmpl-", id);
  spec.created = static_cast<int64_t>(std::time(nullptr));
  spec.prefiller = request.Header(kPrefillerHeader);
  spec.tokenizer = tokenizer_;
  if (spec.chat) spec.reasoning = options_.reasoning_parser;
  Completion::Run(stub_.get(), std::move(parsed.choices), std::move(spec), std::move(stream));
}

std::vector<std::string> OpenAiFrontend::LoraAdapters() const {
  return options_.lora_adapters ? options_.lora_adapters() : std::vector<std::string>{};
}

void OpenAiFrontend::UpdateLora(bool load, const HttpServer::Request& request,
                                std::shared_ptr<HttpServer::Stream> stream) {
  const Json body = Json::parse(request.body.str(), nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return SendError(*stream, {400, "the body must be a JSON object", ""});
  }
  auto text = [&](const char* key) -> std::string {
    return body.contains(key) && body[key].is_string() ? body[key].get<std::string>() : "";
  };
  const std::string name = text("lora_name");
  // vLLM's messages and answers: a plain-text line on success.
  auto reply = [stream, name, load](const grpc::Status& s) {
    if (!s.ok()) {
      return SendError(*stream, {HttpStatusFor(static_cast<absl::StatusCode>(s.error_code())),
                                 s.error_message(), ""});
    }
    stream->Respond(200, "text/plain; charset=utf-8",
                    absl::StrCat("Success: LoRA adapter '", name, "' ",
                                 load ? "added" : "removed", " successfully."));
  };
  struct Call {
    grpc::ClientContext context;
    v1::LoadLoraAdapterRequest load;
    v1::LoadLoraAdapterResponse loaded;
    v1::UnloadLoraAdapterRequest unload;
    v1::UnloadLoraAdapterResponse unloaded;
  };
  auto call = std::make_shared<Call>();
  call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  if (load) {
    if (name.empty() || text("lora_path").empty()) {
      return SendError(*stream, {400, "Both 'lora_name' and 'lora_path' must be provided.", ""});
    }
    call->load.set_lora_name(name);
    call->load.set_lora_path(text("lora_path"));
    stub_->async()->LoadLoraAdapter(&call->context, &call->load, &call->loaded,
                                    [call, reply](grpc::Status s) { reply(s); });
  } else {
    if (name.empty()) return SendError(*stream, {400, "'lora_name' must be provided.", ""});
    call->unload.set_lora_name(name);
    stub_->async()->UnloadLoraAdapter(&call->context, &call->unload, &call->unloaded,
                                      [call, reply](grpc::Status s) { reply(s); });
  }
}

}  // namespace tandem
