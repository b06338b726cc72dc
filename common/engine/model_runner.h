// ModelRunner: runs one step of the model under the CUDA-graph policy
// (vLLM's GPUModelRunner, the parts that matter for graphs).
//
// It owns the persistent buffers (token ids, positions, slot mapping,
// sequence lengths, query start offsets, block tables, activations, logits),
// the dispatcher and the wrappers: one FULL wrapper around the whole forward
// and one PIECEWISE wrapper around each piece between attention calls.
//
// Start-up: Create() resolves the requested mode against the attention
// backend's declared support (an unsupported mode is an error there), builds
// the dispatcher's keys; CaptureGraphs() warms up and captures every
// descriptor of CaptureDescriptors(), PIECEWISE first, largest first, logging
// progress.
//
// Per step, Execute(): copy the inputs into the persistent buffers, pad to the
// dispatcher's size (padded slots write no KV and are ignored), decide uniform
// decode as vLLM does, dispatch, set the forward context, run, and compute the
// logits of the sampled rows (outside the graph, as vLLM's compute_logits).
//
// Not thread-safe: owned by the engine thread.
#ifndef TANDEM_COMMON_ENGINE_MODEL_RUNNER_H_
#define TANDEM_COMMON_ENGINE_MODEL_RUNNER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/graph/attention_support.h"
#include "common/graph/cudagraph_mode.h"
#include "common/graph/cudagraph_wrapper.h"
#include "common/graph/dispatcher.h"
#include "common/graph/graph_policy.h"
#include "common/kernels/ops.h"
#include "common/model/kv_cache.h"
#include "common/model/llama_model.h"
#include "common/model/lora.h"

namespace tandem {

struct RunnerConfig {
  int max_num_batched_tokens = 2048;
  int max_num_seqs = 256;
  int max_model_len = 0;  // 0: the model's context (LlamaConfig::MaxContext), at most 8192
  // Requested mode, capture sizes and q; resolved once in Create().
  GraphPolicyConfig graph;
  bool check_input_addresses = false;     // debug: verify fixed input addresses
};

// One request's share of a step.
struct ScheduledSeq {
  const int32_t* tokens = nullptr;  // the tokens scheduled this step
  int num_tokens = 0;
  int64_t start_pos = 0;            // tokens of this request already in the cache
  const std::vector<int32_t>* block_table = nullptr;  // covers start_pos + num_tokens
  bool sample = false;              // produce logits for the last scheduled token
  // With `sample`: logits for the last num_sampled tokens (1 + drafted
  // tokens to verify, speculative decoding; every token of a chunk whose
  // prompt logprobs are asked for).
  int num_sampled = 1;
  int lora_slot = 0;  // LoraSet slot of its adapter; 0: the base model
};

struct StepResult {
  CudaGraphMode runtime_mode;
  BatchDescriptor descriptor;
  int num_tokens = 0;     // unpadded
  int padded_tokens = 0;  // tokens added by padding
  // Host logits of the sampled rows, row-major [rows, vocab], in batch order
  // (num_sampled rows per sampled sequence); valid until the next Execute().
  const float* logits = nullptr;
  int logit_rows = 0;
};

// Counters since start-up, per runtime mode.
struct RunnerStats {
  PerMode<int64_t> steps;     // steps by dispatched runtime mode
  PerMode<int64_t> replays;   // steps served by replaying that mode's graphs
  PerMode<int64_t> captured;  // graphs captured (PIECEWISE: every piece)
  int64_t padded_tokens = 0;
  double capture_seconds = 0;
};

class ModelRunner {
 public:
  // `lora`: the adapters sequences may name by slot (null or empty: none;
  // then config.graph.lora_enabled must be false). Must outlive the runner.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const RunnerConfig& config,
                                                             const LlamaModel* model,
                                                             KvCache* kv_cache, Ops* ops,
                                                             const LoraSet* lora = nullptr);

  // Warms up and captures every graph the dispatcher holds. Idempotent.
  absl::Status CaptureGraphs();

