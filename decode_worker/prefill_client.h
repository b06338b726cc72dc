// PrefillClient: one tandem.v1.Prefill stream of the decode worker. It sends
// the tokens whose KV the decode side lacks (with how many leading tokens it
// already holds) to an endpoint of the PrefillPool, checks the stream with a
// KvStreamChecker (fingerprint and range, each chunk's size and checksum,
// every (layer, token) row exactly once) and hands verified chunks to its
// Host; the sampled token is handed over only once the KV is known complete.
// Messages arrive as bytes: a chunk's rows are checked and imported from the
// slices gRPC received them in (ParseReceived), never copied into a message.
//
// What ends a stream early, and what follows:
//  - no first message within the first-message timeout (a frozen or
//    overloaded worker; a healthy one sends its header at admission): the
//    endpoint is ejected and the prefill retried on another one;
//  - UNAVAILABLE: retried on another endpoint, if there is one;
//  - a chunk failing its CRC32C: retried once (transient corruption);
//  - all of those once out of endpoints or attempts, an incomplete stream,
//    or the prefill budget (DEADLINE_EXCEEDED) passing: PrefillFailed, where
//    the service prefills locally (--prefill-fallback=local) or fails;
//  - a fingerprint mismatch or a malformed stream: Fail.
// Every failure is counted in tandem_kv_transfer_failures_total{reason}.
//
// Several streams (Args::num_streams > 1, --kv-streams): the first stream's
// client opens the others (tandem.proto's stream_index) on their own
// connections once its header arrives; each checks its share of the layers.
// The attempt is one: its KV is complete when every stream has sent `done`,
// any stream's failure cancels the others, and the outcome (success, retry,
// fallback or failure, as above) is decided once, when the last stream ends.
//
// Threads: gRPC's reactor threads and its alarm thread; the transfer state is
// the attempt's own, and it reads only the call's immutable fields.
// Lifetime: created and started on the engine thread (or by the stream it
// retries, or by the attempt's first stream); deletes itself once its stream
// is done and its timer has fired or been cancelled (the first stream: and
// the attempt is decided).
#ifndef TANDEM_DECODE_WORKER_PREFILL_CLIENT_H_
#define TANDEM_DECODE_WORKER_PREFILL_CLIENT_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "common/serving/kv_stream_checker.h"
#include "common/serving/metrics.h"
#include "decode_worker/generate_call.h"
#include "decode_worker/prefill_pool.h"
#include "grpcpp/alarm.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {

class PrefillClient : public grpc::ClientBidiReactor<v1::PrefillRequest, grpc::ByteBuffer> {
 public:
  // What the client needs from the decode service. Every method may be called
  // from a gRPC thread.
  class Host {
   public:
    virtual ~Host() = default;
    virtual const v1::ModelFingerprint& fingerprint() const = 0;
    virtual size_t slot_bytes() const = 0;
    virtual WorkerMetrics* metrics() = 0;
    virtual PrefillPool* pool() = 0;
    // A verified chunk of the call's KV.
    virtual void OnKvChunk(const std::shared_ptr<GenerateCall>& call, ReceivedChunk chunk) = 0;
    // The KV is complete; `token` was sampled after the last prefill token.
    virtual void OnPrefillToken(const std::shared_ptr<GenerateCall>& call, int32_t token,
                                TokenLogprobs logprobs) = 0;
    // No prefill worker delivered complete KV in time (UNAVAILABLE,
    // DEADLINE_EXCEEDED, DATA_LOSS): the request may be prefilled locally.
    virtual void PrefillFailed(const std::shared_ptr<GenerateCall>& call,
                               const grpc::Status& status) = 0;
    // Ends the call with `status` (no local fallback).
    virtual void Fail(const std::shared_ptr<GenerateCall>& call, const grpc::Status& status) = 0;
    // A client was made (its context may be cancelled from then on) or is
    // being deleted: a host that stops cancels the clients still alive and
    // waits for them, for they call into it.
    virtual void Opened(grpc::ClientContext* context) = 0;
    virtual void Closed(grpc::ClientContext* context) = 0;
    // The endpoint lacks the call's LoRA adapter (NOT_FOUND): if this worker
    // loaded it at run time with these weights, has the endpoint load it too
    // (a prefill worker restarted, or added, since) and returns true; `done`
    // gets that call's status. False: the adapter is not one to give it.
    virtual bool LoadLoraOn(PrefillPool::Endpoint* endpoint, const std::string& name,
                            uint64_t fingerprint, std::function<void(const grpc::Status&)> done) = 0;
  };

  struct Args {
    std::vector<int32_t> tokens;  // prompt and output so far
    int64_t num_cached = 0;       // leading tokens whose KV the decode side holds
    int prefill = 0;              // the call's prefill number (request id suffix)
    int attempt = 0;
    // The whole prefill's budget (every attempt), and one attempt's wait for
    // its first message.
    std::chrono::system_clock::time_point deadline;
    absl::Duration first_message_timeout = absl::Seconds(5);
    int num_streams = 1;  // streams the KV is split over (at most the endpoint's stubs)
    uint64_t lora_fingerprint = 0;  // the KV's adapter, as the stream's header must say
    // An endpoint was given the adapter for this prefill (Host::LoadLoraOn):
    // once, whatever the attempts spent on an unreachable one before.
    bool lora_given = false;
  };
  static constexpr int kMaxAttempts = 3;

  PrefillClient(Host* host, PrefillPool::Endpoint* endpoint, std::shared_ptr<GenerateCall> call,
                Args args);
  ~PrefillClient() override;

  void Start();
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  struct Attempt;
  // Stream `index` of `first`'s attempt.
  PrefillClient(PrefillClient* first, int index);
  // Ends the call at once with `status` (counted under the checker's reason).
  void Abandon(const grpc::Status& status);
  // Cancels every stream of the attempt but this one.
  void CancelOthers();
  // The first stream: what the attempt came to, once all its streams ended.
  void Decide();
  // The prompt tokens this attempt asks its endpoint to compute.
  int64_t Load() const;
  // Starts attempt + 1 on `endpoint`.
  void Retry(PrefillPool::Endpoint* endpoint);
  // Drops one of the holds (the stream's, the timer's; the first stream's:
  // the attempt's); the last deletes.
  void Unhold();

  Host* host_;
  PrefillPool::Endpoint* endpoint_;
  std::shared_ptr<GenerateCall> call_;
  const Args args_;
  const int index_;  // stream index in the attempt
  std::shared_ptr<Attempt> attempt_;
  PrefillClient* first_;  // the attempt's first stream (this one for it)
  grpc::ClientContext context_;
  grpc::Alarm first_message_alarm_;
  v1::PrefillRequest request_;
  grpc::ByteBuffer response_;
  KvStreamChecker checker_;
  std::atomic<bool> got_message_{false};
  std::atomic<bool> stalled_{false};  // the first-message timer fired
  std::atomic<int> holds_;
  bool got_done_ = false;  // this stream's share of the KV is complete
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_PREFILL_CLIENT_H_
