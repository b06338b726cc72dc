// IncrementalDetokenizer: the text of a growing token sequence, a piece at a
// time, never splitting a multi-byte character and never emitting text a
// later token could still change (vLLM's prefix/read offset method): the
// sequence is decoded in a window that starts one emission back, and new text
// is released only when it does not end in U+FFFD (an unfinished character)
// nor in a byte-fallback token (a later byte may make the run invalid).
// The concatenation of everything Add() and Finish() return equals
// Tokenizer::Decode() of all the ids at once.
//
// Not thread-safe: one per request.
#ifndef TANDEM_COMMON_TOKENIZER_DETOKENIZER_H_
#define TANDEM_COMMON_TOKENIZER_DETOKENIZER_H_

#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace tandem {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer* tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

  // Appends `ids` and returns the text they made final ("" while waiting).
  std::string Add(const std::vector<int32_t>& ids);
  // Returns whatever is still held back (end of the sequence).
  std::string Finish();

 private:
  std::string Window(size_t begin, size_t end) const;

  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // window start
  size_t read_offset_ = 0;    // ids up to here are emitted
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_DETOKENIZER_H_
