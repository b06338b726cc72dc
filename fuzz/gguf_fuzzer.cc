// GGUF bytes as --model=FILE.gguf meets them: header, metadata, tensor infos,
// every tensor decoded, the Llama config, the tensors read as the engine
// reads them (f32 and kept as blocks), and the embedded tokenizer built and
// used. Any input must end in a Status, never a crash, leak or UB.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/model/gguf.h"
#include "common/model/gguf_weights.h"
#include "common/serving/gguf_vocab.h"
#include "common/tokenizer/detokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = tandem::ParseGgufBytes(data, size, "fuzz.gguf");
  if (!file.ok()) return 0;
  std::vector<float> buf;
  for (const tandem::GgufTensorInfo& t : (*file)->tensors()) {
    if (t.numel() > (1 << 20)) continue;
    buf.resize(t.numel());
    (void)(*file)->ReadF32(t, buf.data());
  }
  // The tensors as the engine reads them: under Hugging Face names, q/k rows
  // un-permuted, block types kept as stored (--weight-dtype=gguf).
  if (auto config = tandem::LlamaConfigFromGguf(**file); config.ok()) {
    const tandem::GgufWeights weights(file->get(), *config);
    std::vector<uint8_t> blocks;
    // Every tensor by the names the engine asks for: an expert's slice of a
    // stacked tensor by its own name.
    for (const std::string& name : weights.TensorNames()) {
      int expert = -1;
      const tandem::GgufTensorInfo* t =
          (*file)->FindTensor(tandem::GgufWeights::GgufName(name, &expert));
      if (t == nullptr || t->dims.empty()) continue;
      std::vector<int64_t> shape(t->dims.rbegin(), t->dims.rend());
      if (expert >= 0) {
        if (shape.size() != 3) continue;
        shape.erase(shape.begin());
      }
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      if (numel > (1 << 20)) continue;
      buf.resize(numel);
      (void)weights.ReadF32(name, shape, buf.data());
      const std::optional<tandem::DType> type = weights.BlockType(name);
      if (!type.has_value() || numel % tandem::kBlockElems != 0) continue;
      blocks.resize(tandem::DTypeBytes(*type, numel));
      (void)weights.ReadBlocks(name, shape, blocks.data());
    }
  }
  auto vocab = tandem::ReadGgufVocab(**file);
  if (!vocab.ok() || vocab->model.empty() || vocab->tokens.size() > 4096) return 0;
  auto tok = tandem::Tokenizer::FromGgufVocab(*vocab, "fuzz.gguf");
  if (!tok.ok()) return 0;
  const std::vector<int32_t> ids = (*tok)->Encode("Hello world 123 <s> \xE2\x82\xAC");
  tandem::IncrementalDetokenizer d(tok->get(), true);
  for (int32_t id : ids) (void)d.Add({id});
  (void)d.Finish();
  return 0;
}