  // Runs one step. INVALID_ARGUMENT when the batch breaks a limit (tokens,
  // sequences, model length, missing block table); the step is not run then.
  // `force_eager` runs NONE at the unpadded size (benchmarks).
  absl::StatusOr<StepResult> Execute(const std::vector<ScheduledSeq>& batch,
                                     bool force_eager = false);

  CudaGraphMode resolved_mode() const { return resolution_.mode; }
  const ModeResolution& resolution() const { return resolution_; }
  const CudaGraphDispatcher& dispatcher() const { return *dispatcher_; }
  const RunnerStats& stats() const { return stats_; }
  const RunnerConfig& config() const { return config_; }
  int max_model_len() const { return config_.max_model_len; }
  // Rows of logits a step can compute: max_num_seqs x q, within the token
  // budget (the scheduler keeps every step within it).
  int64_t max_logit_rows() const { return max_logit_rows_; }
  int num_piecewise_wrappers() const { return static_cast<int>(pieces_.size()); }
  const LlamaModel& model() const { return *model_; }

  // Called on the stepping thread after each layer's attention has written
  // that layer's KV rows for the step (on an asynchronous device: has been
  // issued, so work issued afterwards sees them), between PIECEWISE pieces
  // (never inside a replay), in NONE and PIECEWISE steps. FULL steps and
  // start-up captures make no calls: their rows are final after the step.
  // It returns whether it waits for the device (LlmEngine::LayerHook): then
  // the step's wait for its logits calls it again while the device is busy.
  void SetLayerObserver(std::function<bool(int layer)> observer) {
    layer_observer_ = std::move(observer);
  }

 private:
  ModelRunner() = default;
  // Measures the persistent buffers, allocates exactly that arena and places
  // them in it (PlaceBuffers runs on both arenas).
  absl::Status AllocateBuffers();
  absl::Status PlaceBuffers(Arena* arena);
  absl::Status Forward();  // the FULL wrapper's runnable
  // Runs the forward under `mode` and `descriptor` on inputs already copied.
  // `capture_only`: a start-up capture pass (graphs recorded, not run).
  absl::Status RunForward(const std::vector<ScheduledSeq>& batch, CudaGraphMode mode,
                          const BatchDescriptor& descriptor, bool capture_only = false);
  absl::Status CopyInputs(const std::vector<ScheduledSeq>& batch, int padded_tokens);
  std::vector<const void*> InputAddresses() const;
  int64_t PiecewiseReplays() const;
  int64_t PiecewiseCaptures() const;
  // Waits for the step's ops (its logits); in a step that calls the layer
  // observer, calls it again while the device is busy and the observer
  // waits for it (the KV hand-off's reads in flight).
  absl::Status AwaitStep(CudaGraphMode mode);

  RunnerConfig config_;
  const LlamaModel* model_ = nullptr;
  KvCache* kv_cache_ = nullptr;
  Ops* ops_ = nullptr;
  ModeResolution resolution_;
  std::unique_ptr<CudaGraphDispatcher> dispatcher_;
  std::unique_ptr<CudaGraphWrapper> full_;
  std::vector<std::unique_ptr<CudaGraphWrapper>> pieces_;
  bool captured_ = false;
  std::function<bool(int layer)> layer_observer_;

  std::unique_ptr<Arena> arena_;
  ForwardBuffers buffers_;
  int64_t max_blocks_per_seq_ = 0;
  // Sampled rows a step can have: max_num_seqs x q, within the token budget.
  int64_t max_logit_rows_ = 0;
  Tensor logits_indices_;  // i32[max_logit_rows_]
  Tensor gathered_;        // f32[max_logit_rows_, H]
  Tensor logits_;          // f32[max_logit_rows_, V]

  // Host staging, sized at start-up.
  std::vector<int32_t> h_ids_, h_pos_, h_slots_, h_qsl_, h_seq_lens_, h_tables_, h_logit_idx_,
      h_lora_;
  std::vector<float> h_logits_;
  RunnerStats stats_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_MODEL_RUNNER_H_
