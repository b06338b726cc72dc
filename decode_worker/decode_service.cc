#include "decode_worker/decode_service.h"

#include <algorithm>
#include <chrono>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/status_convert.h"
#include "common/serving/stream_writer.h"
#include "common/serving/text_output.h"

namespace tandem {

DecodeServiceImpl::DecodeServiceImpl(WorkerState* state, WorkerMetrics* metrics,
                                     std::unique_ptr<PrefillPool> prefill_pool,
                                     DecodeOptions options, const Tokenizer* tokenizer)
    : state_(state),
      metrics_(metrics),
      pool_(std::move(prefill_pool)),
      options_(options),
      tokenizer_(tokenizer) {
  if (pool_ != nullptr) watcher_ = std::thread([this] { WatchPrefillPool(); });
}

DecodeServiceImpl::~DecodeServiceImpl() {
  stop_.Notify();
  if (watcher_.joinable()) watcher_.join();
}

void DecodeServiceImpl::WatchPrefillPool() {
  bool usable_before = true;
  do {
    const int usable = pool_->CountUsable();
    metrics_->PrefillEndpoints(pool_->size(), usable);
    const bool usable_now = usable > 0 || options_.fallback_local;
    if (usable_now != usable_before) {
      TANDEM_LOG(WARNING) << (usable_now ? "a prefill worker is usable again: SERVING"
                                         : "no prefill worker is usable: NOT_SERVING");
      usable_before = usable_now;
    }
    state_->upstream_usable = usable_now;
    state_->UpdateHealth();
  } while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(1)));
}

void DecodeServiceImpl::SetEngine(EngineClient* client) { client_ = client; }

void DecodeServiceImpl::Opened(grpc::ClientContext* context) {
  MutexLock lock(&clients_mu_);
  clients_.insert(context);
}

void DecodeServiceImpl::Closed(grpc::ClientContext* context) {
  MutexLock lock(&clients_mu_);
  clients_.erase(context);
}

void DecodeServiceImpl::StopPrefillStreams() {
  MutexLock lock(&clients_mu_);
  if (clients_.empty()) return;
  TANDEM_LOG(INFO) << "decode worker: cancelling " << clients_.size()
                   << " prefill stream(s) still open";
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  // TryCancel runs no callback inline; a client ends (and leaves the set)
  // on a gRPC thread. One that ends may start a retry, which its call, done,
  // turns down; whatever appears is cancelled on the next round.
  while (!clients_.empty() && absl::Now() < deadline) {
    for (grpc::ClientContext* c : clients_) c->TryCancel();
    clients_mu_.AwaitWithTimeout(
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(clients_mu_) { return clients_.empty(); },
        absl::Milliseconds(100));
  }
  if (!clients_.empty()) {
    TANDEM_LOG(WARNING) << "decode worker: " << clients_.size()
                        << " prefill stream(s) did not end within 10 s of their cancel";
  }
}

void DecodeServiceImpl::Fail(const std::shared_ptr<GenerateCall>& call, const grpc::Status& status) {
  if (call->done.exchange(true)) return;
  {
    MutexLock lock(&call->mu);
    if (call->prefill_context != nullptr) call->prefill_context->TryCancel();
  }
  // The id is free before the client can see the end, so it may reuse it at once.
  client_.load()->Cancel(call->id);  // frees its blocks wherever it is
  in_flight_.Release(call->id);
  call->writer->End(status);
}

void DecodeServiceImpl::OnKvChunk(const std::shared_ptr<GenerateCall>& call, ReceivedChunk chunk) {
  if (call->done.load()) return;
  client_.load()->ImportKv(call->id, std::move(chunk));
}

void DecodeServiceImpl::OnPrefillToken(const std::shared_ptr<GenerateCall>& call, int32_t token,
                                       TokenLogprobs logprobs) {
  if (call->done.load()) return;
  client_.load()->RemoteKvArrived(call->id, token, std::move(logprobs));
}

void DecodeServiceImpl::PrefillFailed(const std::shared_ptr<GenerateCall>& call,
                                      const grpc::Status& status) {
  if (!options_.fallback_local) return Fail(call, status);
  if (call->done.load()) return;
  TANDEM_LOG(WARNING) << "request " << call->id << ": " << status.error_message()
                      << "; prefilling locally (--prefill-fallback=local)";
  metrics_->PrefillLocal("fallback");
  client_.load()->ComputeLocally(call->id);
}

