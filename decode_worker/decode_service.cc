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

// One Generate() stream and everything it holds.
struct GenerateCall {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::shared_ptr<StreamWriter<v1::GenerateResponse>> writer;
  std::chrono::system_clock::time_point deadline;
  absl::Time queued_at;        // Generate() arrival
  absl::Time prefill_started;  // current prefill attempt
  absl::Time last_token;
  size_t kv_bytes = 0;         // received in the current attempt
  int attempt = 0;
  // Text of the output (null without a tokenizer); engine thread only.
  std::unique_ptr<TextOutput> text;
  uint32_t completion_tokens = 0;  // engine thread only
  // Counted in waiting_for_kv_ (engine thread only): from the first prefill
  // attempt until the first token or the end of the call.
  bool awaiting_kv = false;
  std::atomic<bool> done{false};  // ended: later tasks are no-ops
  absl::Mutex mu;
  grpc::ClientContext* prefill_context ABSL_GUARDED_BY(mu) = nullptr;
};

// Reads one Prefill stream and forwards it to the engine thread.
class PrefillClient : public grpc::ClientReadReactor<v1::PrefillResponse> {
 public:
  PrefillClient(DecodeServiceImpl* service, std::shared_ptr<GenerateCall> call)
      : service_(service), call_(std::move(call)) {}

  void Start(v1::Prefill::Stub* stub) {
    request_.set_request_id(absl::StrCat(call_->id, "#", call_->attempt));
    request_.mutable_prompt_token_ids()->Add(call_->prompt.begin(), call_->prompt.end());
    v1::SamplingParams* p = request_.mutable_sampling();
    p->set_max_tokens(1);
    p->set_temperature(call_->params.temperature);
    p->set_top_p(call_->params.top_p);
    p->set_top_k(call_->params.top_k);
    p->set_seed(call_->params.seed);
    context_.set_deadline(call_->deadline);
    {
      absl::MutexLock lock(&call_->mu);
      call_->prefill_context = &context_;
    }
    stub->async()->Prefill(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone has the status
    if (call_->done.load()) {
      context_.TryCancel();
      return;
    }
    EngineLoop* loop = service_->loop_.load();
    if (response_.has_header()) {
      absl::Status s = CheckFingerprint(response_.header().fingerprint(), service_->fingerprint_);
      if (s.ok() && response_.header().num_tokens() != call_->prompt.size()) {
        s = absl::InternalError(absl::StrCat("prefill worker sent KV for ",
                                             response_.header().num_tokens(), " tokens, expected ",
                                             call_->prompt.size()));
      }
      if (!s.ok()) {
        service_->metrics_->KvTransferFailure("fingerprint_mismatch");
        return Abandon(ToGrpcStatus(s));
      }
    } else if (response_.has_chunk()) {
      absl::Status s = VerifyChunk(response_.chunk(), service_->slot_bytes_);
      if (absl::IsDataLoss(s)) service_->metrics_->KvTransferFailure("data_loss");
      if (absl::IsDataLoss(s) && call_->attempt == 0) {
        TANDEM_LOG(WARNING) << "request " << call_->id << ": " << s.message() << "; retrying once";
        retry_ = true;
        context_.TryCancel();
        return;
      }
      if (!s.ok()) {
        if (!absl::IsDataLoss(s)) service_->metrics_->KvTransferFailure("other");
        return Abandon(ToGrpcStatus(s));
      }
      call_->kv_bytes += response_.chunk().k().size() + response_.chunk().v().size();
      loop->Post([call = call_, chunk = std::move(*response_.mutable_chunk()),
                  service = service_](LlmEngine& engine) {
        if (call->done.load()) return;
        absl::Status w = ImportChunk(engine, call->id, chunk);
        if (!w.ok()) service->Fail(call, ToGrpcStatus(w));
      });
    } else if (response_.has_done()) {
      got_done_ = true;
      service_->metrics_->KvTransfer(call_->kv_bytes,
                                     absl::ToDoubleSeconds(absl::Now() - call_->prefill_started));
      const int32_t token = response_.done().first_token();
      loop->Post([call = call_, service = service_, token](LlmEngine& engine) {
        service->OnFirstToken(engine, call, token);
      });
    }
    response_.Clear();
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&call_->mu);
      call_->prefill_context = nullptr;
    }
    if (retry_ && !call_->done.load()) {
      ++call_->attempt;
      service_->StartPrefill(call_);
    } else if (!abandoned_ && !got_done_ && !call_->done.load()) {
      grpc::Status s = status.ok() ? grpc::Status(grpc::StatusCode::INTERNAL,
                                                  "prefill stream ended without a first token")
                                   : status;
      service_->metrics_->KvTransferFailure(
          s.error_code() == grpc::StatusCode::UNAVAILABLE ? "unavailable" : "other");
      service_->Fail(call_, grpc::Status(s.error_code(),
                                         absl::StrCat("prefill worker: ", s.error_message())));
    }
    delete this;
  }

 private:
  void Abandon(const grpc::Status& status) {
    abandoned_ = true;
    service_->Fail(call_, status);
    context_.TryCancel();
  }

  DecodeServiceImpl* service_;
  std::shared_ptr<GenerateCall> call_;
  grpc::ClientContext context_;
  v1::PrefillRequest request_;
  v1::PrefillResponse response_;
  bool retry_ = false;
  bool abandoned_ = false;
  bool got_done_ = false;
};

