// LlmEngine: the model, its KV cache, the runner and the scheduler in one
// object, stepped by one thread. Used in-process by `tandem generate --local`
// and `tandem bench`, and by each worker's engine loop.
//
// Not thread-safe: one engine thread owns it. Services post work to that
// thread; they never call it from RPC threads.
#ifndef TANDEM_COMMON_ENGINE_ENGINE_H_
#define TANDEM_COMMON_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/engine/model_runner.h"
#include "common/engine/request.h"
#include "common/engine/sampling.h"
#include "common/engine/scheduler.h"
#include "common/kernels/backend.h"

namespace tandem {

struct EngineConfig {
  std::string model = "synthetic";
  BackendOptions backend;
  int block_size = 16;
  int num_kv_blocks = 0;  // 0: as many as fit kv_cache_bytes (capped at need)
  int64_t kv_cache_bytes = int64_t{512} << 20;
  RunnerConfig runner;
};

struct RequestOutput {
  std::string id;
  std::vector<int32_t> new_tokens;  // tokens sampled this step
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  absl::Status status;  // non-OK when the request failed
  int prompt_tokens = 0;
  int completion_tokens = 0;
  // Preempted and out of the engine (a request added with
  // return_on_preemption): its blocks are freed; the caller recomputes it.
  bool preempted = false;
};

// One step's record, for the --cudagraph-metrics style table.
struct StepRecord {
  CudaGraphMode runtime_mode;
  int num_tokens = 0;
  int padded_tokens = 0;
};

class LlmEngine {
 public:
  // Loads the model, sizes the KV cache, builds the runner and captures its
  // graphs (logging progress). Errors say which setting to change.
  static absl::StatusOr<std::unique_ptr<LlmEngine>> Create(const EngineConfig& config);
  ~LlmEngine();

  // Validates and queues a request. INVALID_ARGUMENT names the field, value
  // and limit; ALREADY_EXISTS for a request id in flight.
  absl::Status AddRequest(const std::string& id, std::vector<int32_t> prompt,
                          const SamplingParams& params, RequestKind kind = RequestKind::kGenerate);
  // Validates a prompt and parameters without queueing anything.
  absl::Status Validate(const std::vector<int32_t>& prompt, const SamplingParams& params) const;
  // Drops a request and frees its KV blocks. NOT_FOUND for an unknown id.
  absl::Status Abort(const std::string& id);
  // KV transfer (disaggregated serving). Token-major rows: for each token,
  // num_kv_heads * head_dim elements of K (and of V) of one layer, in the
  // cache's dtype (kv_cache().slot_bytes() bytes per row).
  //
  // Reserves KV blocks for `num_tokens` tokens of request `id` before its KV
  // arrives. RESOURCE_EXHAUSTED when the cache has no room now.
  absl::Status ReserveKv(const std::string& id, int64_t num_tokens);
  // Writes rows [first, first + count) of `layer` into the request's blocks.
  // INVALID_ARGUMENT when the range is outside what was reserved.
  absl::Status WriteKv(const std::string& id, int layer, int64_t first, int64_t count,
                       const void* k, const void* v);
  // Reads rows [first, first + count) of `layer` of a request's cached KV.
  absl::Status ReadKv(const std::string& id, int layer, int64_t first, int64_t count, void* k,
                      void* v) const;
  // Queues a request whose prompt KV was written with WriteKv() and whose
  // first token was sampled elsewhere; it joins the decode batch. The output
  // of this call's first step is the second token.
  // With return_on_preemption, a preemption hands the request back (an
  // output with `preempted`) instead of recomputing it here.
  absl::Status AddPrefilledRequest(const std::string& id, std::vector<int32_t> prompt,
                                   int32_t first_token, const SamplingParams& params,
                                   bool return_on_preemption = false);

  // Runs one scheduling step and the model; returns the outputs of the
  // requests that advanced or finished.
  absl::StatusOr<std::vector<RequestOutput>> Step();
  bool HasWork() const { return !scheduler_->empty(); }

  const LlamaConfig& model_config() const { return model_->config(); }
  ModelRunner& runner() { return *runner_; }
  KvCache& kv_cache() { return *kv_cache_; }
  const KvCache& kv_cache() const { return *kv_cache_; }
  size_t num_running() const { return scheduler_->num_running(); }
  size_t num_waiting() const { return scheduler_->num_waiting(); }
  int64_t num_preemptions() const { return scheduler_->num_preemptions(); }
  int max_model_len() const { return runner_->max_model_len(); }
  const EngineConfig& config() const { return config_; }
  // Records of the steps since the last call (cleared on read; the most recent
  // kMaxStepRecords at most).
  static constexpr size_t kMaxStepRecords = 4096;
  std::vector<StepRecord> TakeStepRecords();
  // "cpu", or the GPU's index and name for cuda.
  std::string device_name() const { return backend_->device->name(); }

 private:
  LlmEngine() = default;
  void Finish(Request* r, FinishReason reason, std::vector<RequestOutput>* out);
  // Copies KV rows between host buffers and a request's blocks (both ways:
  // one range check, one slot walk).
  absl::Status CopyKvRows(const std::string& id, int layer, int64_t first, int64_t count,
                          bool to_cache, char* k, char* v) const;
  // Validates and registers a request (not yet queued).
  absl::StatusOr<Request*> NewRequest(const std::string& id, std::vector<int32_t> prompt,
                                      const SamplingParams& params, RequestKind kind);

  EngineConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> kv_cache_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Scheduler> scheduler_;
  Sampler sampler_;
  absl::flat_hash_map<std::string, std::unique_ptr<Request>> requests_;
  uint64_t next_arrival_ = 0;
  std::vector<ScheduledSeq> batch_;  // reused per step
  std::vector<StepRecord> records_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_ENGINE_H_
