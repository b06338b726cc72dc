#include "decode_worker/prefill_client.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/status_convert.h"

namespace tandem {

PrefillClient::PrefillClient(Host* host, v1::Prefill::Stub* stub,
                             std::shared_ptr<GenerateCall> call, Args args)
    : host_(host), stub_(stub), call_(std::move(call)), args_(std::move(args)) {
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
  stub_->async()->Prefill(&context_, &request_, this);
  StartRead(&response_);
  StartCall();
}

void PrefillClient::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended; OnDone has the status
  if (call_->done.load()) {
    context_.TryCancel();
    return;
  }
  if (response_.has_header()) {
    absl::Status s = CheckFingerprint(response_.header().fingerprint(), host_->fingerprint());
    if (s.ok() && (response_.header().num_tokens() != args_.tokens.size() ||
                   response_.header().first_token() != args_.num_cached)) {
      s = absl::InternalError(absl::StrCat(
          "prefill worker sent KV for tokens [", response_.header().first_token(), ", ",
          response_.header().num_tokens(), "), expected [", args_.num_cached, ", ",
          args_.tokens.size(), ")"));
    }
    if (!s.ok()) {
      host_->metrics()->KvTransferFailure("fingerprint_mismatch");
      return Abandon(ToGrpcStatus(s));
    }
  } else if (response_.has_chunk()) {
    absl::Status s = VerifyChunk(response_.chunk(), host_->slot_bytes());
    if (absl::IsDataLoss(s)) host_->metrics()->KvTransferFailure("data_loss");
    if (absl::IsDataLoss(s) && args_.attempt == 0) {
      TANDEM_LOG(WARNING) << "request " << call_->id << ": " << s.message() << "; retrying once";
      retry_ = true;
      context_.TryCancel();
      return;
    }
    if (!s.ok()) {
      if (!absl::IsDataLoss(s)) host_->metrics()->KvTransferFailure("other");
      return Abandon(ToGrpcStatus(s));
    }
    kv_bytes_ += response_.chunk().k().size() + response_.chunk().v().size();
    host_->OnKvChunk(call_, std::move(*response_.mutable_chunk()));
  } else if (response_.has_done()) {
    got_done_ = true;
    host_->metrics()->KvTransfer(kv_bytes_, absl::ToDoubleSeconds(absl::Now() - started_));
    host_->OnPrefillToken(call_, response_.done().first_token());
  }
  response_.Clear();
  StartRead(&response_);
}

void PrefillClient::OnDone(const grpc::Status& status) {
  {
    MutexLock lock(&call_->mu);
    if (call_->prefill_context == &context_) call_->prefill_context = nullptr;
  }
  if (retry_ && !call_->done.load()) {
    // Everything the retry needs is this stream's own: no engine-thread state.
    Args again = args_;
    ++again.attempt;
    (new PrefillClient(host_, stub_, call_, std::move(again)))->Start();
  } else if (!abandoned_ && !got_done_ && !call_->done.load()) {
    grpc::Status s = status.ok() ? grpc::Status(grpc::StatusCode::INTERNAL,
                                                "prefill stream ended without a first token")
                                 : status;
    const bool unavailable = s.error_code() == grpc::StatusCode::UNAVAILABLE;
    host_->metrics()->KvTransferFailure(unavailable ? "unavailable" : "other");
    grpc::Status failed(s.error_code(), absl::StrCat("prefill worker: ", s.error_message()));
    if (unavailable) {
      host_->PrefillUnavailable(call_, failed);
    } else {
      host_->Fail(call_, failed);
    }
  }
  delete this;
}

void PrefillClient::Abandon(const grpc::Status& status) {
  abandoned_ = true;
  host_->Fail(call_, status);
  context_.TryCancel();
}

}  // namespace tandem