void DecodeServiceImpl::StartPrefill(const std::shared_ptr<GenerateCall>& call, int64_t cached) {
  PrefillClient::Args args;
  args.tokens = call->prompt;
  args.tokens.insert(args.tokens.end(), call->generated.begin(), call->generated.end());
  args.num_cached = cached;
  args.prefill = call->prefills++;
  args.lora_fingerprint = call->params.lora_fingerprint;
  // The budget grows with the tokens to prefill: a long prompt on a slow
  // device is not cut off by a limit sized for short ones.
  const absl::Duration budget =
      options_.prefill_timeout +
      options_.prefill_timeout_per_token * static_cast<double>(args.tokens.size() - cached);
  args.deadline = std::min(call->client_deadline,
                           std::chrono::system_clock::now() + absl::ToChronoMilliseconds(budget));
  args.first_message_timeout = options_.first_message_timeout;
  const int64_t kv_bytes = (static_cast<int64_t>(args.tokens.size()) - cached) *
                           static_cast<int64_t>(client_.load()->token_bytes());
  args.num_streams = KvStreamsFor(kv_bytes, pool_->kv_streams(), options_.kv_bytes_per_stream);
  PrefillPool::Endpoint* endpoint = call->prefill_endpoint.get();
  if (endpoint == nullptr) {
    // Prompts sharing a prefix meet on the worker that holds it (its cache
    // keyed by adapter and salt as the prefill worker's is).
    PrefillPool::RouteKey key{&args.tokens, cached,
                              absl::HashOf(args.lora_fingerprint, call->params.cache_salt)};
    PrefillPool::RouteInfo info;
    endpoint = pool_->Pick(nullptr, &key, &info);
    metrics_->PrefillRoute(info.reason, info.matched_tokens);
  }
  (new PrefillClient(this, endpoint, call, std::move(args)))->Start();
}

bool DecodeServiceImpl::AddTokens(GenerateCall& call, const std::vector<int32_t>& all_tokens,
                                  const std::vector<TokenLogprobs>& logprobs, bool stop_token,
                                  v1::GenerateResponse* msg) {
  // No token past the one that completes a stop string; a stop token's
  // text is no part of the reply's (vLLM's).
  std::string text;
  const size_t keep = call.text != nullptr ? call.text->AddUntilStop(all_tokens, &text, stop_token)
                                           : all_tokens.size();
  const std::vector<int32_t> tokens(all_tokens.begin(), all_tokens.begin() + keep);
  if (call.generated.empty() && !tokens.empty()) {  // the first message
    msg->set_request_id(call.id);
    if (call.params.prompt_logprobs >= 0) {
      msg->mutable_prompt_token_ids()->Add(call.prompt.begin(), call.prompt.end());
      for (const TokenLogprobs& lp : call.prompt_logprobs) ToProto(lp, msg->add_prompt_logprobs());
      call.prompt_logprobs.clear();
    }
  }
  for (int32_t t : tokens) msg->add_token_ids(t);
  for (size_t i = 0; i < keep && i < logprobs.size(); ++i) ToProto(logprobs[i], msg->add_logprobs());
  call.generated.insert(call.generated.end(), tokens.begin(), tokens.end());
  if (!tokens.empty()) {
    const absl::Time now = absl::Now();
    if (call.generated.size() == tokens.size()) {
      metrics_->TimeToFirstToken(absl::ToDoubleSeconds(now - call.queued_at));
    } else {
      metrics_->InterTokenLatency(absl::ToDoubleSeconds(now - call.last_token));
    }
    metrics_->GenerationTokens(static_cast<int>(tokens.size()));
    call.last_token = now;
  }
  if (call.text == nullptr) return false;
  msg->set_text(std::move(text));
  if (!call.text->stopped()) return false;
  msg->set_stop_string(call.text->matched_stop());
  return true;
}

