#include "common/graph/capture_sizes.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

void SortUnique(std::vector<int>* v) {
  std::sort(v->begin(), v->end());
  v->erase(std::unique(v->begin(), v->end()), v->end());
}

int RoundUp(int x, int multiple) { return (x + multiple - 1) / multiple * multiple; }

absl::Status CheckPositive(const char* field, int value) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be >= 1, got ", value));
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

absl::StatusOr<std::vector<int>> ResolveCaptureSizes(const CaptureSizeConfig& config) {
  if (auto s = CheckPositive("max_num_seqs", config.max_num_seqs); !s.ok()) return s;
  if (auto s = CheckPositive("max_num_batched_tokens", config.max_num_batched_tokens);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckPositive("uniform_decode_query_len", config.uniform_decode_query_len);
      !s.ok()) {
    return s;
  }
  const int q = config.uniform_decode_query_len;
  std::vector<int> sizes;
  int cap = config.max_num_batched_tokens;
  if (!config.capture_sizes.empty()) {
    if (config.max_capture_size.has_value()) {
      return absl::InvalidArgumentError(
          "capture_sizes and max_capture_size are exclusive: give one of them");
    }
    for (int s : config.capture_sizes) {
      if (s < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("capture_sizes: every size must be >= 1, got ", s));
      }
      if (s <= config.max_num_batched_tokens) sizes.push_back(s);
    }
  } else {
    int max_size = std::min(config.max_num_seqs * q * 2, 512);
    if (config.max_capture_size.has_value()) {
      if (*config.max_capture_size < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "max_capture_size must be >= 1, got ", *config.max_capture_size));
      }
      max_size = *config.max_capture_size;
    }
    max_size = std::min(max_size, config.max_num_batched_tokens);
    cap = max_size;
    sizes = DefaultCaptureSizeLadder(max_size);
  }
  SortUnique(&sizes);
  if (q > 1) {
    std::vector<int> rounded;
    for (int s : sizes) {
      const int r = RoundUp(s, q);
      if (r <= cap) rounded.push_back(r);
    }
    sizes = std::move(rounded);
    SortUnique(&sizes);
  }
  return sizes;
}

}  // namespace tandem
