#include "decode_worker/decode_service.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/status_convert.h"
#include "common/serving/stream_writer.h"
#include "common/serving/text_output.h"

namespace tandem {

DecodeServiceImpl::DecodeServiceImpl(WorkerState* state, WorkerMetrics* metrics,
                                     std::shared_ptr<grpc::Channel> prefill_channel,
                                     DecodeOptions options, const Tokenizer* tokenizer)
    : state_(state),
      metrics_(metrics),
      prefill_(prefill_channel != nullptr ? v1::Prefill::NewStub(prefill_channel) : nullptr),
      options_(options),
      tokenizer_(tokenizer) {}

DecodeServiceImpl::~DecodeServiceImpl() = default;

void DecodeServiceImpl::SetEngine(EngineLoop* loop) {
  fingerprint_ = MakeFingerprint(loop->model_config(), loop->kv_cache().dtype());
  slot_bytes_ = loop->kv_cache().slot_bytes();
  loop->AddStepObserver([this](LlmEngine& engine, const std::vector<RequestOutput>&) {
    RetryPending(engine);
    metrics_->SetServiceQueues(static_cast<int>(pending_.size()), waiting_for_kv_);
  });
  loop_ = loop;
}

void DecodeServiceImpl::Release(const std::string& id) {
  MutexLock lock(&mu_);
  in_flight_.erase(id);
}

void DecodeServiceImpl::Fail(const std::shared_ptr<GenerateCall>& call, const grpc::Status& status) {
  if (call->done.exchange(true)) return;
  {
    MutexLock lock(&call->mu);
    if (call->prefill_context != nullptr) call->prefill_context->TryCancel();
  }
  call->writer->End(status);
  Retire(call);
}

void DecodeServiceImpl::Retire(const std::shared_ptr<GenerateCall>& call) {
  EngineLoop* loop = loop_.load();
  loop->Post([this, loop, call](LlmEngine& engine) {
    (void)engine.Abort(call->id);  // frees reserved or running blocks
    loop->RemoveCallback(call->id);
    if (call->awaiting_kv) {
      call->awaiting_kv = false;
      --waiting_for_kv_;
    }
    pending_.erase(std::remove(pending_.begin(), pending_.end(), call), pending_.end());
    Release(call->id);
  });
}

void DecodeServiceImpl::OnKvChunk(const std::shared_ptr<GenerateCall>& call, v1::KvChunk chunk) {
  loop_.load()->Post([this, call, chunk = std::move(chunk)](LlmEngine& engine) {
    if (call->done.load()) return;
    absl::Status w = ImportChunk(engine, call->id, chunk);
    if (!w.ok()) Fail(call, ToGrpcStatus(w));
  });
}

void DecodeServiceImpl::OnPrefillToken(const std::shared_ptr<GenerateCall>& call, int32_t token) {
  loop_.load()->Post([this, call, token](LlmEngine& engine) { OnToken(engine, call, token); });
}

void DecodeServiceImpl::RetryPrefill(const std::shared_ptr<GenerateCall>& call) {
  loop_.load()->Post([this, call](LlmEngine&) {
    if (call->done.load()) return;
    ++call->attempt;
    StartPrefill(call);
  });
}

void DecodeServiceImpl::PrefillUnavailable(const std::shared_ptr<GenerateCall>& call,
                                           const grpc::Status& status) {
  if (!options_.fallback_local) return Fail(call, status);
  loop_.load()->Post([this, call, status](LlmEngine& engine) {
    if (call->done.load()) return;
    (void)engine.Abort(call->id);  // the blocks reserved for the transfer
    if (call->awaiting_kv) {
      call->awaiting_kv = false;
      --waiting_for_kv_;
    }
    TANDEM_LOG(WARNING) << "request " << call->id << ": " << status.error_message()
                        << "; prefilling locally (--prefill-fallback=local)";
    PrefillLocally(engine, call, "fallback");
  });
}

const char* DecodeServiceImpl::LocalPrefillReason(const GenerateCall& call) const {
  if (!options_.prefill_remote) return "aggregated";
  const size_t tokens = call.prompt.size() + call.generated.size();
  if (tokens <= static_cast<size_t>(options_.local_prefill_max_tokens)) return "short_prompt";
  return nullptr;
}

void DecodeServiceImpl::PrefillLocally(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call,
                                       const char* reason) {
  // max_tokens counts from the original prompt, as for a remote prefill.
  SamplingParams rest = call->params;
  rest.max_tokens = call->params.max_tokens - static_cast<uint32_t>(call->generated.size());
  absl::Status added = engine.AddRequest(call->id, call->PrefillTokens(), rest);
  if (!added.ok()) return Fail(call, ToGrpcStatus(added));
  metrics_->PrefillLocal(reason);
  loop_.load()->SetCallback(call->id, [this, call](LlmEngine& engine, const RequestOutput& o) {
    OnOutput(engine, call, o);
  });
}

bool DecodeServiceImpl::AddTokens(GenerateCall& call, const std::vector<int32_t>& tokens,
                                  v1::GenerateResponse* msg) {
  if (call.generated.empty() && !tokens.empty()) msg->set_request_id(call.id);  // first message
  for (int32_t t : tokens) msg->add_token_ids(t);
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
  msg->set_text(call.text->Add(tokens));
  if (!call.text->stopped()) return false;
  msg->set_stop_string(call.text->matched_stop());
  return true;
}

void DecodeServiceImpl::Finish(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call,
                               v1::GenerateResponse msg, v1::FinishReason reason,
                               bool engine_holds_request) {
  if (call->text != nullptr && !call->text->stopped()) {
    msg.mutable_text()->append(call->text->Finish());
  }
  msg.set_finish_reason(reason);
  msg.mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(call->prompt.size()));
  msg.mutable_usage()->set_completion_tokens(static_cast<uint32_t>(call->generated.size()));
  call->done = true;
  metrics_->EndToEndLatency(absl::ToDoubleSeconds(absl::Now() - call->queued_at));
  call->writer->Send(std::move(msg));
  call->writer->End(grpc::Status::OK);
  if (engine_holds_request) {
    Retire(call);  // still in this step's batch: abort it after the step
  } else {
    (void)engine.Abort(call->id);  // reserved blocks, if any
    loop_.load()->RemoveCallback(call->id);  // a resumed call's earlier callback
    Release(call->id);
  }
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
  for (const std::string& stop : request->sampling().stop()) {
    if (stop.empty() || static_cast<int>(stop.size()) > options_.max_stop_string_bytes) {
      return invalid(absl::StrCat("sampling.stop: each stop string must have 1 to ",
                                  options_.max_stop_string_bytes, " bytes, got ", stop.size()));
    }
  }
  {
    MutexLock lock(&mu_);
    if (!in_flight_.insert(*resolved_id).second) {
      writer->End(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                               absl::StrCat("request_id '", EchoClientText(*resolved_id),
                                            "' is already in flight")));
      return writer.get();
    }
  }
  auto call = std::make_shared<GenerateCall>();
  call->id = *resolved_id;
  if (request->request_id().empty()) {
    TANDEM_LOG(INFO) << "request without an id: assigned " << call->id;
  }
  if (has_text) {
    call->prompt = tokenizer_->Encode(request->prompt());
  } else {
    call->prompt.assign(request->prompt_token_ids().begin(), request->prompt_token_ids().end());
  }
  call->params = FromProto(request->sampling());
  if (tokenizer_ != nullptr) {
    const bool skip_special =
        !request->sampling().has_skip_special_tokens() ||
        request->sampling().skip_special_tokens().value();
    call->text = std::make_unique<TextOutput>(
        tokenizer_, skip_special,
        std::vector<std::string>(request->sampling().stop().begin(),
                                 request->sampling().stop().end()));
  }
  call->writer = writer;
  call->queued_at = absl::Now();
  call->client_deadline = context->deadline();
  writer->OnCancelled([this, call] {
    // gRPC reports a passed deadline as a cancel: tell the two apart.
    Fail(call, StreamWriter<v1::GenerateResponse>::CancelStatus(call->client_deadline));
  });
  loop_.load()->Post([this, call](LlmEngine& engine) { Reserve(engine, call); });
  return writer.get();
}

