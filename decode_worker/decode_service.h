// The Decode service, Tandem's front door. Generate():
//   1. validates the request and reserves KV blocks for the prompt on the
//      engine thread, waiting in a bounded queue while the cache is full (a
//      request that could never fit is refused at once);
//   2. pulls the prompt's KV from a prefill worker (PrefillClient, over a
//      round_robin channel) and writes each chunk into its own paged cache as
//      it arrives; a fingerprint mismatch is FAILED_PRECONDITION, a bad
//      checksum is retried once, then DATA_LOSS;
//   3. streams the first token, then joins the continuous decode batch
//      (FULL_DECODE_ONLY graphs by default) and streams every token.
// When the cache runs out mid-decode the engine preempts the newest request
// and hands it back: it waits for blocks again, is re-prefilled (prompt and
// the tokens generated so far) by a prefill worker and continues; the client
// sees a pause, never an error.
// With a tokenizer, a text prompt is tokenized on the RPC thread, and every
// message carries its new text (incremental detokenization; stop strings end
// the output before them).
// Where prompts are prefilled (DecodeOptions::prefill):
//   - remote (disaggregated): every prompt on a prefill worker, as above;
//   - local (aggregated): the decode worker prefills every prompt itself, in
//     its own engine (mixed batches run eager under FULL_DECODE_ONLY);
//   - remote with `local_prefill_max_tokens` (conditional): prompts of at most
//     that many tokens locally, longer ones remotely;
//   - `fallback_local`: a prompt whose prefill worker is unreachable
//     (UNAVAILABLE) is prefilled locally instead of failing.
// Each local prefill is counted in tandem_prefill_local_total{reason}.
// Cancellation, deadlines and failures free every KV block of the request.
//
// Threads: Generate() runs on a gRPC thread and posts to the engine loop;
// everything that touches the engine or a call's engine-thread fields runs on
// the engine thread (see generate_call.h); PrefillClient callbacks post there.
#ifndef TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
#define TANDEM_DECODE_WORKER_DECODE_SERVICE_H_

#include <atomic>
#include <deque>
#include <memory>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "common/base/mutex.h"
#include "absl/time/time.h"
#include "common/serving/engine_loop.h"
#include "common/serving/metrics.h"
#include "common/serving/worker.h"
#include "common/tokenizer/tokenizer.h"
#include "decode_worker/generate_call.h"
#include "decode_worker/prefill_client.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {

struct DecodeOptions {
  bool prefill_remote = true;                 // false: aggregated, no prefill worker
  int local_prefill_max_tokens = 0;           // remote: shorter prompts stay local (0 = none)
  bool fallback_local = false;                // remote: prefill locally when UNAVAILABLE
  int max_waiting = 256;                      // requests queued for KV blocks
  int max_stop_strings = 16;                  // SamplingParams.stop entries
  int max_stop_string_bytes = 256;            // bytes of one stop string
  absl::Duration queue_timeout = absl::Seconds(30);
  absl::Duration prefill_timeout = absl::Seconds(120);
};

class DecodeServiceImpl final : public v1::Decode::CallbackService, private PrefillClient::Host {
 public:
  // `tokenizer` (may be null: the model has none, ids only) must outlive the
  // service; text prompts, text outputs and stop strings need it.
  // `prefill_channel` may be null when options.prefill_remote is false.
  DecodeServiceImpl(WorkerState* state, WorkerMetrics* metrics,
                    std::shared_ptr<grpc::Channel> prefill_channel, DecodeOptions options,
                    const Tokenizer* tokenizer = nullptr);
  ~DecodeServiceImpl() override;
  // Called on the engine thread once the engine is ready.
  void SetEngine(EngineLoop* loop);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;

 private:
  // Engine thread.
  void Reserve(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call);
  // Reserves blocks for the call's prefill tokens and starts the transfer, or
  // queues the call until blocks free up.
  void ReserveOrQueue(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call);
  void RetryPending(LlmEngine& engine);
  // Blocks are reserved: count the call as waiting for KV and start a prefill.
  void BeginKvTransfer(const std::shared_ptr<GenerateCall>& call);
  void StartPrefill(const std::shared_ptr<GenerateCall>& call);
  // Why the call's prefill tokens should be computed here, or null when a
  // prefill worker should compute them.
  const char* LocalPrefillReason(const GenerateCall& call) const;
  // Queues the call's prefill tokens in this engine; its outputs (the first
  // token included) come through OnOutput.
  void PrefillLocally(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call,
                      const char* reason);
  void OnToken(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call, int32_t token);
  void OnOutput(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call,
                const RequestOutput& o);
  // Ends the call normally with `msg` as its last message.
  void Finish(LlmEngine& engine, const std::shared_ptr<GenerateCall>& call,
              v1::GenerateResponse msg, v1::FinishReason reason, bool engine_holds_request);
  // Counts `tokens` and fills `msg`'s text; true when a stop string ended the
  // output (then `msg` is the final message).
  bool AddTokens(GenerateCall& call, const std::vector<int32_t>& tokens, v1::GenerateResponse* msg);
  // Frees the engine state of an ended call (posted to the engine thread).
  void Retire(const std::shared_ptr<GenerateCall>& call);
  void Release(const std::string& id);

  // PrefillClient::Host (any thread).
  const v1::ModelFingerprint& fingerprint() const override { return fingerprint_; }
  size_t slot_bytes() const override { return slot_bytes_; }
  WorkerMetrics* metrics() override { return metrics_; }
  void OnKvChunk(const std::shared_ptr<GenerateCall>& call, v1::KvChunk chunk) override;
  void OnPrefillToken(const std::shared_ptr<GenerateCall>& call, int32_t token) override;
  void RetryPrefill(const std::shared_ptr<GenerateCall>& call) override;
  void PrefillUnavailable(const std::shared_ptr<GenerateCall>& call,
                          const grpc::Status& status) override;
  // Ends the call with `status` and frees everything it holds.
  void Fail(const std::shared_ptr<GenerateCall>& call, const grpc::Status& status) override;

  WorkerState* state_;
  WorkerMetrics* metrics_;
  std::unique_ptr<v1::Prefill::Stub> prefill_;
  DecodeOptions options_;
  const Tokenizer* tokenizer_;
  std::atomic<EngineLoop*> loop_{nullptr};
  v1::ModelFingerprint fingerprint_;  // set before the worker is ready, then read-only
  size_t slot_bytes_ = 0;             // likewise
  std::deque<std::shared_ptr<GenerateCall>> pending_;  // engine thread only
  int waiting_for_kv_ = 0;                             // engine thread only
  Mutex mu_;
  absl::flat_hash_set<std::string> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
