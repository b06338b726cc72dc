// The start-up graph policy: which capture sizes exist and which mode runs,
// in vLLM 0.15.1's order (VllmConfig._set_cudagraph_sizes, then
// GPUModelRunner._check_and_update_cudagraph_mode, which resolves the mode and
// calls CompilationConfig.adjust_cudagraph_sizes_for_spec_decode).
//
//  1. Capture sizes, from the *requested* mode:
//     - requested NONE: no sizes;
//     - M = max_capture_size if given, else min(2 * max_num_seqs * q, 512);
//       M = min(M, max_num_batched_tokens); M < 1 is an error;
//     - explicit sizes: de-duplicated, sorted, those above max_num_batched_tokens
//       dropped (not rounded, not capped at M); otherwise the ladder
//       1, 2, 4, 8..<256 step 8, 256..M step 16;
//     - explicit sizes and max_capture_size together: accepted only when the
//       maximum equals the largest kept size (a lone maximum is the ladder's cap).
//  2. Mode resolution against the attention backend (ResolveCudaGraphMode,
//     rules (a)-(e)).
//  3. With q > 1, only when the *resolved* mode has a FULL decode routine and
//     separate routines (FULL_DECODE_ONLY, FULL_AND_PIECEWISE): every size is
//     rounded up to a multiple of q, keeping those <= the largest size of step 1;
//     none left but q <= that bound gives [q]; still none is an error.
//  4. The dispatcher's keys come from the final sizes (CudaGraphDispatcher).
//
// q (uniform_decode_query_len, 1 + speculative tokens) lives only in
// GraphPolicyConfig; the dispatcher carries the resolved value and the model
// runner reads it from there.
//
// Pure functions, thread-compatible.
#ifndef TANDEM_COMMON_GRAPH_GRAPH_POLICY_H_
#define TANDEM_COMMON_GRAPH_GRAPH_POLICY_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/graph/attention_support.h"
#include "common/graph/cudagraph_mode.h"
#include "common/graph/dispatcher.h"

namespace tandem {

// What the user asks of the graph policy (upstream CompilationConfig fields
// and the speculative decoding length).
struct GraphPolicyConfig {
  CudaGraphMode requested_mode = CudaGraphMode::kFullAndPiecewise;
  // 1 + speculative tokens: the query length of a uniform-decode request.
  int uniform_decode_query_len = 1;
  // Explicit sizes (cudagraph_capture_sizes); empty means the default ladder.
  std::vector<int> capture_sizes;
  // max_cudagraph_capture_size; unset means the default maximum.
  std::optional<int> max_capture_size;
  // LoRA enabled; with specialize_lora graphs exist for both LoRA on and off.
  bool lora_enabled = false;
  bool specialize_lora = true;
};

// The scheduler's limits the policy depends on.
struct BatchLimits {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
};

// The outcome of start-up resolution.
struct GraphPolicy {
  // The resolved mode, with one note per downgrade and one when sizes were
  // rounded for q > 1 (from what to what).
  ModeResolution resolution;
  // Final capture sizes, q, max_num_seqs and LoRA cases for the dispatcher.
  DispatcherConfig dispatcher;
};

// The ladder [1, 2, 4, 8, ..., 248, 256, 272, ...] up to and including
// `max_size`. Empty when max_size < 1.
std::vector<int> DefaultCaptureSizeLadder(int max_size);

// Step 1. INVALID_ARGUMENT names the field and value: non-positive limits, q
// or sizes, M < 1, or an explicit maximum that differs from the largest
// explicit size kept.
absl::StatusOr<std::vector<int>> ResolveCaptureSizes(const GraphPolicyConfig& config,
                                                     const BatchLimits& limits);

// Step 3 for sizes that need it: rounds every size up to a multiple of q,
// bounded by the largest of `sizes`. INVALID_ARGUMENT "no valid capture sizes
// after rounding to a multiple of q" when nothing is left.
absl::StatusOr<std::vector<int>> RoundCaptureSizesToQueryLen(const std::vector<int>& sizes,
                                                             int uniform_decode_query_len);

// Steps 1-3: sizes, mode, rounding. Errors as the steps above and
// ResolveCudaGraphMode().
absl::StatusOr<GraphPolicy> ResolveGraphPolicy(const GraphPolicyConfig& config,
                                               const BatchLimits& limits,
                                               AttentionCgSupport support,
                                               bool piecewise_split);

}  // namespace tandem

#endif  // TANDEM_COMMON_GRAPH_GRAPH_POLICY_H_