void DecodeServiceImpl::Reserve(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call) {
  if (call->done.load()) return;
  if (absl::Status v = engine.Validate(call->prompt, call->params); !v.ok()) {
    return Fail(call, ToGrpcStatus(v));
  }
  // A request that cannot fit even in an empty cache would wait in vain.
  const KvCache& kv = engine.kv_cache();
  const int64_t need_tokens = std::min<int64_t>(
      static_cast<int64_t>(call->prompt.size()) + call->params.max_tokens, engine.max_model_len());
  const int64_t need_blocks = (need_tokens + kv.block_size() - 1) / kv.block_size();
  if (need_blocks > kv.allocator().num_blocks()) {
    return Fail(call, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, absl::StrCat(
        "prompt_token_ids (", call->prompt.size(), ") + max_tokens (", call->params.max_tokens,
        ") need ", need_blocks, " KV blocks of ", kv.block_size(),
        " tokens; the whole cache has ", kv.allocator().num_blocks())));
  }
  ReserveOrQueue(engine, call);
}

void DecodeServiceImpl::ReserveOrQueue(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call) {
  if (const char* reason = LocalPrefillReason(*call); reason != nullptr) {
    // The engine's own queue holds it until blocks free up; bounded like ours.
    const size_t waiting = pending_.size() + engine.num_waiting();
    if (call->generated.empty() && static_cast<int>(waiting) >= options_.max_waiting) {
      return Fail(call, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                     absl::StrCat(waiting, " requests already waiting (limit ",
                                                  options_.max_waiting, ")")));
    }
    return PrefillLocally(engine, call, reason);
  }
  // The prefill tokens' KV plus the slot of the token sampled after them.
  const int64_t tokens = static_cast<int64_t>(call->prompt.size() + call->generated.size()) + 1;
  absl::Status r = engine.ReserveKv(call->id, tokens);
  if (r.ok()) return BeginKvTransfer(call);
  if (!absl::IsResourceExhausted(r)) return Fail(call, ToGrpcStatus(r));
  // A preempted request always gets back in line: it was admitted once.
  if (call->generated.empty() && static_cast<int>(pending_.size()) >= options_.max_waiting) {
    return Fail(call, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                   absl::StrCat("KV cache full and ", pending_.size(),
                                                " requests already waiting (limit ",
                                                options_.max_waiting, ")")));
  }
  pending_.push_back(call);
}

