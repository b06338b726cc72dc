#include "decode_worker/prefill_client.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/serving/status_convert.h"

namespace tandem {

PrefillClient::PrefillClient(Host* host, PrefillPool::Endpoint* endpoint,
                             std::shared_ptr<GenerateCall> call, Args args)
    : host_(host),
      endpoint_(endpoint),
      call_(std::move(call)),
      args_(std::move(args)),
      checker_(host_->fingerprint(), host_->slot_bytes(), args_.num_cached,
               static_cast<int64_t>(args_.tokens.size())) {
  context_.set_deadline(args_.deadline);
}

void PrefillClient::Start() {
  started_ = absl::Now();
  request_.set_request_id(absl::StrCat(call_->id, "#", args_.prefill, ".", args_.attempt));
  request_.mutable_prompt_token_ids()->Add(args_.tokens.begin(), args_.tokens.end());
  request_.set_num_cached_tokens(static_cast<uint32_t>(args_.num_cached));
  v1::SamplingParams* p = request_.mutable_sampling();
  p->set_max_tokens(1);
  p->set_temperature(call_->params.temperature);
  p->set_top_p(call_->params.top_p);
  p->set_top_k(call_->params.top_k);
  p->set_seed(call_->params.seed);
  {
    MutexLock lock(&call_->mu);
    call_->prefill_context = &context_;
  }
  first_message_alarm_.Set(
      std::chrono::system_clock::now() + absl::ToChronoMilliseconds(args_.first_message_timeout),
      [this](bool fired) {
        if (fired && !got_message_.load()) {
          stalled_ = true;
          context_.TryCancel();
        }
        Unhold();
      });
  endpoint_->stub->PrepareBidiStreamingCall(&context_, kPrefillMethod, grpc::StubOptions(), this);
  StartWriteLast(&request_, grpc::WriteOptions());
  StartRead(&response_);
  StartCall();
}

void PrefillClient::Unhold() {
  if (holds_.fetch_sub(1) == 1) delete this;
}

void PrefillClient::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended; OnDone has the status
  if (!got_message_.exchange(true)) first_message_alarm_.Cancel();
  if (call_->done.load()) {
    context_.TryCancel();
    return;
  }
  // The slices are shared (reference counted), not copied; they stay alive
  // with the chunk until the engine thread has imported it.
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  std::vector<absl::string_view> pieces;
  if (response_.Dump(slices.get()).ok()) {
    pieces.reserve(slices->size());
    for (const grpc::Slice& slice : *slices) {
      pieces.emplace_back(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  response_.Clear();
  absl::StatusOr<ReceivedMessage> msg = ParseReceived(std::move(pieces), std::move(slices));
  if (!msg.ok()) {
    host_->metrics()->KvTransferFailure("other");
    abandoned_ = true;
    host_->Fail(call_, ToGrpcStatus(msg.status()));
    context_.TryCancel();
    return;
  }
  if (msg->chunk.has_value()) {
    absl::Status s = checker_.Chunk(*msg->chunk);
    if (checker_.failure() == KvStreamChecker::Failure::kDataLoss && args_.attempt == 0) {
      host_->metrics()->KvTransferFailure("data_loss");
      TANDEM_LOG(WARNING) << "request " << call_->id << ": " << s.message() << "; retrying once";
      crc_retry_ = true;
      context_.TryCancel();
      return;
    }
    if (!s.ok()) return Abandon(ToGrpcStatus(s));
    if (first_kv_ == absl::Time()) first_kv_ = absl::Now();
    host_->OnKvChunk(call_, *std::move(msg->chunk));
  } else if (msg->message.has_header()) {
    absl::Status s = checker_.Header(msg->message.header());
    if (!s.ok()) return Abandon(ToGrpcStatus(s));
  } else if (msg->message.has_done()) {
    absl::Status s = checker_.Done();
    if (!s.ok()) return Abandon(ToGrpcStatus(s));
    got_done_ = true;
    const absl::Time now = absl::Now();
    const absl::Time first = first_kv_ == absl::Time() ? now : first_kv_;
    host_->metrics()->KvTransferWait(absl::ToDoubleSeconds(first - started_));
    host_->metrics()->KvTransfer(checker_.bytes(), absl::ToDoubleSeconds(now - first));
    host_->metrics()->KvTransferSaved(static_cast<size_t>(args_.num_cached) * 2 *
                                      host_->slot_bytes() * host_->fingerprint().num_layers());
    host_->OnPrefillToken(call_, msg->message.done().first_token());
  }
  StartRead(&response_);
}

void PrefillClient::Retry(PrefillPool::Endpoint* endpoint) {
  // Everything the retry needs is this stream's own: no engine-thread state.
  Args again = args_;
  ++again.attempt;
  (new PrefillClient(host_, endpoint, call_, std::move(again)))->Start();
}

void PrefillClient::OnDone(const grpc::Status& status) {
  first_message_alarm_.Cancel();
  {
    MutexLock lock(&call_->mu);
    if (call_->prefill_context == &context_) call_->prefill_context = nullptr;
  }
  const bool live = !abandoned_ && !got_done_ && !call_->done.load();
  PrefillPool* pool = host_->pool();
  if (live && crc_retry_) {
    Retry(pool->Pick(endpoint_));
  } else if (live) {
    grpc::Status s = status;
    const char* reason = "other";
    if (stalled_.load()) {
      pool->Eject(endpoint_);
      s = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       absl::StrCat(endpoint_->target, " sent nothing within ",
                                    absl::FormatDuration(args_.first_message_timeout)));
      reason = "stalled";
    } else if (status.ok()) {  // ended without `done`
      s = grpc::Status(grpc::StatusCode::DATA_LOSS,
                       absl::StrCat("the KV stream ended without its last message (",
                                    checker_.bytes(), " KV bytes received)"));
      reason = "incomplete";
    } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      reason = "unavailable";
    } else if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      reason = "deadline";
    }
    host_->metrics()->KvTransferFailure(reason);
    // UNAVAILABLE is retried, on another endpoint where there is one: a
    // stalled endpoint only elsewhere; otherwise the same one too (its
    // channel reconnects, or balances to another address of a DNS name):
    // a call that met a connection as it closed (GOAWAY at
    // --max-connection-age-seconds, a pod replaced) fails with "Broken pipe".
    const bool retryable = s.error_code() == grpc::StatusCode::UNAVAILABLE;
    PrefillPool::Endpoint* next = retryable ? pool->Pick(endpoint_) : nullptr;
    if (next != nullptr && (next != endpoint_ || !stalled_.load()) &&
        args_.attempt + 1 < kMaxAttempts && std::chrono::system_clock::now() < args_.deadline) {
      TANDEM_LOG(WARNING) << "request " << call_->id << ": prefill on " << endpoint_->target
                          << ": " << s.error_message() << "; retrying on " << next->target;
      Retry(next);
    } else {
      grpc::Status failed(s.error_code(), absl::StrCat("prefill worker: ", s.error_message()));
      const bool recoverable = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                               s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                               s.error_code() == grpc::StatusCode::DATA_LOSS;
      if (recoverable) {
        host_->PrefillFailed(call_, failed);
      } else {
        host_->Fail(call_, failed);
      }
    }
  }
  Unhold();
}

void PrefillClient::Abandon(const grpc::Status& status) {
  abandoned_ = true;
  host_->metrics()->KvTransferFailure(KvStreamChecker::FailureName(checker_.failure()));
  if (checker_.failure() == KvStreamChecker::Failure::kIncomplete ||
      checker_.failure() == KvStreamChecker::Failure::kDataLoss) {
    host_->PrefillFailed(call_, status);
  } else {
    host_->Fail(call_, status);
  }
  context_.TryCancel();
}

}  // namespace tandem
