#include "common/serving/kv_stream_checker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/serving/kv_transfer.h"

namespace tandem {

const char* KvStreamChecker::FailureName(Failure f) {
  switch (f) {
    case Failure::kNone: return "none";
    case Failure::kFingerprintMismatch: return "fingerprint_mismatch";
    case Failure::kDataLoss: return "data_loss";
    case Failure::kIncomplete: return "incomplete";
    case Failure::kMalformed: return "other";
  }
  return "other";
}

KvStreamChecker::KvStreamChecker(v1::ModelFingerprint local, size_t slot_bytes, int64_t first,
                                 int64_t num_tokens, int stream_index, int num_streams)
    : local_(std::move(local)),
      slot_bytes_(slot_bytes),
      first_(first),
      end_(num_tokens),
      stream_index_(stream_index),
      num_streams_(std::max(1, num_streams)),
      received_(local_.num_layers()) {}

absl::Status KvStreamChecker::Fail(Failure f, absl::Status s) {
  failure_ = f;
  return s;
}

absl::Status KvStreamChecker::Header(const v1::KvHeader& header) {
  if (got_header_) {
    return Fail(Failure::kMalformed, absl::InvalidArgumentError("KV stream has a second header"));
  }
  got_header_ = true;
  if (absl::Status s = CheckFingerprint(header.fingerprint(), local_); !s.ok()) {
    return Fail(Failure::kFingerprintMismatch, s);
  }
  if (header.first_token() != first_ || header.num_tokens() != end_) {
    return Fail(Failure::kFingerprintMismatch,
                absl::InternalError(absl::StrCat(
                    "prefill worker sent KV for tokens [", header.first_token(), ", ",
                    header.num_tokens(), "), expected [", first_, ", ", end_, ")")));
  }
  const uint32_t streams = std::max<uint32_t>(1, header.num_streams());
  if (streams != static_cast<uint32_t>(num_streams_) ||
      (streams > 1 && header.stream_index() != static_cast<uint32_t>(stream_index_))) {
    return Fail(Failure::kMalformed,
                absl::InternalError(absl::StrCat(
                    "prefill worker sent stream ", header.stream_index(), " of ", streams,
                    ", expected stream ", stream_index_, " of ", num_streams_)));
  }
  return absl::OkStatus();
}

absl::Status KvStreamChecker::Chunk(const ReceivedChunk& chunk) {
  if (!got_header_) {
    return Fail(Failure::kMalformed,
                absl::InvalidArgumentError("KV stream sent a chunk before its header"));
  }
  if (absl::Status s = VerifyChunk(chunk, slot_bytes_); !s.ok()) {
    return Fail(absl::IsDataLoss(s) ? Failure::kDataLoss : Failure::kMalformed, s);
  }
  const int64_t begin = chunk.first_token;
  const int64_t end = begin + chunk.num_tokens;
  const bool other_stream = chunk.layer % num_streams_ != static_cast<uint32_t>(stream_index_);
  if (chunk.layer >= received_.size() || other_stream || chunk.num_tokens == 0 ||
      begin < first_ || end > end_) {
    return Fail(Failure::kIncomplete,
                absl::DataLossError(absl::StrCat(
                    "KV chunk of layer ", chunk.layer, " tokens [", begin, ", ", end,
                    ") is outside the stream's ", received_.size(), " layers",
                    num_streams_ > 1 ? absl::StrCat(" (those l % ", num_streams_, " == ",
                                                    stream_index_, ")")
                                     : "",
                    " and tokens [", first_, ", ", end_, ")")));
  }
  std::map<int64_t, int64_t>& ranges = received_[chunk.layer];
  auto next = ranges.upper_bound(begin);
  const bool overlaps_prev = next != ranges.begin() && std::prev(next)->second > begin;
  const bool overlaps_next = next != ranges.end() && next->first < end;
  if (overlaps_prev || overlaps_next) {
    return Fail(Failure::kIncomplete,
                absl::DataLossError(absl::StrCat("KV chunk of layer ", chunk.layer, " tokens [",
                                                 begin, ", ", end,
                                                 ") repeats rows the stream already sent")));
  }
  // Insert, merging with the neighbours it touches.
  int64_t b = begin, e = end;
  if (next != ranges.end() && next->first == e) {
    e = next->second;
    next = ranges.erase(next);
  }
  if (next != ranges.begin() && std::prev(next)->second == b) {
    std::prev(next)->second = e;
  } else {
    ranges.emplace_hint(next, b, e);
  }
  bytes_ += chunk.k_bytes + chunk.v_bytes;
  return absl::OkStatus();
}

absl::Status KvStreamChecker::Done() {
  if (!got_header_) {
    return Fail(Failure::kMalformed,
                absl::InvalidArgumentError("KV stream ended before its header"));
  }
  if (first_ >= end_) return absl::OkStatus();
  for (size_t layer = stream_index_; layer < received_.size(); layer += num_streams_) {
    const std::map<int64_t, int64_t>& ranges = received_[layer];
    // The first gap: before the first range, or after the first range's end.
    int64_t gap_begin = first_, gap_end = end_;
    if (!ranges.empty()) {
      auto it = ranges.begin();
      if (it->first == first_) {
        gap_begin = it->second;
        gap_end = std::next(it) != ranges.end() ? std::next(it)->first : end_;
      } else {
        gap_end = it->first;
      }
    }
    if (gap_begin < gap_end) {
      return Fail(Failure::kIncomplete,
                  absl::DataLossError(absl::StrCat(
                      "incomplete KV stream: layer ", layer, " is missing tokens [", gap_begin,
                      ", ", gap_end, ") of [", first_, ", ", end_, ")")));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
