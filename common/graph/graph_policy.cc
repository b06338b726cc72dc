#include "common/graph/graph_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

void SortUnique(std::vector<int>* v) {
  std::sort(v->begin(), v->end());
  v->erase(std::unique(v->begin(), v->end()), v->end());
}

int RoundUp(int x, int multiple) { return (x + multiple - 1) / multiple * multiple; }

// The dispatcher's padding table has one entry per token count up to the
// largest capture size; beyond this a typo would allocate gigabytes.
constexpr int64_t kMaxCaptureSize = int64_t{1} << 20;

absl::Status CheckPositive(const char* field, int value) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " must be >= 1, got ", value));
}

std::string ListString(const std::vector<int>& v) {
  return absl::StrCat("[", absl::StrJoin(v, ","), "]");
}

}  // namespace

std::vector<int> DefaultCaptureSizeLadder(int max_size) {
  std::vector<int> sizes;
  for (int s : {1, 2, 4}) {
    if (s <= max_size) sizes.push_back(s);
  }
  for (int s = 8; s < 256 && s <= max_size; s += 8) sizes.push_back(s);
  for (int s = 256; s <= max_size; s += 16) sizes.push_back(s);
  return sizes;
}

absl::StatusOr<std::vector<int>> ResolveCaptureSizes(const GraphPolicyConfig& config,
                                                     const BatchLimits& limits) {
  RETURN_IF_ERROR(CheckPositive("max_num_seqs", limits.max_num_seqs));
  RETURN_IF_ERROR(CheckPositive("max_num_batched_tokens", limits.max_num_batched_tokens));
  RETURN_IF_ERROR(CheckPositive("uniform_decode_query_len", config.uniform_decode_query_len));
  for (int s : config.capture_sizes) {
    if (s < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("capture_sizes: every size must be >= 1, got ", s));
    }
  }
  // Upstream computes no sizes at all when graphs are off.
  if (config.requested_mode == CudaGraphMode::kNone) return std::vector<int>{};

  const int q = config.uniform_decode_query_len;
  int64_t max_size = config.max_capture_size.has_value()
                         ? *config.max_capture_size
                         : std::min<int64_t>(int64_t{limits.max_num_seqs} * q * 2, 512);
  max_size = std::min<int64_t>(max_size, limits.max_num_batched_tokens);
  if (max_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_capture_size must be >= 1 when graphs are on, got ", max_size,
        " (after capping at max_num_batched_tokens ", limits.max_num_batched_tokens, ")"));
  }

  std::vector<int> sizes;
  for (int s : config.capture_sizes) {
    if (s > kMaxCaptureSize && s <= limits.max_num_batched_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("capture_sizes: ", s,
                                                     " is above the limit ", kMaxCaptureSize));
    }
  }
  if (max_size > kMaxCaptureSize && config.capture_sizes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the largest capture size would be ", max_size, " (max_capture_size, capped at "
        "max_num_batched_tokens); the limit is ", kMaxCaptureSize));
  }
  if (!config.capture_sizes.empty()) {
    // Explicit sizes are filtered by the token budget only, not by M.
    for (int s : config.capture_sizes) {
      if (s <= limits.max_num_batched_tokens) sizes.push_back(s);
    }
    SortUnique(&sizes);
    const int largest = sizes.empty() ? 0 : sizes.back();
    if (config.max_capture_size.has_value() && *config.max_capture_size != largest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_capture_size ", *config.max_capture_size,
          " must equal the largest capture size kept (", largest, " of capture_sizes ",
          ListString(config.capture_sizes), " within max_num_batched_tokens ",
          limits.max_num_batched_tokens, ")"));
    }
  } else {
    sizes = DefaultCaptureSizeLadder(static_cast<int>(max_size));
  }
  return sizes;
}

absl::StatusOr<std::vector<int>> RoundCaptureSizesToQueryLen(const std::vector<int>& sizes,
                                                             int uniform_decode_query_len) {
  const int q = uniform_decode_query_len;
  if (sizes.empty() || q <= 1) return sizes;
  const int bound = *std::max_element(sizes.begin(), sizes.end());
  std::vector<int> rounded;
  for (int s : sizes) {
    const int r = RoundUp(s, q);
    if (r <= bound) rounded.push_back(r);
  }
  SortUnique(&rounded);
  // Upstream: "if one valid but would be round_down use that".
  if (rounded.empty() && q <= bound) rounded.push_back(q);
  if (rounded.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no valid capture sizes after rounding to a multiple of q: "
        "uniform_decode_query_len ", q, " is above the largest capture size ", bound,
        " (capture_sizes ", ListString(sizes), "); raise max_capture_size or the capture sizes"));
  }
  return rounded;
}

absl::StatusOr<GraphPolicy> ResolveGraphPolicy(const GraphPolicyConfig& config,
                                               const BatchLimits& limits,
                                               AttentionCgSupport support,
                                               bool piecewise_split) {
  GraphPolicy policy;
  ASSIGN_OR_RETURN(std::vector<int> sizes, ResolveCaptureSizes(config, limits));
  ASSIGN_OR_RETURN(policy.resolution,
                   ResolveCudaGraphMode(config.requested_mode, support, piecewise_split,
                                        config.uniform_decode_query_len));
  const CudaGraphMode mode = policy.resolution.mode;
  const int q = config.uniform_decode_query_len;
  if (q > 1 && mode.decode_mode() == CudaGraphMode::kFull && mode.separate_routine() &&
      !sizes.empty()) {
    ASSIGN_OR_RETURN(std::vector<int> rounded, RoundCaptureSizesToQueryLen(sizes, q));
    if (rounded != sizes) {
      policy.resolution.notes.push_back(absl::StrCat(
          "capture sizes ", ListString(sizes), " -> ", ListString(rounded),
          ": rounded up to multiples of uniform_decode_query_len ", q, " for ", mode.name(),
          "'s FULL decode graphs, keeping those <= ", sizes.back()));
    }
    sizes = std::move(rounded);
  }
  policy.dispatcher.capture_sizes = std::move(sizes);
  policy.dispatcher.max_num_seqs = limits.max_num_seqs;
  policy.dispatcher.uniform_decode_query_len = q;
  policy.dispatcher.lora_enabled = config.lora_enabled;
  policy.dispatcher.specialize_lora = config.specialize_lora;
  return policy;
}

}  // namespace tandem
