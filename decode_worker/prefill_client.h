// PrefillClient: one tandem.v1.Prefill stream of the decode worker. It sends
// the tokens whose KV the decode side lacks (with how many leading tokens it
// already holds), checks the header's fingerprint and range and every chunk's
// checksum, and hands chunks and the sampled token to its Host. A corrupt
// chunk on the first attempt starts one more stream with the same tokens.
// Runs on gRPC's reactor threads; its transfer state (bytes, timing, retry)
// is its own, and it reads only the call's immutable fields.
//
// Lifetime: created and started on the engine thread (or by the stream it
// retries); deletes itself in OnDone.
#ifndef TANDEM_DECODE_WORKER_PREFILL_CLIENT_H_
#define TANDEM_DECODE_WORKER_PREFILL_CLIENT_H_

#include <chrono>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "common/serving/metrics.h"
#include "decode_worker/generate_call.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {

class PrefillClient : public grpc::ClientReadReactor<v1::PrefillResponse> {
 public:
  // What the client needs from the decode service. Every method may be called
  // from a gRPC thread.
  class Host {
   public:
    virtual ~Host() = default;
    virtual const v1::ModelFingerprint& fingerprint() const = 0;
    virtual size_t slot_bytes() const = 0;
    virtual WorkerMetrics* metrics() = 0;
    // A verified chunk of the call's KV.
    virtual void OnKvChunk(const std::shared_ptr<GenerateCall>& call, v1::KvChunk chunk) = 0;
    // The KV is complete; `token` was sampled after the last prefill token.
    virtual void OnPrefillToken(const std::shared_ptr<GenerateCall>& call, int32_t token) = 0;
    // No prefill worker could be reached (UNAVAILABLE).
    virtual void PrefillUnavailable(const std::shared_ptr<GenerateCall>& call,
                                    const grpc::Status& status) = 0;
    virtual void Fail(const std::shared_ptr<GenerateCall>& call, const grpc::Status& status) = 0;
  };

  struct Args {
    std::vector<int32_t> tokens;  // prompt and output so far
    int64_t num_cached = 0;       // leading tokens whose KV the decode side holds
    int prefill = 0;              // the call's prefill number (request id suffix)
    int attempt = 0;
    std::chrono::system_clock::time_point deadline;
  };
  PrefillClient(Host* host, v1::Prefill::Stub* stub, std::shared_ptr<GenerateCall> call,
                Args args);

  void Start();
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  void Abandon(const grpc::Status& status);

  Host* host_;
  v1::Prefill::Stub* stub_;
  std::shared_ptr<GenerateCall> call_;
  const Args args_;
  grpc::ClientContext context_;
  v1::PrefillRequest request_;
  v1::PrefillResponse response_;
  absl::Time started_;
  size_t kv_bytes_ = 0;
  bool retry_ = false;
  bool abandoned_ = false;
  bool got_done_ = false;
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_PREFILL_CLIENT_H_
