// The Decode service, Tandem's front door. Generate():
//   1. validates the request and submits it to the engine, which queues it
//      (bounded: max_waiting, queue timeout) until KV blocks are free, taking
//      the longest prefix of the prompt its prefix cache holds;
//   2. once the engine reports the blocks reserved (kv_needed), pulls the KV
//      of the tokens it lacks from a prefill worker (PrefillClient, over a
//      round_robin channel, saying how many leading tokens it holds) and
//      imports each chunk as it arrives; a fingerprint mismatch is
//      FAILED_PRECONDITION, a bad checksum is retried once, then DATA_LOSS;
//   3. streams the first token, then the engine decodes it in the continuous
//      batch (FULL_DECODE_ONLY graphs by default) and it streams every token.
// When the cache runs out mid-decode the engine preempts the newest request;
// it waits for blocks again, is re-prefilled (prompt and the tokens generated
// so far, less what is still cached) by a prefill worker and continues; the
// client sees a pause, never an error.
// With a tokenizer, a text prompt is tokenized on the RPC thread, and every
// message carries its new text (incremental detokenization; stop strings end
// the output before them).
// Where prompts are prefilled (DecodeOptions::prefill):
//   - remote (disaggregated): every prompt on a prefill worker, as above;
//   - local (aggregated): the decode worker prefills every prompt itself, in
//     its own engine (mixed batches run eager under FULL_DECODE_ONLY);
//   - remote with `local_prefill_max_tokens` (conditional): prompts of at most
//     that many tokens locally, longer ones remotely;
//   - `fallback_local`: a prompt that no prefill worker delivered complete KV
//     for in time (unreachable, stalled, over its budget, an incomplete
//     stream) is prefilled locally instead of failing.
// A prefill's budget grows with its prompt (prefill_timeout +
// prefill_timeout_per_token per token); each attempt must send its first
// message within first_message_timeout or is retried on another worker.
// The decode worker reports SERVING while it can serve: it has a usable
// prefill endpoint, or prefills locally (aggregated or as fallback).
// Each local prefill is counted in tandem_prefill_local_total{reason}.
// Cancellation, deadlines and failures free every KV block of the request.
//
// Threads: Generate() runs on a gRPC thread; it and the PrefillClient reach
// the engine only through the EngineClient. A call's engine-thread fields
// (generate_call.h) are touched only by its output callback.
#ifndef TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
#define TANDEM_DECODE_WORKER_DECODE_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>

#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/base/mutex.h"
#include "common/serving/in_flight_ids.h"
#include "common/serving/engine_client.h"
#include "common/serving/kv_transfer.h"
#include "common/serving/metrics.h"
#include "common/serving/open_stream.h"
#include "common/serving/request_id.h"
#include "common/serving/sampling_proto.h"
#include "common/serving/worker_state.h"
#include "common/tokenizer/tokenizer.h"
#include "decode_worker/generate_call.h"
#include "decode_worker/prefill_client.h"
#include "decode_worker/prefill_pool.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {

// The request header (gRPC metadata) naming the prefill worker, HOST:PORT,
// that a gateway chose for a request, as llm-d's P/D routing sets it.
inline constexpr char kPrefillerHeader[] = "x-prefiller-host-port";

struct DecodeOptions {
  bool prefill_remote = true;                 // false: aggregated, no prefill worker
  int local_prefill_max_tokens = 0;           // remote: shorter prompts stay local (0 = none)
  bool fallback_local = false;                // remote: prefill locally when UNAVAILABLE
  int max_waiting = 256;                      // requests queued for KV blocks
  int max_stop_strings = 16;                  // SamplingParams.stop entries
  int max_stop_string_bytes = 256;            // bytes of one stop string
  std::string served_model_name;              // ModelInfo's model
  // A prefill's budget: this plus prefill_timeout_per_token per token.
  absl::Duration prefill_timeout = absl::Seconds(60);
  absl::Duration prefill_timeout_per_token = absl::Milliseconds(10);
  // One attempt's wait for its first message (a worker sends its header at
  // admission), after which it is retried elsewhere.
  absl::Duration first_message_timeout = absl::Seconds(5);
  // A request's KV takes one stream, and one more per this many bytes of it,
  // up to the pool's kv_streams (KvStreamsFor); 0: always kv_streams.
  int64_t kv_bytes_per_stream = kKvBytesPerStream;
};

