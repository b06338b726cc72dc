#include "common/graph/dispatcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem {

CudaGraphDispatcher::CudaGraphDispatcher(DispatcherConfig config)
    : config_(std::move(config)) {}

void CudaGraphDispatcher::ComputePaddingTable() {
  // Upstream _compute_bs_to_padded_graph_size: a size equal to a capture size
  // maps to itself, anything between two sizes maps up to the next one.
  const int max_size = max_capture_size();
  padded_size_.assign(max_size + 1, 0);
  int start = 0;
  for (size_t i = 0; i <= config_.capture_sizes.size(); ++i) {
    const int end = i < config_.capture_sizes.size() ? config_.capture_sizes[i] : max_size + 1;
    for (int bs = start; bs < end; ++bs) padded_size_[bs] = bs == start ? start : end;
    start = end;
  }
}

int CudaGraphDispatcher::PaddedSize(int num_tokens) const {
  if (num_tokens < 0 || num_tokens >= static_cast<int>(padded_size_.size())) {
    return num_tokens;
  }
  return padded_size_[num_tokens];
}

absl::StatusOr<BatchDescriptor> CudaGraphDispatcher::PaddedDescriptor(
    int num_tokens, bool uniform_decode, bool has_lora) const {
  const int padded = padded_size_[num_tokens];
  const int q = config_.uniform_decode_query_len;
  if (uniform_decode && mode_.has_mode(CudaGraphMode::kFull)) {
    if (padded % q != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "uniform-decode batch of ", num_tokens, " tokens pads to ", padded,
          ", which is not a multiple of uniform_decode_query_len ", q));
    }
    return BatchDescriptor(padded, padded / q, true, has_lora);
  }
  return BatchDescriptor(padded, std::min(padded, config_.max_num_seqs), false, has_lora);
}

absl::Status CudaGraphDispatcher::InitializeKeys(CudaGraphMode mode) {
  const int q = config_.uniform_decode_query_len;
  mode_ = mode;
  full_keys_.clear();
  piecewise_keys_.clear();
  if (mode == CudaGraphMode::kNone) {
    keys_initialized_ = true;
    return absl::OkStatus();
  }
  ComputePaddingTable();

  std::vector<bool> lora_cases = {false};
  if (config_.lora_enabled) {
    lora_cases = config_.specialize_lora ? std::vector<bool>{true, false}
                                         : std::vector<bool>{true};
  }

  if (mode.mixed_mode() != CudaGraphMode::kNone) {
    auto& keys = mode.mixed_mode() == CudaGraphMode::kFull ? full_keys_ : piecewise_keys_;
    for (int bs : config_.capture_sizes) {
      for (bool lora : lora_cases) {
        auto desc = PaddedDescriptor(bs, false, lora);
        if (!desc.ok()) return desc.status();
        keys.insert(desc->Relaxed());
      }
    }
  }

  if (mode.decode_mode() == CudaGraphMode::kFull && mode.separate_routine()) {
    const int max_num_tokens = q * config_.max_num_seqs;
    for (int bs : config_.capture_sizes) {
      if (bs > max_num_tokens || bs < q) continue;
      for (bool lora : lora_cases) {
        auto desc = PaddedDescriptor(bs, true, lora);
        if (!desc.ok()) return desc.status();
        full_keys_.insert(*desc);
      }
    }
  }
  keys_initialized_ = true;
  return absl::OkStatus();
}

absl::StatusOr<DispatchResult> CudaGraphDispatcher::Dispatch(int num_tokens,
                                                             bool uniform_decode,
                                                             bool has_lora,
                                                             bool disable_full) const {
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_tokens must be >= 0, got ", num_tokens));
  }
  if (!keys_initialized_ || mode_ == CudaGraphMode::kNone ||
      num_tokens > max_capture_size()) {
    return DispatchResult{CudaGraphMode::kNone, BatchDescriptor(num_tokens)};
  }
  auto desc = PaddedDescriptor(num_tokens, uniform_decode, has_lora);
  if (!desc.ok()) return desc.status();
  const BatchDescriptor relaxed = desc->Relaxed();
  if (!disable_full) {
    if (full_keys_.contains(*desc)) return DispatchResult{CudaGraphMode::kFull, *desc};
    if (full_keys_.contains(relaxed)) return DispatchResult{CudaGraphMode::kFull, relaxed};
  }
  if (piecewise_keys_.contains(relaxed)) {
    return DispatchResult{CudaGraphMode::kPiecewise, relaxed};
  }
  return DispatchResult{CudaGraphMode::kNone, BatchDescriptor(num_tokens)};
}

std::vector<CaptureGroup> CudaGraphDispatcher::CaptureDescriptors() const {
  std::vector<CaptureGroup> groups;
  if (!keys_initialized_ || mode_ == CudaGraphMode::kNone) return groups;
  for (CudaGraphMode m : {CudaGraphMode::kPiecewise, CudaGraphMode::kFull}) {
    const auto& set = keys(m);
    if (set.empty()) continue;
    std::vector<BatchDescriptor> descs(set.begin(), set.end());
    std::sort(descs.begin(), descs.end(), [](const BatchDescriptor& a, const BatchDescriptor& b) {
      if (a.num_tokens != b.num_tokens) return a.num_tokens > b.num_tokens;
      if (a.uniform != b.uniform) return a.uniform;
      return a.has_lora && !b.has_lora;
    });
    groups.push_back({m, std::move(descs)});
  }
  return groups;
}

const absl::flat_hash_set<BatchDescriptor>& CudaGraphDispatcher::keys(
    CudaGraphMode runtime_mode) const {
  TANDEM_CHECK(runtime_mode == CudaGraphMode::kFull ||
               runtime_mode == CudaGraphMode::kPiecewise)
      << "keys exist only for FULL and PIECEWISE, got " << runtime_mode;
  return runtime_mode == CudaGraphMode::kFull ? full_keys_ : piecewise_keys_;
}

}  // namespace tandem
