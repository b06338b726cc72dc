// Reading Hugging Face safetensors checkpoints: one model.safetensors, or
// shards listed by model.safetensors.index.json. F32, F16 and BF16 tensors are
// converted to f32 on load.
//
// Not thread-safe; used at start-up.
#ifndef TANDEM_COMMON_MODEL_SAFETENSORS_H_
#define TANDEM_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/weight_source.h"

namespace tandem {

struct SafetensorsEntry {
  std::string file;    // path of the shard holding the tensor
  std::string dtype;   // "F32", "F16", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // absolute byte offsets in `file`
  uint64_t end = 0;
};

class SafetensorsCheckpoint : public WeightSource {
 public:
  // Opens `dir`/model.safetensors or the shards of
  // `dir`/model.safetensors.index.json. NOT_FOUND / INVALID_ARGUMENT name the file.
  static absl::StatusOr<SafetensorsCheckpoint> Open(const std::string& dir);
  // Opens one .safetensors file.
  static absl::StatusOr<SafetensorsCheckpoint> OpenFile(const std::string& path);

  bool Has(const std::string& name) const override { return entries_.count(name) > 0; }
  std::vector<std::string> TensorNames() const override;
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }

  // Reads tensor `name` as f32 into `dst` (numel floats). NOT_FOUND names the
  // tensor and the checkpoint; INVALID_ARGUMENT names the tensor, its file,
  // and the expected and actual shapes or an unsupported dtype.
  absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& expected_shape,
                       float* dst) const override;

 private:
  absl::Status AddFile(const std::string& path);
  std::string description_;
  std::map<std::string, SafetensorsEntry> entries_;
};

// Writes tensors as one F32 safetensors file (tests and fixtures).
absl::Status WriteSafetensorsF32(
    const std::string& path,
    const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>& tensors);

// IEEE half / bfloat16 to float.
float HalfToFloat(uint16_t h);
float Bf16ToFloat(uint16_t b);

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_SAFETENSORS_H_