class DecodeServiceImpl final : public v1::Decode::CallbackService, private PrefillClient::Host {
 public:
  // `tokenizer` (may be null: the model has none, ids only) must outlive the
  // service; text prompts, text outputs and stop strings need it.
  // `prefill_pool` may be null when options.prefill_remote is false.
  DecodeServiceImpl(WorkerState* state, WorkerMetrics* metrics,
                    std::unique_ptr<PrefillPool> prefill_pool, DecodeOptions options,
                    const Tokenizer* tokenizer = nullptr);
  ~DecodeServiceImpl() override;
  // Called on the engine thread once the engine is ready.
  void SetEngine(EngineClient* client);
  // Once the server is shut down (no call starts a prefill any more) and
  // before the engine loop stops: cancels the prefill streams still open
  // (one whose `done` has come but not yet its status, say) and waits, up to
  // 10 s, until every PrefillClient is gone, for they call into the engine,
  // the pool and this service.
  void StopPrefillStreams();
  // The LoRA adapters requests may name now (none while the model loads).
  std::vector<std::string> LoraAdapters() const;

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* context,
                                      const v1::ModelInfoRequest* request,
                                      v1::ModelInfoResponse* response) override;
  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const v1::LoadLoraAdapterRequest* request,
                                            v1::LoadLoraAdapterResponse* response) override;
  grpc::ServerUnaryReactor* UnloadLoraAdapter(grpc::CallbackServerContext* context,
                                              const v1::UnloadLoraAdapterRequest* request,
                                              v1::UnloadLoraAdapterResponse* response) override;

 private:
  // The prefill workers runtime LoRA updates go to (--prefill-address's list).
  std::vector<PrefillPool::Endpoint*> PrefillEndpoints() const;
  // Engine thread (the request's output callback).
  void OnOutput(const std::shared_ptr<GenerateCall>& call, const RequestOutput& o);
  // Starts a prefill stream for the KV of the call's tokens past `cached`.
  void StartPrefill(const std::shared_ptr<GenerateCall>& call, int64_t cached);
  // Ends the call normally with `msg` as its last message.
  void Finish(const std::shared_ptr<GenerateCall>& call, v1::GenerateResponse msg,
              v1::FinishReason reason);
  // Counts `tokens` and fills `msg`'s text (and their `logprobs`, when
  // asked); `stop_token`: the last of them is the stop token that ended the
  // request (no text of its own). True when a stop string ended the output
  // (then `msg` is the final message).
  bool AddTokens(GenerateCall& call, const std::vector<int32_t>& tokens,
                 const std::vector<TokenLogprobs>& logprobs, bool stop_token,
                 v1::GenerateResponse* msg);

  // PrefillClient::Host (any thread).
  const v1::ModelFingerprint& fingerprint() const override { return client_.load()->fingerprint(); }
  size_t slot_bytes() const override { return client_.load()->slot_bytes(); }
  WorkerMetrics* metrics() override { return metrics_; }
  void OnKvChunk(const std::shared_ptr<GenerateCall>& call, ReceivedChunk chunk) override;
  void OnPrefillToken(const std::shared_ptr<GenerateCall>& call, int32_t token,
                      TokenLogprobs logprobs) override;
  PrefillPool* pool() override { return pool_.get(); }
  void PrefillFailed(const std::shared_ptr<GenerateCall>& call,
                     const grpc::Status& status) override;
  // Ends the call with `status` and frees everything it holds (once).
  void Fail(const std::shared_ptr<GenerateCall>& call, const grpc::Status& status) override;
  void Opened(grpc::ClientContext* context) override;
  void Closed(grpc::ClientContext* context) override;
  bool LoadLoraOn(PrefillPool::Endpoint* endpoint, const std::string& name, uint64_t fingerprint,
                  std::function<void(const grpc::Status&)> done) override;

  WorkerState* state_;
  WorkerMetrics* metrics_;
  // Every second: the usable-endpoint gauge, and health (NOT_SERVING when
  // no prefill endpoint is usable and there is no local fallback).
  void WatchPrefillPool();

  std::unique_ptr<PrefillPool> pool_;
  DecodeOptions options_;
  const Tokenizer* tokenizer_;
  std::atomic<EngineClient*> client_{nullptr};  // set before the worker is ready
  InFlightIds in_flight_;
  absl::Notification stop_;
  std::thread watcher_;
  // The adapters LoadLoraAdapter loaded (not --lora-modules'), for prefill
  // workers that lack one later (LoadLoraOn).
  struct RuntimeLora {
    std::string path;
    uint64_t fingerprint = 0;
  };
  Mutex runtime_loras_mu_;
  absl::flat_hash_map<std::string, RuntimeLora> runtime_loras_ ABSL_GUARDED_BY(runtime_loras_mu_);
  Mutex clients_mu_;
  absl::flat_hash_set<grpc::ClientContext*> clients_ ABSL_GUARDED_BY(clients_mu_);  // alive
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_DECODE_SERVICE_H_
