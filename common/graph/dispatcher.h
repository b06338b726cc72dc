// CudaGraphDispatcher: vLLM's CudagraphDispatcher (vllm/v1/cudagraph_dispatcher.py),
// the only source of truth for which graphs exist.
//
// It holds two key sets, one per runtime mode (FULL, PIECEWISE), built by
// InitializeKeys() once the mode has been resolved against the attention
// backend. Per step, Dispatch() maps a batch to (runtime mode, key); the
// wrappers trust that answer through the ForwardContext.
//
// Thread-compatible: build and initialise once, then Dispatch() from the one
// engine thread (or concurrently, since Dispatch() is const).
#ifndef TANDEM_COMMON_GRAPH_DISPATCHER_H_
#define TANDEM_COMMON_GRAPH_DISPATCHER_H_

#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/graph/batch_descriptor.h"
#include "common/graph/cudagraph_mode.h"

namespace tandem {

struct DispatcherConfig {
  // Sorted, unique capture sizes (see ResolveGraphPolicy()).
  std::vector<int> capture_sizes;
  int max_num_seqs = 256;
  // 1 + speculative tokens; the query length of a uniform-decode request.
  // Set from GraphPolicyConfig by ResolveGraphPolicy(); everything downstream
  // (keys, dispatch, the model runner's uniform-decode test) reads it here.
  int uniform_decode_query_len = 1;
  // LoRA enabled; with specialize_lora graphs exist for both LoRA on and off,
  // otherwise only LoRA on (upstream lora_cases).
  bool lora_enabled = false;
  bool specialize_lora = true;
};

// The answer of Dispatch(): the runtime mode and the key of the graph to use.
struct DispatchResult {
  CudaGraphMode runtime_mode;
  BatchDescriptor descriptor;
};

// One group of CaptureDescriptors(): a runtime mode and its keys, largest first.
struct CaptureGroup {
  CudaGraphMode mode;
  std::vector<BatchDescriptor> descriptors;
};

class CudaGraphDispatcher {
 public:
  explicit CudaGraphDispatcher(DispatcherConfig config);

  // Builds the key sets for `mode` (upstream initialize_cudagraph_keys):
  //  - mixed_mode() != NONE: the relaxed key of every capture size (x LoRA
  //    cases) for the mixed routine;
  //  - decode_mode() == FULL and separate_routine(): a FULL uniform key for
  //    every capture size in [q, q * max_num_seqs] (x LoRA cases),
  // with q = config.uniform_decode_query_len.
  // INVALID_ARGUMENT when `mode` needs FULL uniform keys but a capture size in
  // that range is not a multiple of q (ResolveGraphPolicy() rounds them).
  absl::Status InitializeKeys(CudaGraphMode mode);

  // Per-step dispatch (upstream dispatch()). NONE with BatchDescriptor(num_tokens)
  // when keys are not initialised, the mode is NONE, or num_tokens exceeds the
  // largest capture size. Otherwise FULL exact key, FULL relaxed key (both
  // skipped with disable_full), PIECEWISE relaxed key, else NONE.
  // INVALID_ARGUMENT for num_tokens < 0, or a uniform-decode batch in a mode
  // with FULL graphs whose padded size is not a multiple of q (an assertion
  // upstream).
  absl::StatusOr<DispatchResult> Dispatch(int num_tokens, bool uniform_decode,
                                          bool has_lora = false,
                                          bool disable_full = false) const;

  // The graphs to capture: PIECEWISE group first, then FULL, each sorted by
  // num_tokens largest first (ties: uniform keys first, then LoRA on first, so
  // the order is deterministic). Empty for NONE or before InitializeKeys().
  std::vector<CaptureGroup> CaptureDescriptors() const;

  // The padded size for `num_tokens` (the smallest capture size >= it), or
  // num_tokens itself above the largest capture size.
  int PaddedSize(int num_tokens) const;

  bool keys_initialized() const { return keys_initialized_; }
  CudaGraphMode mode() const { return mode_; }
  const std::vector<int>& capture_sizes() const { return config_.capture_sizes; }
  int uniform_decode_query_len() const { return config_.uniform_decode_query_len; }
  int max_capture_size() const {
    return config_.capture_sizes.empty() ? 0 : config_.capture_sizes.back();
  }
  const absl::flat_hash_set<BatchDescriptor>& keys(CudaGraphMode runtime_mode) const;

 private:
  absl::StatusOr<BatchDescriptor> PaddedDescriptor(int num_tokens, bool uniform_decode,
                                                   bool has_lora) const;
  void ComputePaddingTable();

  DispatcherConfig config_;
  CudaGraphMode mode_ = CudaGraphMode::kNone;
  bool keys_initialized_ = false;
  // padded_size_[n] = the capture size a batch of n tokens pads to; index 0..max.
  std::vector<int> padded_size_;
  absl::flat_hash_set<BatchDescriptor> full_keys_;
  absl::flat_hash_set<BatchDescriptor> piecewise_keys_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GRAPH_DISPATCHER_H_
