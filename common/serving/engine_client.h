// EngineClient: the few verbs a service may ask of the engine (vLLM's
// EngineCoreClient, Triton's TRITONSERVER_* calls). Services never see the
// LlmEngine: every call here posts to the engine loop and runs there, in call
// order, between steps; a request's outputs come back on the loop thread to
// the callback given at Submit(), ending with one `finished` output (also for
// every error after Submit(): invalid request, queue full, a failed KV import,
// a failed step). Cancel() is the one way to drop a request early; it frees
// its blocks wherever it is, and its callback is not called again.
//
// KV transfer: on the decode side a kRemotePrefill request reports
// `kv_needed` once its blocks are reserved; the service then feeds
// ImportKv() chunks and RemoteKvArrived() (or ComputeLocally()). On the
// prefill side a kPrefillOnly request reports each computed chunk of its
// prompt (kv_ready_tokens) and finishes keeping its KV; ExportKv() reads it
// out in windows as it is computed, until the service Cancel()s it.
//
// Thread-safe: any method from any thread. Callbacks run on the loop thread
// and must not block.
#ifndef TANDEM_COMMON_SERVING_ENGINE_CLIENT_H_
#define TANDEM_COMMON_SERVING_ENGINE_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/serving/engine_loop.h"
#include "common/serving/kv_transfer.h"
#include "grpcpp/support/status.h"
#include "proto/tandem/v1/tandem.pb.h"

namespace tandem {

class EngineClient {
 public:
  using OutputCallback = std::function<void(const RequestOutput&)>;
  // `loop` must be ready and outlive the client.
  explicit EngineClient(EngineLoop* loop);

  struct Submission {
    std::string id;
    std::vector<int32_t> prompt;
    SamplingParams params;
    RequestKind kind = RequestKind::kGenerate;
    // RESOURCE_EXHAUSTED when this many requests already wait (0: no limit);
    // under priority scheduling the new request instead displaces the one
    // that would be served last, never started, when that one's priority
    // value is larger (LlmEngine::DisplacedBy), and that one fails.
    int max_waiting = 0;
  };
  void Submit(Submission s, OutputCallback cb);
  // Writes a verified chunk into a WAITING_FOR_REMOTE_KV request's blocks; an
  // error finishes the request with it.
  void ImportKv(const std::string& id, ReceivedChunk chunk);
  // The request's KV is in and `token` was sampled after it (with its
  // log-probabilities, when the request asked for them).
  void RemoteKvArrived(const std::string& id, int32_t token, TokenLogprobs logprobs = {});
  // Prefill the request here after all (no prefill worker delivered complete
  // KV in time); whatever rows ImportKv wrote are computed again.
  void ComputeLocally(const std::string& id);
  // Drops the request (any state) and frees its blocks; no more outputs.
  void Cancel(const std::string& id);

  // Runs `fill` on the loop thread with `next`, which makes the next chunk
  // of a prefill-only request's computed KV (nullopt: none computed since);
  // `fill` takes as many as its reader has room for (check exporter->done()
  // first). It runs after the engine's next layer or at the loop's next turn,
  // whichever is first (EngineLoop::AtNextLayer: possibly inside a step, so
  // `fill` may only read the engine and post), and after a nullopt again so.
  using NextChunk = std::function<absl::StatusOr<std::optional<WireMessage>>()>;
  using Fill = std::function<void(const NextChunk& next)>;
  void ExportKv(std::shared_ptr<KvExporter> exporter, Fill fill);

  // Runtime LoRA updating. Reads the adapter at `spec.path` on the calling
  // thread, then puts it into a slot on the loop thread; `done` gets its
  // fingerprint (or the error) on one of them. `expect_fingerprint` != 0:
  // the weights must be these, and a name already loaded with them is OK
  // (a decode worker loading its prefill workers).
  using LoadDone = std::function<void(absl::StatusOr<uint64_t>)>;
  void LoadLora(const LoraModuleSpec& spec, uint64_t expect_fingerprint, LoadDone done);
  // New requests may no longer name the adapter; `done` on the loop thread.
  void UnloadLora(const std::string& name, std::function<void(absl::Status)> done);

  // Start-up facts, immutable once the engine is ready.
  const LlamaConfig& model_config() const { return loop_->model_config(); }
  int max_model_len() const { return loop_->max_model_len(); }
  // Tokens of one step: the most a prefill chunk computes at once.
  int max_num_batched_tokens() const { return loop_->max_num_batched_tokens(); }
  const v1::ModelFingerprint& fingerprint() const { return fingerprint_; }
  // The adapters requests may name (thread-safe lookups; LoadLora and
  // UnloadLora change them).
  const LoraSet& lora() const { return loop_->lora(); }
  size_t slot_bytes() const { return slot_bytes_; }
  // One token's K and V in every layer (KvCache::token_bytes).
  size_t token_bytes() const { return token_bytes_; }
  int block_size() const { return block_size_; }
  // Whether a step's KV rows become final layer by layer inside it (the
  // layer hook; the CPU) rather than only after the step.
  bool kv_final_per_layer() const { return loop_->kv_final_per_layer(); }

 private:
  // Ends request `id` with `status`: aborts it and calls its callback last.
  void FailOnLoop(LlmEngine& engine, const std::string& id, const absl::Status& status);
  void FillOnLoop(const LlmEngine& engine, const std::shared_ptr<KvExporter>& exporter,
                  const Fill& fill);

  EngineLoop* loop_;
  v1::ModelFingerprint fingerprint_;
  size_t slot_bytes_;
  size_t token_bytes_;
  int block_size_;
};

// LoadLoraAdapter and UnloadLoraAdapter on this worker, as both services
// serve them: the request checked (INVALID_ARGUMENT naming a missing
// field), UNAVAILABLE while the model loads (`client` null), then
// EngineClient::LoadLora / UnloadLora; `done` gets the gRPC status (and the
// loaded adapter's fingerprint) on some thread.
void LoadLoraAdapterHere(EngineClient* client, const v1::LoadLoraAdapterRequest& request,
                         std::function<void(const grpc::Status&, uint64_t fingerprint)> done);
void UnloadLoraAdapterHere(EngineClient* client, const v1::UnloadLoraAdapterRequest& request,
                           std::function<void(const grpc::Status&)> done);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_ENGINE_CLIENT_H_