void DecodeServiceImpl::Finish(const std::shared_ptr<GenerateCall>& call,
                               v1::GenerateResponse msg, v1::FinishReason reason) {
  // One end per call: a cancel racing this finish must not release the id
  // (perhaps already reused) a second time.
  if (call->done.exchange(true)) return;
  if (call->text != nullptr && !call->text->stopped()) {
    msg.mutable_text()->append(call->text->Finish());
  }
  msg.set_finish_reason(reason);
  msg.mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(call->prompt.size()));
  msg.mutable_usage()->set_completion_tokens(static_cast<uint32_t>(call->generated.size()));
  msg.mutable_usage()->set_cached_tokens(static_cast<uint32_t>(std::max(call->cached_tokens, 0)));
  metrics_->EndToEndLatency(absl::ToDoubleSeconds(absl::Now() - call->queued_at));
  // The id is free before the client can see the end, so it may reuse it at once.
  client_.load()->Cancel(call->id);  // still running after a stop string; else a no-op
  in_flight_.Release(call->id);
  call->writer->Send(std::move(msg));
  call->writer->End(grpc::Status::OK);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* DecodeServiceImpl::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto opened = OpenStream<v1::GenerateResponse>(state_, metrics_, context);
  const std::shared_ptr<StreamWriter<v1::GenerateResponse>> writer = opened.first;
  if (!opened.second) return writer.get();
  auto invalid = [&](std::string message) {
    writer->End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::move(message)));
    return writer.get();
  };
  auto resolved_id = ResolveRequestId(request->request_id());
  if (!resolved_id.ok()) return invalid(std::string(resolved_id.status().message()));
  const bool has_text = !request->prompt().empty();
  if (has_text && request->prompt_token_ids_size() > 0) {
    return invalid("give one of prompt (text) and prompt_token_ids, not both");
  }
  if (tokenizer_ == nullptr && (has_text || request->sampling().stop_size() > 0)) {
    return invalid(absl::StrCat(has_text ? "prompt (text)" : "sampling.stop",
                                " needs a tokenizer, and this model has none; send "
                                "prompt_token_ids and stop_token_ids"));
  }
  if (request->sampling().stop_size() > options_.max_stop_strings) {
    return invalid(absl::StrCat("sampling.stop has ", request->sampling().stop_size(),
                                " strings; the limit is ", options_.max_stop_strings));
  }
  if (request->sampling().min_tokens() > request->sampling().max_tokens()) {
    return invalid(absl::StrCat("sampling.min_tokens (", request->sampling().min_tokens(),
                                ") must be at most max_tokens (", request->sampling().max_tokens(),
                                ")"));
  }
  for (const std::string& stop : request->sampling().stop()) {
    if (stop.empty() || static_cast<int>(stop.size()) > options_.max_stop_string_bytes) {
      return invalid(absl::StrCat("sampling.stop: each stop string must have 1 to ",
                                  options_.max_stop_string_bytes, " bytes, got ", stop.size()));
    }
  }
  absl::StatusOr<SamplingParams> params = FromProto(request->sampling(), tokenizer_);
  if (!params.ok()) {
    writer->End(ToGrpcStatus(params.status()));
    return writer.get();
  }
  params->lora_name = request->lora_name();
  params->priority = request->priority();
  params->cache_salt = request->cache_salt();
  absl::StatusOr<LoraRef> lora = client_.load()->lora().Find(params->lora_name);
  if (!lora.ok()) {
    writer->End(ToGrpcStatus(lora.status()));
    return writer.get();
  }
  // What the prefill worker's KV must have been computed with, fixed now:
  // the engine refuses the request if the name gets other weights meanwhile.
  params->lora_fingerprint = lora->fingerprint;
  // A gateway's choice of prefill worker for this request (llm-d's P/D
  // routing header); without one, the pool's rotation.
  std::shared_ptr<PrefillPool::Endpoint> chosen;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find(kPrefillerHeader); it != metadata.end() && pool_ != nullptr) {
    auto named = pool_->Named(std::string(it->second.data(), it->second.size()));
    if (!named.ok()) {
      writer->End(ToGrpcStatus(named.status()));
      return writer.get();
    }
    chosen = *std::move(named);
  }
  if (absl::Status claimed = in_flight_.Claim(*resolved_id); !claimed.ok()) {
    writer->End(ToGrpcStatus(claimed));
    return writer.get();
  }
  auto call = std::make_shared<GenerateCall>();
  call->prefill_endpoint = std::move(chosen);
  call->id = *resolved_id;
  if (request->request_id().empty()) {
    TANDEM_LOG(INFO) << "request without an id: assigned " << call->id;
  }
  if (has_text) {
    call->prompt = tokenizer_->Encode(request->prompt());
  } else {
    call->prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  }
  call->params = *std::move(params);
  if (tokenizer_ != nullptr) {
    const bool skip_special =
        !request->sampling().has_skip_special_tokens() ||
        request->sampling().skip_special_tokens().value();
    call->text = std::make_unique<TextOutput>(
        tokenizer_, skip_special,
        std::vector<std::string>(request->sampling().stop().begin(),
                                 request->sampling().stop().end()),
        request->sampling().include_stop_str_in_output(), request->sampling().min_tokens());
  }
  call->writer = writer;
  call->queued_at = absl::Now();
  call->client_deadline = context->deadline();
  if (options_.prefill_remote) {
    if (call->params.prompt_logprobs >= 0) {
      call->local_reason = "prompt_logprobs";  // its logits are needed here
    } else if (call->prompt.size() <= static_cast<size_t>(options_.local_prefill_max_tokens)) {
      call->local_reason = "short_prompt";
    }
  } else {
    call->local_reason = "aggregated";
  }
  writer->OnCancelled([this, call] {
    // gRPC reports a passed deadline as a cancel: tell the two apart.
    Fail(call, StreamWriter<v1::GenerateResponse>::CancelStatus(call->client_deadline));
  });
  EngineClient::Submission s;
  s.id = call->id;
  s.prompt = call->prompt;
  s.params = call->params;
  s.kind = call->local_reason != nullptr ? RequestKind::kGenerate : RequestKind::kRemotePrefill;
  s.max_waiting = options_.max_waiting;
  client_.load()->Submit(std::move(s),
                         [this, call](const RequestOutput& o) { OnOutput(call, o); });
  return writer.get();
}

