// The capture-size ladder: which padded token counts get a graph.
//
// Default ladder for a maximum M (vLLM's): [1, 2, 4] (those <= M), then
// 8, 16, ..., 248 while <= M, then 256, 272, ... (step 16) while <= M.
// Default M = min(max_num_seqs * q * 2, 512), capped at max_num_batched_tokens,
// where q is the uniform-decode query length (1 + speculative tokens).
//
// User-given sizes are de-duplicated, sorted and filtered to
// <= max_num_batched_tokens. With q > 1 every size (default or given) is
// rounded up to a multiple of q and de-duplicated, so each uniform-decode size
// holds a whole number of requests; a default size whose rounding passes M is
// dropped, as upstream does.
#ifndef TANDEM_COMMON_GRAPH_CAPTURE_SIZES_H_
#define TANDEM_COMMON_GRAPH_CAPTURE_SIZES_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct CaptureSizeConfig {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  int uniform_decode_query_len = 1;
  // Explicit sizes (--capture-sizes); empty means "use the default ladder".
  std::vector<int> capture_sizes;
  // Explicit maximum for the default ladder (--max-capture-size).
  std::optional<int> max_capture_size;
};

// The ladder [1, 2, 4, 8, ..., 248, 256, 272, ...] up to and including
// `max_size`. Empty when max_size < 1.
std::vector<int> DefaultCaptureSizeLadder(int max_size);

// Resolves the final sorted, unique capture sizes. INVALID_ARGUMENT names the
// field and value for non-positive limits or sizes, or when both explicit
// sizes and a maximum are given.
absl::StatusOr<std::vector<int>> ResolveCaptureSizes(const CaptureSizeConfig& config);

}  // namespace tandem

#endif  // TANDEM_COMMON_GRAPH_CAPTURE_SIZES_H_
