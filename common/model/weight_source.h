// WeightSource: where a model's tensors come from, in Hugging Face naming
// (model.layers.N.self_attn.q_proj.weight, ...), whatever the file format.
// Implemented by SafetensorsCheckpoint (safetensors.h) and GgufWeights
// (gguf_weights.h); LlamaModel::Load reads through it and checks that every
// tensor the source holds is one the engine uses.
//
// Used at start-up only; implementations are immutable once opened (but for
// the pool their conversions run on, set before the first read).
#ifndef TANDEM_COMMON_MODEL_WEIGHT_SOURCE_H_
#define TANDEM_COMMON_MODEL_WEIGHT_SOURCE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/backend/tensor.h"
#include "common/base/thread_pool.h"

namespace tandem {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Reads tensor `name` as f32 into `dst` (product of `shape` floats).
  // NOT_FOUND names the tensor and the source; INVALID_ARGUMENT names the
  // tensor and a shape or type the reader cannot give.
  virtual absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                               float* dst) const = 0;
  virtual bool Has(const std::string& name) const = 0;
  // The block type tensor `name` is kept in when the ops keep a file's
  // blocks: its own where the ops multiply it as stored (GGUF Q4_0, Q4_1,
  // Q8_0), Q4_1 for Q4_K (its sub-blocks), Q8_0 for the other block types
  // (Q5_0 and IQ4_NL exactly, the rest requantized); none otherwise.
  virtual std::optional<DType> BlockType(const std::string& name) const {
    return std::nullopt;
  }
  // Reads tensor `name` (of BlockType(name), [rows, cols] in `shape`) in
  // that type, rows of whole blocks, into `dst` (DTypeBytes of it). A source
  // that stores no block types (safetensors) refuses every tensor.
  virtual absl::Status ReadBlocks(const std::string& name, const std::vector<int64_t>& shape,
                                  void* dst) const {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' is not stored in blocks"));
  }
  // Every tensor of the source, in Hugging Face naming where one exists.
  virtual std::vector<std::string> TensorNames() const = 0;

  // From now on a tensor's conversion (decoding, repacking) is split over
  // `pool`'s threads (null: the caller's alone). The pool must outlive the
  // reads; one reader at a time, as the pool takes one caller.
  void set_pool(ThreadPool* pool) { pool_ = pool; }

  // Rows of `row_bytes` (of output) in each range a conversion is split
  // into: at least 64 KiB, below which handing a range out costs more than
  // converting it.
  static int64_t MinRowsPerRange(size_t row_bytes) {
    return std::max<int64_t>(1, (int64_t{1} << 16) / static_cast<int64_t>(std::max<size_t>(1, row_bytes)));
  }

 protected:
  // fn(begin, end) over [0, n) in contiguous ranges of at least `min_chunk`,
  // on the pool's threads when one is set.
  void ForRanges(int64_t n, int64_t min_chunk,
                 const std::function<void(int64_t, int64_t)>& fn) const {
    if (pool_ == nullptr) return fn(0, n);
    pool_->ParallelFor(n, min_chunk, fn);
  }

 private:
  ThreadPool* pool_ = nullptr;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_WEIGHT_SOURCE_H_