grpc::ServerUnaryReactor* DecodeServiceImpl::ModelInfo(grpc::CallbackServerContext* context,
                                                       const v1::ModelInfoRequest* /*request*/,
                                                       v1::ModelInfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  EngineClient* client = client_.load();
  if (client == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading"));
    return reactor;
  }
  response->set_model(options_.served_model_name);
  response->set_max_model_len(static_cast<uint32_t>(client->max_model_len()));
  response->set_vocab_size(static_cast<uint32_t>(client->model_config().vocab_size));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

namespace {

// A unary Prefill RPC, called through a stub's async interface.
template <typename Req, typename Resp>
using PrefillRpc = void (*)(v1::Prefill::Stub::async_interface* stub, grpc::ClientContext* context,
                            const Req* request, Resp* response,
                            std::function<void(grpc::Status)> done);

// Calls `rpc` with `request` on every endpoint at once; `done` gets their
// statuses and responses, in endpoint order, once all have answered (on a
// gRPC thread; at once when there are none). The calls are `host`'s clients
// (Opened / Closed) until then, so that a host that stops cancels and waits
// for them.
template <typename Req, typename Resp>
void CallEveryPrefill(PrefillClient::Host* host,
                      const std::vector<PrefillPool::Endpoint*>& endpoints, Req request,
                      PrefillRpc<Req, Resp> rpc,
                      std::function<void(const std::vector<grpc::Status>&, const std::vector<Resp>&)> done) {
  if (endpoints.empty()) return done({}, {});
  struct State {
    Req request;
    std::vector<std::unique_ptr<v1::Prefill::Stub>> stubs;
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<grpc::Status> statuses;
    std::vector<Resp> responses;
    std::atomic<size_t> left{0};
    std::function<void(const std::vector<grpc::Status>&, const std::vector<Resp>&)> done;
    PrefillClient::Host* host = nullptr;
  };
  auto st = std::make_shared<State>();
  st->request = std::move(request);
  st->statuses.resize(endpoints.size());
  st->responses.resize(endpoints.size());
  st->left = endpoints.size();
  st->done = std::move(done);
  st->host = host;
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  for (PrefillPool::Endpoint* e : endpoints) {
    st->stubs.push_back(v1::Prefill::NewStub(e->channel));
    st->contexts.push_back(std::make_unique<grpc::ClientContext>());
    st->contexts.back()->set_deadline(deadline);
    host->Opened(st->contexts.back().get());
  }
  for (size_t i = 0; i < endpoints.size(); ++i) {
    rpc(st->stubs[i]->async(), st->contexts[i].get(), &st->request, &st->responses[i],
        [st, i](grpc::Status s) {
          st->statuses[i] = std::move(s);
          if (st->left.fetch_sub(1) == 1) st->done(st->statuses, st->responses);
          st->host->Closed(st->contexts[i].get());
        });
  }
}

void CallLoad(v1::Prefill::Stub::async_interface* stub, grpc::ClientContext* context,
              const v1::LoadLoraAdapterRequest* request, v1::LoadLoraAdapterResponse* response,
              std::function<void(grpc::Status)> done) {
  stub->LoadLoraAdapter(context, request, response, std::move(done));
}

void CallUnload(v1::Prefill::Stub::async_interface* stub, grpc::ClientContext* context,
                const v1::UnloadLoraAdapterRequest* request, v1::UnloadLoraAdapterResponse* response,
                std::function<void(grpc::Status)> done) {
  stub->UnloadLoraAdapter(context, request, response, std::move(done));
}

}  // namespace

bool DecodeServiceImpl::LoadLoraOn(PrefillPool::Endpoint* endpoint, const std::string& name,
                                   uint64_t fingerprint,
                                   std::function<void(const grpc::Status&)> done) {
  v1::LoadLoraAdapterRequest request;
  {
    MutexLock lock(&runtime_loras_mu_);
    auto it = runtime_loras_.find(name);
    if (it == runtime_loras_.end() || it->second.fingerprint != fingerprint) return false;
    request.set_lora_path(it->second.path);
  }
  request.set_lora_name(name);
  request.set_expect_fingerprint(fingerprint);
  CallEveryPrefill<v1::LoadLoraAdapterRequest, v1::LoadLoraAdapterResponse>(
      this, {endpoint}, std::move(request), &CallLoad,
      [done = std::move(done)](const std::vector<grpc::Status>& statuses,
                               const std::vector<v1::LoadLoraAdapterResponse>&) {
        done(statuses[0]);
      });
  return true;
}

std::vector<std::string> DecodeServiceImpl::LoraAdapters() const {
  EngineClient* client = client_.load();
  return client == nullptr ? std::vector<std::string>{} : client->lora().names();
}

std::vector<PrefillPool::Endpoint*> DecodeServiceImpl::PrefillEndpoints() const {
  if (!options_.prefill_remote || pool_ == nullptr) return {};
  return pool_->endpoints();
}

grpc::ServerUnaryReactor* DecodeServiceImpl::LoadLoraAdapter(
    grpc::CallbackServerContext* context, const v1::LoadLoraAdapterRequest* request,
    v1::LoadLoraAdapterResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  EngineClient* client = client_.load();
  v1::LoadLoraAdapterRequest here = *request;
  here.clear_expect_fingerprint();  // this worker's load: the name must be new
  LoadLoraAdapterHere(client, here, [this, reactor, response, client, here](
                                        const grpc::Status& s, uint64_t fingerprint) {
    if (!s.ok()) return reactor->Finish(s);
    response->set_fingerprint(fingerprint);
    // Then every prefill worker, with these weights.
    v1::LoadLoraAdapterRequest there = here;
    there.set_expect_fingerprint(fingerprint);
    const std::vector<PrefillPool::Endpoint*> endpoints = PrefillEndpoints();
    CallEveryPrefill<v1::LoadLoraAdapterRequest, v1::LoadLoraAdapterResponse>(
        this, endpoints, there, &CallLoad,
        [this, reactor, client, endpoints, name = here.lora_name(), path = here.lora_path(),
         fingerprint](
            const std::vector<grpc::Status>& statuses,
            const std::vector<v1::LoadLoraAdapterResponse>&) {
          std::vector<std::string> failed;
          std::vector<PrefillPool::Endpoint*> loaded;
          grpc::StatusCode code = grpc::StatusCode::OK;
          for (size_t i = 0; i < statuses.size(); ++i) {
            if (statuses[i].ok()) {
              loaded.push_back(endpoints[i]);
              continue;
            }
            if (code == grpc::StatusCode::OK) code = statuses[i].error_code();
            failed.push_back(absl::StrCat("prefill worker ", endpoints[i]->target, ": ",
                                          GrpcCodeName(statuses[i].error_code()), ": ",
                                          statuses[i].error_message()));
          }
          if (failed.empty()) {
            TANDEM_LOG(INFO) << "LoRA adapter '" << name << "' loaded here and on "
                             << endpoints.size() << " prefill worker(s)";
            {
              MutexLock lock(&runtime_loras_mu_);
              runtime_loras_[name] = {path, fingerprint};
            }
            return reactor->Finish(grpc::Status::OK);
          }
          // Undone everywhere: a name the pair cannot serve is not half loaded.
          const grpc::Status error(code, absl::StrCat("LoRA adapter '", name,
                                                      "' not loaded (undone here): ",
                                                      absl::StrJoin(failed, "; ")));
          TANDEM_LOG(WARNING) << error.error_message();
          v1::UnloadLoraAdapterRequest undo;
          undo.set_lora_name(name);
          client->UnloadLora(name, [](const absl::Status&) {});
          CallEveryPrefill<v1::UnloadLoraAdapterRequest, v1::UnloadLoraAdapterResponse>(
              this, loaded, undo, &CallUnload,
              [reactor, error](const std::vector<grpc::Status>&,
                               const std::vector<v1::UnloadLoraAdapterResponse>&) {
                reactor->Finish(error);
              });
        });
  });
  return reactor;
}

grpc::ServerUnaryReactor* DecodeServiceImpl::UnloadLoraAdapter(
    grpc::CallbackServerContext* context, const v1::UnloadLoraAdapterRequest* request,
    v1::UnloadLoraAdapterResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  UnloadLoraAdapterHere(client_.load(), *request, [this, reactor, req = *request](
                                                      const grpc::Status& s) {
    if (!s.ok()) return reactor->Finish(s);
    {
      MutexLock lock(&runtime_loras_mu_);
      runtime_loras_.erase(req.lora_name());
    }
    const std::vector<PrefillPool::Endpoint*> endpoints = PrefillEndpoints();
    CallEveryPrefill<v1::UnloadLoraAdapterRequest, v1::UnloadLoraAdapterResponse>(
        this, endpoints, req, &CallUnload,
        [reactor, endpoints, name = req.lora_name()](
            const std::vector<grpc::Status>& statuses,
            const std::vector<v1::UnloadLoraAdapterResponse>&) {
          // Requests can no longer name it here, where they arrive: a prefill
          // worker that did not answer only keeps a slot it will not use.
          for (size_t i = 0; i < statuses.size(); ++i) {
            if (!statuses[i].ok() && statuses[i].error_code() != grpc::StatusCode::NOT_FOUND) {
              TANDEM_LOG(WARNING) << "LoRA adapter '" << name << "' unloaded here but not on "
                                  << "prefill worker " << endpoints[i]->target << ": "
                                  << statuses[i].error_message();
            }
          }
          reactor->Finish(grpc::Status::OK);
        });
  });
  return reactor;
}

void DecodeServiceImpl::OnOutput(const std::shared_ptr<GenerateCall>& call,
                                 const RequestOutput& o) {
  if (call->done.load()) return;
  if (!o.status.ok()) return Fail(call, ToGrpcStatus(o.status));
  if (call->cached_tokens < 0 && (o.kv_needed || !o.new_tokens.empty())) call->cached_tokens = o.cached_tokens;
  if (o.kv_needed) {
    if (call->prefills > 0) {
      TANDEM_LOG(INFO) << "request " << call->id << " preempted after " << call->generated.size()
                       << " tokens; it is re-prefilled";
    }
    return StartPrefill(call, o.cached_tokens);
  }
  if (call->generated.empty() && !o.new_tokens.empty() && call->local_reason != nullptr) {
    metrics_->PrefillLocal(call->local_reason);
  }
  call->prompt_logprobs.insert(call->prompt_logprobs.end(), o.prompt_logprobs.begin(),
                               o.prompt_logprobs.end());
  if (o.new_tokens.empty() && !o.finished) return;  // prompt logprobs only: they go with the first token
  v1::GenerateResponse msg;
  if (AddTokens(*call, o.new_tokens, o.logprobs, o.stop_token, &msg)) {  // a stop string ended the output
    return Finish(call, std::move(msg), v1::FINISH_REASON_STOP);
  }
  if (!o.finished) {
    call->writer->Send(std::move(msg));
    return;
  }
  Finish(call, std::move(msg),
         o.finish_reason == FinishReason::kStop ? v1::FINISH_REASON_STOP
                                                : v1::FINISH_REASON_LENGTH);
}

}  // namespace tandem
