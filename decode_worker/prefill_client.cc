#include "decode_worker/prefill_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "common/serving/sampling_proto.h"
#include "common/serving/status_convert.h"

namespace tandem {
namespace {

// The decode worker's fingerprint for KV computed with adapter `lora`.
v1::ModelFingerprint WithLora(v1::ModelFingerprint f, uint64_t lora) {
  f.set_lora_fingerprint(lora);
  return f;
}

}  // namespace

// One attempt's streams: what they came to together.
struct PrefillClient::Attempt {
  int num_streams = 1;
  std::atomic<int> open{1};   // streams not yet ended (OnDone)
  std::atomic<int> done{0};   // streams whose KV is complete
  std::atomic<size_t> bytes{0};
  std::atomic<bool> stalled{false};    // a stream sent nothing in time
  std::atomic<bool> crc_retry{false};  // a chunk failed its CRC32C: retry once
  std::atomic<bool> abandoned{false};  // the call was already failed
  Mutex mu;
  absl::Time started;
  absl::Time first_kv ABSL_GUARDED_BY(mu);  // the first chunk's arrival, any stream
  std::optional<grpc::Status> failure ABSL_GUARDED_BY(mu);  // the first stream failure
  std::vector<grpc::ClientContext*> contexts ABSL_GUARDED_BY(mu);  // streams not yet ended
};

PrefillClient::PrefillClient(Host* host, PrefillPool::Endpoint* endpoint,
                             std::shared_ptr<GenerateCall> call, Args args)
    : host_(host),
      endpoint_(endpoint),
      call_(std::move(call)),
      args_(std::move(args)),
      index_(0),
      attempt_(std::make_shared<Attempt>()),
      first_(this),
      checker_(WithLora(host_->fingerprint(), args_.lora_fingerprint), host_->slot_bytes(),
               args_.num_cached,
               static_cast<int64_t>(args_.tokens.size()), 0, args_.num_streams),
      holds_(3) {
  attempt_->num_streams = std::max(1, args_.num_streams);
  context_.set_deadline(args_.deadline);
  host_->Opened(&context_);
}

PrefillClient::PrefillClient(PrefillClient* first, int index)
    : host_(first->host_),
      endpoint_(first->endpoint_),
      call_(first->call_),
      args_(first->args_),
      index_(index),
      attempt_(first->attempt_),
      first_(first),
      checker_(WithLora(host_->fingerprint(), args_.lora_fingerprint), host_->slot_bytes(),
               args_.num_cached,
               static_cast<int64_t>(args_.tokens.size()), index, args_.num_streams),
      holds_(2) {
  context_.set_deadline(args_.deadline);
  host_->Opened(&context_);
}

PrefillClient::~PrefillClient() { host_->Closed(&context_); }

void PrefillClient::Start() {
  if (index_ == 0) {
    attempt_->started = absl::Now();
    // The endpoint's load while this attempt runs (PrefixRouter bounds it);
    // Decide takes it off.
    endpoint_->load_tokens.fetch_add(Load(), std::memory_order_relaxed);
    request_.set_request_id(absl::StrCat(call_->id, "#", args_.prefill, ".", args_.attempt));
    request_.mutable_prompt_token_ids()->Add(args_.tokens.begin(), args_.tokens.end());
    request_.set_num_cached_tokens(static_cast<uint32_t>(args_.num_cached));
    request_.set_lora_name(call_->params.lora_name);
    request_.set_priority(call_->params.priority);
    request_.set_cache_salt(call_->params.cache_salt);
    // Past the prompt: output of a preempted request, prefilled again.
    FirstTokenSampling(call_->params,
                       static_cast<uint32_t>(args_.tokens.size() - call_->prompt.size()),
                       request_.mutable_sampling());
    MutexLock lock(&call_->mu);
    call_->prefill_context = &context_;
  } else {
    request_.set_request_id(first_->request_.request_id());
    request_.set_stream_index(static_cast<uint32_t>(index_));
  }
  if (attempt_->num_streams > 1) request_.set_num_streams(attempt_->num_streams);
  {
    MutexLock lock(&attempt_->mu);
    attempt_->contexts.push_back(&context_);
  }
  first_message_alarm_.Set(
      std::chrono::system_clock::now() + absl::ToChronoMilliseconds(args_.first_message_timeout),
      [this](bool fired) {
        if (fired && !got_message_.load()) {
          stalled_ = true;
          attempt_->stalled = true;
          context_.TryCancel();
        }
        Unhold();
      });
  TANDEM_CHECK(static_cast<size_t>(index_) < endpoint_->stubs.size())
      << "stream " << index_ << " of an endpoint with " << endpoint_->stubs.size() << " channels";
  RawPrefillStub* stub = endpoint_->stubs[index_].get();
  stub->PrepareBidiStreamingCall(&context_, kPrefillMethod, grpc::StubOptions(), this);
  StartWriteLast(&request_, grpc::WriteOptions());
  StartRead(&response_);
  StartCall();
}

void PrefillClient::Unhold() {
  if (holds_.fetch_sub(1) == 1) delete this;
}

void PrefillClient::CancelOthers() {
  MutexLock lock(&attempt_->mu);
  for (grpc::ClientContext* c : attempt_->contexts) {
    if (c != &context_) c->TryCancel();
  }
}

void PrefillClient::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended; OnDone has the status
  if (!got_message_.exchange(true)) first_message_alarm_.Cancel();
  if (call_->done.load()) {
    context_.TryCancel();
    return;
  }
  // The slices stay alive with the chunk until the engine thread has
  // imported it.
  absl::StatusOr<ReceivedMessage> msg = ParseReceived(&response_);
  if (!msg.ok()) {
    if (!attempt_->abandoned.exchange(true)) {
      host_->metrics()->KvTransferFailure("other");
      host_->Fail(call_, ToGrpcStatus(msg.status()));
    }
    CancelOthers();
    context_.TryCancel();
    return;
  }
  if (msg->chunk.has_value()) {
    absl::Status s = checker_.Chunk(*msg->chunk);
    if (checker_.failure() == KvStreamChecker::Failure::kDataLoss && args_.attempt == 0) {
      if (!attempt_->crc_retry.exchange(true)) {
        host_->metrics()->KvTransferFailure("data_loss");
        TANDEM_LOG(WARNING) << "request " << call_->id << ": " << s.message() << "; retrying once";
      }
      CancelOthers();
      context_.TryCancel();
      return;
    }
    if (!s.ok()) return Abandon(ToGrpcStatus(s));
    {
      MutexLock lock(&attempt_->mu);
      if (attempt_->first_kv == absl::Time()) attempt_->first_kv = absl::Now();
    }
    host_->OnKvChunk(call_, *std::move(msg->chunk));
  } else if (msg->message.has_header()) {
    absl::Status s = checker_.Header(msg->message.header());
    if (!s.ok()) return Abandon(ToGrpcStatus(s));
    // The request is open on the prefill worker: its other streams attach.
    if (index_ == 0) {
      for (int i = 1; i < attempt_->num_streams; ++i) {
        ++attempt_->open;
        (new PrefillClient(this, i))->Start();
      }
    }
  } else if (msg->message.has_done()) {
    absl::Status s = checker_.Done();
    if (!s.ok()) return Abandon(ToGrpcStatus(s));
    got_done_ = true;
    attempt_->bytes += checker_.bytes();
    if (attempt_->done.fetch_add(1) + 1 == attempt_->num_streams) {  // the KV is complete
      const absl::Time now = absl::Now();
      absl::Time first;
      {
        MutexLock lock(&attempt_->mu);
        first = attempt_->first_kv == absl::Time() ? now : attempt_->first_kv;
      }
      host_->metrics()->KvTransferWait(absl::ToDoubleSeconds(first - attempt_->started));
      host_->metrics()->KvTransfer(attempt_->bytes.load(), absl::ToDoubleSeconds(now - first));
      host_->metrics()->KvTransferSaved(static_cast<size_t>(args_.num_cached) * 2 *
                                        host_->slot_bytes() * host_->fingerprint().num_layers());
      host_->OnPrefillToken(call_, msg->message.done().first_token(),
                            FromProto(msg->message.done().first_token_logprobs()));
    }
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
  if (index_ == 0) {
    MutexLock lock(&call_->mu);
    if (call_->prefill_context == &context_) call_->prefill_context = nullptr;
  }
  bool failed = false;
  {
    MutexLock lock(&attempt_->mu);
    attempt_->contexts.erase(
        std::find(attempt_->contexts.begin(), attempt_->contexts.end(), &context_));
    if (!got_done_) {  // this stream's share of the KV is not complete
      failed = !attempt_->failure.has_value();
      if (failed) {
        grpc::Status s = status;
        if (stalled_.load()) {
          s = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           absl::StrCat(endpoint_->target, " sent nothing within ",
                                        absl::FormatDuration(args_.first_message_timeout)));
        } else if (status.ok()) {  // ended without `done`
          s = grpc::Status(grpc::StatusCode::DATA_LOSS,
                           absl::StrCat("the KV stream ended without its last message (",
                                        checker_.bytes(), " KV bytes received)"));
        }
        attempt_->failure = s;
      }
    }
  }
  if (failed) CancelOthers();
  if (attempt_->open.fetch_sub(1) == 1) first_->Decide();
  Unhold();
}