void DecodeServiceImpl::RetryPending(LlmEngine& engine) {
  const absl::Time now = absl::Now();
  while (!pending_.empty()) {
    std::shared_ptr<GenerateCall> call = pending_.front();
    if (call->done.load()) {
      pending_.pop_front();
      continue;
    }
    const int64_t tokens = static_cast<int64_t>(call->prompt.size() + call->generated.size()) + 1;
    absl::Status r = engine.ReserveKv(call->id, tokens);
    if (r.ok()) {
      pending_.pop_front();
      BeginKvTransfer(call);
      continue;
    }
    // New requests give up after the queue timeout; preempted ones wait for
    // the blocks the running requests will free (their deadline still holds).
    if (call->generated.empty() && now - call->queued_at > options_.queue_timeout) {
      pending_.pop_front();
      Fail(call, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              absl::StrCat("KV cache full: waited ",
                                           absl::FormatDuration(options_.queue_timeout),
                                           " for ", tokens, " token slots (",
                                           engine.kv_cache().allocator().num_free(),
                                           " blocks free)")));
      continue;
    }
    break;  // FIFO: later requests wait behind the first
  }
}

void DecodeServiceImpl::BeginKvTransfer(const std::shared_ptr<GenerateCall>& call) {
  if (call->done.load()) return;
  call->awaiting_kv = true;
  ++waiting_for_kv_;
  call->attempt = 0;
  StartPrefill(call);
}

void DecodeServiceImpl::StartPrefill(const std::shared_ptr<GenerateCall>& call) {
  if (call->done.load()) return;
  const auto deadline = std::min(call->client_deadline,
                                 std::chrono::system_clock::now() +
                                     absl::ToChronoSeconds(options_.prefill_timeout));
  auto* client = new PrefillClient(this, call, call->PrefillTokens(), call->attempt, deadline);
  client->Start(prefill_.get());
}

void DecodeServiceImpl::OnToken(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call,
                                int32_t token) {
  if (call->done.load()) return;
  if (call->awaiting_kv) {  // the KV is here: running from now on
    call->awaiting_kv = false;
    --waiting_for_kv_;
  }
  const SamplingParams& p = call->params;
  // The context the engine continues from: prompt and earlier output.
  std::vector<int32_t> context = call->PrefillTokens();
  v1::GenerateResponse msg;
  const bool stop_string = AddTokens(*call, {token}, &msg);
  const auto& eos = engine.model_config().eos_token_ids;
  const bool stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
                        p.stop_token_ids.end() ||
                    (!p.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end());
  const bool length = call->generated.size() >= p.max_tokens ||
                      static_cast<int64_t>(context.size()) + 1 >= engine.max_model_len();
  if (stop || stop_string || length) {
    return Finish(engine, call, std::move(msg),
                  stop || stop_string ? v1::FINISH_REASON_STOP : v1::FINISH_REASON_LENGTH,
                  /*engine_holds_request=*/false);
  }
  // The engine generates the rest: max_tokens counts from the original prompt.
  SamplingParams rest = p;
  rest.max_tokens = p.max_tokens - static_cast<uint32_t>(call->generated.size() - 1);
  absl::Status added = engine.AddPrefilledRequest(call->id, std::move(context), token, rest,
                                                  /*return_on_preemption=*/true);
  if (!added.ok()) return Fail(call, ToGrpcStatus(added));
  call->writer->Send(std::move(msg));
  loop_.load()->SetCallback(call->id, [this, call](LlmEngine& engine, const RequestOutput& o) {
    OnOutput(engine, call, o);
  });
}

void DecodeServiceImpl::OnOutput(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call,
                                 const RequestOutput& o) {
  if (call->done.load()) return;
  if (!o.status.ok()) return Fail(call, ToGrpcStatus(o.status));
  if (o.preempted) {
    // Out of the engine, blocks freed: back in line for a re-prefill.
    ++call->preemptions;
    TANDEM_LOG(INFO) << "request " << call->id << " preempted after " << call->generated.size()
                     << " tokens; it will be re-prefilled";
    return ReserveOrQueue(engine, call);
  }
  v1::GenerateResponse msg;
  if (AddTokens(*call, o.new_tokens, &msg)) {  // a stop string ended the output
    return Finish(engine, call, std::move(msg), v1::FINISH_REASON_STOP,
                  /*engine_holds_request=*/!o.finished);
  }
  if (!o.finished) {
    call->writer->Send(std::move(msg));
    return;
  }
  Finish(engine, call, std::move(msg),
         o.finish_reason == FinishReason::kStop ? v1::FINISH_REASON_STOP
                                                : v1::FINISH_REASON_LENGTH,
         /*engine_holds_request=*/false);
}

}  // namespace tandem
