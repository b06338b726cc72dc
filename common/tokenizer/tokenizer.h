// Tokenizer: text <-> token ids, reproducing Hugging Face `tokenizers` for
// the BPE families Llama-style models ship:
//  - byte-level BPE (GPT-2, SmolLM, Llama 3, Qwen): Split/Digits/ByteLevel
//    pre-tokenizers with the split regex as written in the file (ICU regex,
//    which has the lookahead these patterns use), ByteLevel decoder;
//  - SentencePiece-style BPE (Llama 2, TinyLlama, Mistral): Prepend/Replace
//    normalizers or the Metaspace pre-tokenizer, byte fallback, the
//    Replace/ByteFallback/Fuse/Strip decoder chain.
// Added tokens are matched first and never split; special ones are dropped on
// decode when asked. The post-processor's template adds BOS/EOS.
//
// Two sources, one type: a tokenizer.json (FromHuggingFaceJson) or the
// vocabulary embedded in a GGUF file (FromGgufVocab; `tokenizer.ggml.model`
// gpt2 or llama), which the model layer reads into a GgufVocab.
//
// Immutable after creation except for an internal word cache; Encode() and
// Decode() are thread-safe.
#ifndef TANDEM_COMMON_TOKENIZER_TOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// The tokenizer fields of a GGUF file (tokenizer.ggml.*).
struct GgufVocab {
  std::string model;                 // "gpt2" or "llama"
  std::string pre;                   // pre-tokenizer name ("" = default)
  std::vector<std::string> tokens;
  std::vector<std::string> merges;   // "a b" (gpt2)
  std::vector<float> scores;         // (llama)
  std::vector<int32_t> token_types;  // 1 normal, 2 unknown, 3 control, 4 user, 5 unused, 6 byte
  int32_t bos_id = -1, eos_id = -1, unk_id = -1;
  bool add_bos = false, add_eos = false;
  bool add_space_prefix = true;      // (llama)
};

class Tokenizer {
 public:
  // INVALID_ARGUMENT names `source` and the component the tokenizer does not
  // implement (model type, normalizer, pre-tokenizer, decoder, regex).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromHuggingFaceJson(
      absl::string_view json_text, const std::string& source);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGgufVocab(const GgufVocab& vocab,
                                                                   const std::string& source);
  ~Tokenizer();

  // Ids of `text`; with add_special_tokens the post-processor's BOS/EOS.
  std::vector<int32_t> Encode(absl::string_view text, bool add_special_tokens = true) const;
  // Text of `ids` (invalid UTF-8 replaced by U+FFFD, as `tokenizers`); ids
  // outside the vocabulary are skipped.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
  // The token's string in the vocabulary ("" when none).
  std::string IdToToken(int32_t id) const;
  // The bytes the token stands for in the middle of a text (not always
  // UTF-8 on its own: a byte-level token may hold part of a character); an
  // added token's content; "" when the id has none.
  std::string TokenBytes(int32_t id) const;
  // -1 when absent.
  int32_t TokenToId(absl::string_view token) const;
  bool IsSpecial(int32_t id) const;
  // Whether the decoder joins `id` with its neighbours byte-wise (a <0xXX>
  // token under ByteFallback): text ending in one is not final yet.
  bool IsByteFallbackToken(int32_t id) const;
  // Largest id + 1.
  int32_t vocab_size() const;
  // Ids the post-processor adds before / after a sequence.
  const std::vector<int32_t>& prefix_ids() const;
  const std::vector<int32_t>& suffix_ids() const;
  const std::string& source() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_TOKENIZER_H_
