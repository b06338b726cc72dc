// KvStreamChecker: the decode worker's verdict on one Prefill stream. KV is
// trusted only when complete: the header matches this worker's model and the
// token range asked for, every chunk has the right sizes and checksum, and at
// `done` every layer's rows for every token of the range arrived exactly once
// (a reordered stream is fine; a missing, duplicated or overlapping row is
// not). Nothing of a stream that fails here may be decoded from or enter the
// prefix cache.
//
// Not thread-safe: one reader (the stream's reactor) feeds it in order.
#ifndef TANDEM_COMMON_SERVING_KV_STREAM_CHECKER_H_
#define TANDEM_COMMON_SERVING_KV_STREAM_CHECKER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "common/serving/kv_transfer.h"
#include "proto/tandem/v1/tandem.pb.h"

namespace tandem {

class KvStreamChecker {
 public:
  // Why a stream was refused, as tandem_kv_transfer_failures_total counts it.
  enum class Failure {
    kNone,
    kFingerprintMismatch,  // another model, dtype or layout; or another token range
    kDataLoss,             // a chunk failed its CRC32C (worth one retry)
    kIncomplete,           // rows missing, duplicated, overlapping or out of range
    kMalformed,            // a message out of order, a chunk of the wrong size
  };
  static const char* FailureName(Failure f);

  // Expects KV for tokens [first, num_tokens) of a model with `local`'s
  // fingerprint; `slot_bytes` bytes per token per layer for K (and for V);
  // of the layers l with l % num_streams == stream_index (one stream of a
  // request's several; tandem.proto's PrefillRequest.num_streams).
  KvStreamChecker(v1::ModelFingerprint local, size_t slot_bytes, int64_t first, int64_t num_tokens,
                  int stream_index = 0, int num_streams = 1);

  // Each returns OK, or the error that ends the stream (failure() says why):
  // FAILED_PRECONDITION for a fingerprint mismatch, INTERNAL for another
  // range, DATA_LOSS for a checksum or coverage error, INVALID_ARGUMENT for a
  // malformed message.
  absl::Status Header(const v1::KvHeader& header);
  absl::Status Chunk(const ReceivedChunk& chunk);
  // The stream says it is complete: DATA_LOSS naming the first layer and
  // token range that did not arrive, else OK.
  absl::Status Done();

  Failure failure() const { return failure_; }
  bool got_header() const { return got_header_; }
  // Bytes of K and V accepted so far.
  size_t bytes() const { return bytes_; }

 private:
  absl::Status Fail(Failure f, absl::Status s);

  v1::ModelFingerprint local_;
  size_t slot_bytes_;
  int64_t first_;
  int64_t end_;
  int stream_index_;
  int num_streams_;
  bool got_header_ = false;
  Failure failure_ = Failure::kNone;
  size_t bytes_ = 0;
  // Per layer: the token ranges received, begin -> end, disjoint and merged
  // when adjacent; complete when it is the one range [first_, end_).
  std::vector<std::map<int64_t, int64_t>> received_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_KV_STREAM_CHECKER_H_
