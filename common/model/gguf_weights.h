// A GGUF file as a model of one of the families in the table of
// llama_config.h: the architecture from its `<general.architecture>.*`
// metadata (llama.*, qwen2.*, qwen3.*) and its tensors under Hugging Face
// names.
//
// For Llama, llama.cpp's converter stores q_proj / k_proj rows permuted for
// its rope layout (each head's two rotary halves interleaved); ReadF32 undoes
// that so
// the weights equal the Hugging Face checkpoint's and the engine's rope
// (rotate_half) applies unchanged. A `rope_freqs.weight` tensor (llama3-style
// rope scaling, stored as per-frequency divisors) is exposed as "rope_freqs".
//
// Immutable after Open(); start-up only.
#ifndef TANDEM_COMMON_MODEL_GGUF_WEIGHTS_H_
#define TANDEM_COMMON_MODEL_GGUF_WEIGHTS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/gguf.h"
#include "common/model/llama_config.h"
#include "common/model/weight_source.h"

namespace tandem {

// True when `spec` names a GGUF file (ends in .gguf).
bool IsGgufSpec(const std::string& spec);

// The LlamaConfig of a GGUF file. INVALID_ARGUMENT names the key and value
// the engine does not implement: an architecture the family table lacks,
// partial rotary dimensions, rope scaling other than none or rope_freqs,
// experts, sliding windows, ...
absl::StatusOr<LlamaConfig> LlamaConfigFromGguf(const GgufFile& file);

class GgufWeights : public WeightSource {
 public:
  // `file` must outlive this object.
  GgufWeights(const GgufFile* file, const LlamaConfig& config) : file_(file), config_(config) {}

  absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                       float* dst) const override;
  bool Has(const std::string& name) const override;
  std::optional<DType> BlockType(const std::string& name) const override;
  absl::Status ReadBlocks(const std::string& name, const std::vector<int64_t>& shape,
                          void* dst) const override;
  std::vector<std::string> TensorNames() const override;

  // The GGUF name of a Hugging Face tensor name ("" when it has none). An
  // expert's tensor (model.layers.N.mlp.experts.J.gate_proj.weight) is slice
  // J of a stacked GGUF tensor (blk.N.ffn_gate_exps.weight): J goes to
  // `*expert` when given (-1 for the others).
  static std::string GgufName(const std::string& hf_name, int* expert = nullptr);
  // The Hugging Face name of a GGUF tensor name (the name itself when unknown).
  static std::string HfName(const std::string& gguf_name);

 private:
  // The bytes behind a Hugging Face name: a whole tensor, or one expert's
  // slice of a stacked one.
  struct View {
    const GgufTensorInfo* tensor = nullptr;
    const uint8_t* data = nullptr;
    int64_t numel = 0;
  };
  // The GGUF tensor behind Hugging Face name `name`: with `*expert` the
  // slice of a stacked tensor (-1: the whole tensor, as an older file's
  // one tensor an expert); null when the file has none.
  const GgufTensorInfo* Resolve(const std::string& name, int* expert) const;
  // The tensor (or expert slice) behind Hugging Face name `name`, its shape
  // checked.
  absl::StatusOr<View> Find(const std::string& name, const std::vector<int64_t>& shape) const;
  // fn(src, n, at) over ranges of the view's `rows` rows, split over the
  // pool (WeightSource::ForRanges): src the range's first row in the file, n
  // its elements, `at` its offset in an output of `out_row_bytes` a row.
  void ForRows(const View& v, int64_t rows, size_t out_row_bytes,
               const std::function<void(const uint8_t*, int64_t, size_t)>& fn) const;
  // Undoes llama.cpp's q/k row permutation for those tensors (rows of
  // `row_bytes` each, whatever their type).
  void UnpermuteIfQk(const std::string& gguf_name, char* rows, int64_t num_rows,
                     size_t row_bytes) const;

  const GgufFile* file_;
  LlamaConfig config_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GGUF_WEIGHTS_H_
