// The Decode service, Tandem's front door. Generate():
//   1. validates the request (on the engine thread) and reserves KV blocks for
//      the prompt, waiting in a bounded queue while the cache is full;
//   2. pulls the prompt's KV from a prefill worker (tandem.v1.Prefill, over a
//      round_robin channel) and writes each chunk into its own paged cache as
//      it arrives; a fingerprint mismatch is FAILED_PRECONDITION, a bad
//      checksum is retried once, then DATA_LOSS;
//   3. streams the first token, then joins the continuous decode batch
//      (FULL_DECODE_ONLY graphs by default) and streams every token.
// With a tokenizer, a text prompt is tokenized on the RPC thread, and every
// message carries its new text (incremental detokenization; stop strings end
// the output before them).
// Cancellation, deadlines and failures free every KV block of the request.
#ifndef TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
#define TANDEM_DECODE_WORKER_DECODE_SERVICE_H_

#include <atomic>
#include <deque>
#include <memory>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/serving/engine_loop.h"
#include "common/serving/metrics.h"
#include "common/serving/worker.h"
#include "common/tokenizer/tokenizer.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {

struct DecodeOptions {
  int max_waiting = 256;                      // requests queued for KV blocks
  int max_stop_strings = 16;                  // SamplingParams.stop entries
  int max_stop_string_bytes = 256;            // bytes of one stop string
  absl::Duration queue_timeout = absl::Seconds(30);
  absl::Duration prefill_timeout = absl::Seconds(120);
};

struct GenerateCall;

class DecodeServiceImpl final : public v1::Decode::CallbackService {
 public:
  // `tokenizer` (may be null: the model has none, ids only) must outlive the
  // service; text prompts, text outputs and stop strings need it.
  DecodeServiceImpl(WorkerState* state, WorkerMetrics* metrics,
                    std::shared_ptr<grpc::Channel> prefill_channel, DecodeOptions options,
                    const Tokenizer* tokenizer = nullptr);
  ~DecodeServiceImpl() override;
  // Called on the engine thread once the engine is ready.
  void SetEngine(EngineLoop* loop);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;

 private:
  friend class PrefillClient;
  // All of these run on the engine thread.
  void Reserve(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call);
  void RetryPending(LlmEngine& engine);
  // Blocks are reserved: count the call as waiting for KV and start a prefill.
  void BeginKvTransfer(const std::shared_ptr<GenerateCall>& call);
  void StartPrefill(const std::shared_ptr<GenerateCall>& call);
  void OnFirstToken(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call, int32_t token);
  // Ends the call with `status` and frees everything it holds (any thread).
  void Fail(const std::shared_ptr<GenerateCall>& call, const grpc::Status& status);
  // Frees the engine state of an ended call, on the engine thread.
  void Retire(const std::shared_ptr<GenerateCall>& call);
  // Fills `msg` for `tokens` (text, and the final fields when a stop string
  // ends the output); true when it did (engine thread).
  bool AddText(GenerateCall& call, const std::vector<int32_t>& tokens, v1::GenerateResponse* msg);
  void Release(const std::string& id);

  WorkerState* state_;
  WorkerMetrics* metrics_;
  std::unique_ptr<v1::Prefill::Stub> prefill_;
  DecodeOptions options_;
  const Tokenizer* tokenizer_;
  std::atomic<EngineLoop*> loop_{nullptr};
  v1::ModelFingerprint fingerprint_;  // set before the worker is ready
  size_t slot_bytes_ = 0;
  std::deque<std::shared_ptr<GenerateCall>> pending_;  // engine thread only
  int waiting_for_kv_ = 0;                             // engine thread only
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