int64_t PrefillClient::Load() const {
  return static_cast<int64_t>(args_.tokens.size()) - args_.num_cached;
}

void PrefillClient::Decide() {
  endpoint_->load_tokens.fetch_sub(Load(), std::memory_order_relaxed);
  const bool complete = attempt_->done.load() == attempt_->num_streams;
  const bool live = !attempt_->abandoned.load() && !complete && !call_->done.load();
  grpc::Status s;
  {
    MutexLock lock(&attempt_->mu);
    s = attempt_->failure.value_or(grpc::Status(grpc::StatusCode::INTERNAL, "no stream failed"));
  }
  PrefillPool* pool = host_->pool();
  const bool stalled = attempt_->stalled.load();
  if (live && attempt_->crc_retry.load()) {
    Retry(pool->Pick(endpoint_));
  } else if (live) {
    const char* reason = "other";
    if (stalled) {
      pool->Eject(endpoint_);
      reason = "stalled";
    } else if (s.error_code() == grpc::StatusCode::DATA_LOSS) {
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
    if (next != nullptr && (next != endpoint_ || !stalled) && args_.attempt + 1 < kMaxAttempts &&
        std::chrono::system_clock::now() < args_.deadline) {
      TANDEM_LOG(WARNING) << "request " << call_->id << ": prefill on " << endpoint_->target
                          << ": " << s.error_message() << "; retrying on " << next->target;
      Retry(next);
    } else if (s.error_code() == grpc::StatusCode::NOT_FOUND && !call_->params.lora_name.empty() &&
               !args_.lora_given && std::chrono::system_clock::now() < args_.deadline &&
               host_->LoadLoraOn(
                   endpoint_, call_->params.lora_name, args_.lora_fingerprint,
                   [host = host_, endpoint = endpoint_, call = call_, again = Args(args_), s](
                       const grpc::Status& loaded) mutable {
                     if (!loaded.ok()) {
                       return host->Fail(call, grpc::Status(
                                                   s.error_code(),
                                                   absl::StrCat("prefill worker: ", s.error_message(),
                                                                "; loading it there failed: ",
                                                                loaded.error_message())));
                     }
                     ++again.attempt;
                     again.lora_given = true;
                     (new PrefillClient(host, endpoint, call, std::move(again)))->Start();
                   })) {
      TANDEM_LOG(WARNING) << "request " << call_->id << ": prefill on " << endpoint_->target
                          << ": " << s.error_message() << "; loading the adapter there, then "
                          << "retrying";
    } else {
      // A peer that is no prefill worker (a gateway naming this decode
      // worker itself, another service) answers UNIMPLEMENTED with no text.
      const bool not_prefill = s.error_code() == grpc::StatusCode::UNIMPLEMENTED;
      const std::string why =
          not_prefill ? "it does not serve tandem.v1.Prefill (not a prefill worker)"
          : s.error_message().empty() ? absl::StrCat("gRPC status ", static_cast<int>(s.error_code()))
                                      : s.error_message();
      grpc::Status failed(not_prefill && call_->prefill_endpoint != nullptr
                              ? grpc::StatusCode::INVALID_ARGUMENT
                              : s.error_code(),
                          absl::StrCat(call_->prefill_endpoint != nullptr ? "x-prefiller-host-port: " : "",
                                       "prefill worker ", endpoint_->target, ": ", why));
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
  Unhold();  // the attempt's hold
}

void PrefillClient::Abandon(const grpc::Status& status) {
  if (!attempt_->abandoned.exchange(true)) {
    host_->metrics()->KvTransferFailure(KvStreamChecker::FailureName(checker_.failure()));
    if (checker_.failure() == KvStreamChecker::Failure::kIncomplete ||
        checker_.failure() == KvStreamChecker::Failure::kDataLoss) {
      host_->PrefillFailed(call_, status);
    } else {
      host_->Fail(call_, status);
    }
  }
  CancelOthers();
  context_.TryCancel();
}

}  // namespace tandem
