// BpeModel: byte-pair encoding of one pre-tokenized word, as Hugging Face
// `tokenizers`' BPE model does it: the word's characters (or, with
// byte_fallback, the <0xXX> tokens of a character not in the vocabulary, or
// the unknown token) are merged pair by pair, always the pair of lowest merge
// rank first (leftmost on ties), until no pair merges.
//
// Immutable after Create(); Tokenize() is thread-safe.
#ifndef TANDEM_COMMON_TOKENIZER_BPE_H_
#define TANDEM_COMMON_TOKENIZER_BPE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

struct BpeConfig {
  // token -> id; ids need not be contiguous.
  std::vector<std::pair<std::string, int32_t>> vocab;
  // Merges in rank order (rank = index).
  std::vector<std::pair<std::string, std::string>> merges;
  bool byte_fallback = false;  // unknown characters become <0xXX> tokens
  std::string unk_token;       // "" = none: unknown characters are dropped
  bool fuse_unk = false;       // consecutive unknowns become one
  bool ignore_merges = false;  // a word in the vocabulary is one token
};

class BpeModel {
 public:
  // INVALID_ARGUMENT names a duplicate id or an unknown unk_token. Merges
  // whose parts or result are not in the vocabulary are skipped, as
  // `tokenizers` does.
  static absl::StatusOr<BpeModel> Create(const BpeConfig& config);

  // Appends the ids of `word` (UTF-8) to `out`.
  void Tokenize(absl::string_view word, std::vector<int32_t>* out) const;

  // -1 when absent.
  int32_t TokenToId(absl::string_view token) const;
  // "" when the id has no token.
  const std::string& IdToToken(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;
  // (left id << 32 | right id) -> (rank, merged id)
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::array<int32_t, 256> byte_ids_{};  // <0xXX> tokens, -1 when absent
  bool byte_fallback_ = false;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_BPE_H_