DecodeServiceImpl::DecodeServiceImpl(WorkerState* state, WorkerMetrics* metrics,
                                     std::shared_ptr<grpc::Channel> prefill_channel,
                                     DecodeOptions options, const Tokenizer* tokenizer)
    : state_(state),
      metrics_(metrics),
      prefill_(v1::Prefill::NewStub(prefill_channel)),
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
  absl::MutexLock lock(&mu_);
  in_flight_.erase(id);
}

void DecodeServiceImpl::Fail(const std::shared_ptr<GenerateCall>& call, const grpc::Status& status) {
  if (call->done.exchange(true)) return;
  {
    absl::MutexLock lock(&call->mu);
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

bool DecodeServiceImpl::AddText(GenerateCall& call, const std::vector<int32_t>& tokens,
                                v1::GenerateResponse* msg) {
  call.completion_tokens += static_cast<uint32_t>(tokens.size());
  if (call.text == nullptr) return false;
  msg->set_text(call.text->Add(tokens));
  if (!call.text->stopped()) return false;
  msg->set_finish_reason(v1::FINISH_REASON_STOP);
  msg->set_stop_string(call.text->matched_stop());
  msg->mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(call.prompt.size()));
  msg->mutable_usage()->set_completion_tokens(call.completion_tokens);
  return true;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* DecodeServiceImpl::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto [writer, admitted] = OpenStream<v1::GenerateResponse>(state_, metrics_);
  if (!admitted) return writer.get();
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
    absl::MutexLock lock(&mu_);
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
  const auto limit = std::chrono::system_clock::now() +
                     absl::ToChronoSeconds(options_.prefill_timeout);
  call->deadline = std::min(context->deadline(), limit);
  writer->OnCancelled([this, call, context] {
    // gRPC reports a passed deadline as a cancel: tell the two apart.
    if (context->deadline() <= std::chrono::system_clock::now()) {
      Fail(call, grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the request's deadline passed"));
    } else {
      Fail(call, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"));
    }
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
  // The prompt's KV plus the slot of the first token.
  absl::Status r = engine.ReserveKv(call->id, static_cast<int64_t>(call->prompt.size()) + 1);
  if (r.ok()) return BeginKvTransfer(call);
  if (!absl::IsResourceExhausted(r)) return Fail(call, ToGrpcStatus(r));
  if (static_cast<int>(pending_.size()) >= options_.max_waiting) {
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
    absl::Status r = engine.ReserveKv(call->id, static_cast<int64_t>(call->prompt.size()) + 1);
    if (r.ok()) {
      pending_.pop_front();
      BeginKvTransfer(call);
      continue;
    }
    if (now - call->queued_at > options_.queue_timeout) {
      pending_.pop_front();
      Fail(call, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              absl::StrCat("KV cache full: waited ",
                                           absl::FormatDuration(options_.queue_timeout),
                                           " for ", call->prompt.size() + 1, " token slots (",
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
  StartPrefill(call);
}

void DecodeServiceImpl::StartPrefill(const std::shared_ptr<GenerateCall>& call) {
  if (call->done.load()) return;
  call->prefill_started = absl::Now();
  call->kv_bytes = 0;
  auto* client = new PrefillClient(this, call);
  client->Start(prefill_.get());
}

void DecodeServiceImpl::OnFirstToken(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call,
                                     int32_t token) {
  if (call->done.load()) return;
  if (call->awaiting_kv) {  // the KV is here: running from now on
    call->awaiting_kv = false;
    --waiting_for_kv_;
  }
  const SamplingParams& p = call->params;
  const auto& eos = engine.model_config().eos_token_ids;
  const bool stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
                        p.stop_token_ids.end() ||
                    (!p.ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end());
  v1::GenerateResponse first;
  first.set_request_id(call->id);
  first.add_token_ids(token);
  call->last_token = absl::Now();
  metrics_->TimeToFirstToken(absl::ToDoubleSeconds(call->last_token - call->queued_at));
  metrics_->GenerationTokens(1);
  const bool stop_string = AddText(*call, {token}, &first);
  if (stop || stop_string || p.max_tokens <= 1) {
    if (call->text != nullptr && !stop_string) first.mutable_text()->append(call->text->Finish());
    first.set_finish_reason(stop || stop_string ? v1::FINISH_REASON_STOP
                                                : v1::FINISH_REASON_LENGTH);
    first.mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(call->prompt.size()));
    first.mutable_usage()->set_completion_tokens(1);
    call->done = true;
    metrics_->EndToEndLatency(absl::ToDoubleSeconds(absl::Now() - call->queued_at));
    call->writer->Send(std::move(first));
    call->writer->End(grpc::Status::OK);
    (void)engine.Abort(call->id);
    Release(call->id);
    return;
  }
  absl::Status added = engine.AddPrefilledRequest(call->id, call->prompt, token, p);
  if (!added.ok()) return Fail(call, ToGrpcStatus(added));
  call->writer->Send(std::move(first));
  loop_.load()->SetCallback(call->id, [this, call](LlmEngine& engine, const RequestOutput& o) {
    if (call->done.load()) return;
    v1::GenerateResponse msg;
    for (int32_t t : o.new_tokens) msg.add_token_ids(t);
    if (!o.new_tokens.empty()) {
      const absl::Time now = absl::Now();
      metrics_->InterTokenLatency(absl::ToDoubleSeconds(now - call->last_token));
      metrics_->GenerationTokens(static_cast<int>(o.new_tokens.size()));
      call->last_token = now;
    }
    if (!o.status.ok()) return Fail(call, ToGrpcStatus(o.status));
    if (AddText(*call, o.new_tokens, &msg)) {  // a stop string ended the output
      call->done = true;
      metrics_->EndToEndLatency(absl::ToDoubleSeconds(absl::Now() - call->queued_at));
      call->writer->Send(std::move(msg));
      call->writer->End(grpc::Status::OK);
      Retire(call);  // the engine still runs the request: abort it after this step
      return;
    }
    if (!o.finished) {
      call->writer->Send(std::move(msg));
      return;
    }
    if (call->text != nullptr) msg.mutable_text()->append(call->text->Finish());
    msg.set_finish_reason(o.finish_reason == FinishReason::kStop ? v1::FINISH_REASON_STOP
                                                                 : v1::FINISH_REASON_LENGTH);
    msg.mutable_usage()->set_prompt_tokens(o.prompt_tokens);
    msg.mutable_usage()->set_completion_tokens(o.completion_tokens);
    call->done = true;
    metrics_->EndToEndLatency(absl::ToDoubleSeconds(absl::Now() - call->queued_at));
    call->writer->Send(std::move(msg));
    call->writer->End(grpc::Status::OK);
    Release(call->id);
  });
}

}  // namespace tandem
