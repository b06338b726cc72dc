// OpenAiFrontend: the decode worker's OpenAI-compatible HTTP API.
//   POST /v1/chat/completions   messages through the model's chat template
//   POST /v1/completions        a text prompt or token ids
//   POST /v1/responses          the Responses API, read as a chat completion
//   GET  /v1/models             the served model (max_model_len, vocab_size)
//   POST /v1/load_lora_adapter, /v1/unload_lora_adapter
//                               as vLLM's (Decode's LoadLoraAdapter and
//                               UnloadLoraAdapter: --allow-runtime-lora-updating)
//   GET  /health, /ping         200 while the gRPC health is SERVING, else 503
//   POST /tokenize, /detokenize as vLLM's
//   GET  /version
// With api_keys, /v1/, /tokenize and /detokenize answer only requests that
// carry one (Bearer); /health, /ping, /version and /metrics stay open.
// Streaming answers are Server-Sent Events (`data: {...}` chunks, then
// `data: [DONE]`), with usage on request (stream_options.include_usage);
// the Responses API's are its typed events (`event: TYPE`, `data: {...}`).
//
// One request pipeline: each completion is a tandem.v1.Decode/Generate call
// on the worker's own gRPC server over an in-process channel, so admission,
// validation, the queue, prefill, metrics, draining and cancellation are the
// gRPC front door's. Errors come back in OpenAI's shape,
// {"error": {"message", "type", "param", "code"}}, with the HTTP status
// HttpStatusFor() gives the gRPC code. A client that goes away cancels its
// call, which frees its KV blocks at once.
//
// Threads: the HTTP loop thread routes, checks the key and the headers and
// answers the cheap routes (/health, /v1/models, /metrics); parsing, the
// chat template and tokenizing run on a WorkQueue of their own (bounded:
// 429 with Retry-After when full), so one large request never delays
// another client; gRPC callbacks write to the HTTP stream from gRPC's
// threads.
#ifndef TANDEM_DECODE_WORKER_OPENAI_FRONTEND_H_
#define TANDEM_DECODE_WORKER_OPENAI_FRONTEND_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/chat/chat_template.h"
#include "nlohmann/json.hpp"
#include "common/engine/sampling.h"
#include "common/serving/http_server.h"
#include "common/serving/tokenizer_loader.h"
#include "common/serving/work_queue.h"
#include "common/serving/worker.h"
#include "common/serving/worker_state.h"
#include "common/tokenizer/tokenizer.h"
#include "decode_worker/openai_request.h"
#include "decode_worker/reasoning.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {

struct OpenAiOptions {
  std::string http_address = "0.0.0.0:8000";
  std::string served_model_name;  // `model` in requests and /v1/models
  std::vector<std::string> model_aliases;  // other names requests may give, listed too
  // The LoRA adapters requests may name as their model, as they are now
  // (listed too, with the served model as their parent, as vLLM lists them);
  // called on the HTTP thread. Null: none.
  std::function<std::vector<std::string>()> lora_adapters;
  // When set, a request to /v1/..., /tokenize or /detokenize must carry
  // `Authorization: Bearer KEY` with one of these (vLLM's --api-key); 401
  // otherwise. /health, /ping, /version and /metrics stay open.
  std::vector<std::string> api_keys;
  // --http-* flags; a burst of large bodies arrives, and large replies leave,
  // at 64 MiB/s (docs/benchmarks.md, "A large request beside other clients").
  HttpServer::Options http_limits = [] {
    HttpServer::Options o;
    o.max_read_bytes_per_second = HttpServer::Options::kDefaultMaxBytesPerSecond;
    o.max_write_bytes_per_second = HttpServer::Options::kDefaultMaxBytesPerSecond;
    return o;
  }();
  int api_threads = 0;              // 0: one per available CPU, at most 4
  int api_queue = 64;               // requests waiting for those threads
  WorkQueue::Priority api_priority = WorkQueue::Priority::kIdle;  // --api-priority
  size_t max_tokenize_bytes = 1 << 20;  // the largest /tokenize, /detokenize body
  // A request's own chat_template is used (vLLM's
  // --trust-request-chat-template); otherwise such a request gets 400.
  bool trust_request_chat_template = false;
  // Chat replies' reasoning (<think>...</think>) returned apart, in
  // `reasoning` (reasoning.h); kNone: all of a reply is content.
  ReasoningParser reasoning_parser = ReasoningParser::kNone;
  // When set, GET /metrics answers with it on this port too (as vLLM serves
  // its metrics on its API port): the inference gateway's endpoint picker
  // scrapes the InferencePool's target port unless told another.
  std::function<std::string()> metrics_text;
  // The model's recommended sampling for fields requests leave out
  // (--generation-config).
  GenerationDefaults generation_defaults;
  // Logprobs name tokens "token_id:N" unless a request says otherwise
  // (vLLM's --return-tokens-as-token-ids).
  bool return_tokens_as_token_ids = false;
  // The tokenizer's eos token (LoadSpecialTokens; -1: none): a stop on it
  // has no stop_reason, a stop on another stop id names that id (vLLM's).
  int32_t eos_token_id = -1;
  int max_logprobs = kDefaultMaxLogprobs;  // the engine's (--max-logprobs)
};

class OpenAiFrontend final : public FrontDoor {
 public:
  // `tokenizer` and `chat_template` may be null (the model has none): then
  // chat completions and text prompts are refused, naming what is missing.
  // Both must outlive the frontend.
  OpenAiFrontend(OpenAiOptions options, WorkerState* state, const Tokenizer* tokenizer,
                 const ChatTemplate* chat_template);
  ~OpenAiFrontend() override;

  absl::Status Start(grpc::Server* server) override;
  void Stop() override;
  // The model's limits, once the engine is ready (before: 503 on /v1/models).
  void SetModelInfo(int max_model_len, int vocab_size);
  int port() const { return http_ != nullptr ? http_->port() : 0; }

 private:
  void Handle(HttpServer::Request request, std::shared_ptr<HttpServer::Stream> stream);
  // On the WorkQueue: parse, render, tokenize, then start the completion
  // (Prepare); an exception fails the request, not the process.
  void Process(OpenAiRoute route, const HttpServer::Request& request,
               std::shared_ptr<HttpServer::Stream> stream);
  void Prepare(OpenAiRoute route, const HttpServer::Request& request,
               std::shared_ptr<HttpServer::Stream> stream);
  std::vector<std::string> LoraAdapters() const;
  nlohmann::ordered_json ModelCard(const std::string& name, const std::string& parent) const;
  // POST /v1/load_lora_adapter or /v1/unload_lora_adapter (`load`).
  void UpdateLora(bool load, const HttpServer::Request& request,
                  std::shared_ptr<HttpServer::Stream> stream);

  OpenAiOptions options_;
  WorkerState* state_;
  const Tokenizer* tokenizer_;
  const ChatTemplate* chat_template_;
  std::atomic<int> max_model_len_{0};
  std::atomic<int> vocab_size_{0};
  const int64_t created_;
  size_t max_token_bytes_ = 0;  // the vocabulary's longest token (OpenAiContext)
  std::unique_ptr<v1::Decode::Stub> stub_;
  std::unique_ptr<WorkQueue> work_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_OPENAI_FRONTEND_H_
