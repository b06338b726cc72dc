// AttentionCgSupport and start-up mode resolution (vLLM's AttentionCGSupport
// and GPUModelRunner._check_and_update_cudagraph_mode).
//
// An attention backend declares how much of itself a graph may contain:
//   ALWAYS > UNIFORM_BATCH > UNIFORM_SINGLE_TOKEN_DECODE > NEVER.
// ResolveCudaGraphMode() downgrades a requested mode to what the backend and
// the model's piecewise split allow, once, at start-up, with a note per change.
// A mode that cannot be honoured is an error that says what to change; there
// is no silent fallback at run time.
#ifndef TANDEM_COMMON_GRAPH_ATTENTION_SUPPORT_H_
#define TANDEM_COMMON_GRAPH_ATTENTION_SUPPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/graph/cudagraph_mode.h"

namespace tandem {

enum class AttentionCgSupport : int {
  kNever = 0,                     // no graph may contain attention
  kUniformSingleTokenDecode = 1,  // only batches of query_len == 1 decodes
  kUniformBatch = 2,              // batches whose query lengths are all equal
  kAlways = 3,                    // any batch, mixed prefill+decode included
};

absl::string_view AttentionCgSupportName(AttentionCgSupport support);
// Case-insensitive; INVALID_ARGUMENT lists the valid names.
absl::StatusOr<AttentionCgSupport> ParseAttentionCgSupport(absl::string_view text);

struct ModeResolution {
  CudaGraphMode mode;
  // One line per change, in the order applied, each with its reason.
  std::vector<std::string> notes;
};

// Applies, in order:
//  (a) not split at attention: PIECEWISE -> NONE, FULL_AND_PIECEWISE -> FULL;
//  (b) FULL with support != ALWAYS: NEVER is an error; otherwise
//      FULL_AND_PIECEWISE if split, else FULL_DECODE_ONLY;
//  (c) decode routine FULL with support NEVER: PIECEWISE if split, else NONE;
//  (d) decode routine FULL, q > 1, support below UNIFORM_BATCH: PIECEWISE if
//      split, else NONE;
//  (e) any FULL routine left with support NEVER: error.
// Errors are INVALID_ARGUMENT naming the mode, the support and the fix.
absl::StatusOr<ModeResolution> ResolveCudaGraphMode(CudaGraphMode requested,
                                                    AttentionCgSupport support,
                                                    bool piecewise_split,
                                                    int uniform_decode_query_len);

}  // namespace tandem

#endif  // TANDEM_COMMON_GRAPH_ATTENTION_SUPPORT_H_
