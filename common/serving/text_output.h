// TextOutput: a request's generated tokens as text, the way the API returns
// it: incremental detokenization (IncrementalDetokenizer) plus stop strings,
// matched across token boundaries and left out of the output (vLLM's
// default), or kept as its end (include_stop_str_in_output). Text that could
// still be the start of a stop string is held back until it cannot.
//
// Not thread-safe: one per request, used by whoever owns the request.
#ifndef TANDEM_COMMON_SERVING_TEXT_OUTPUT_H_
#define TANDEM_COMMON_SERVING_TEXT_OUTPUT_H_

#include <string>
#include <vector>

#include "common/tokenizer/detokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

class TextOutput {
 public:
  // Stop strings are looked for only in text that tokens after the first
  // `min_tokens` add (with the overlap a match across that point needs), as
  // vLLM's detokenizer does.
  TextOutput(const Tokenizer* tokenizer, bool skip_special_tokens, std::vector<std::string> stop,
             bool include_stop = false, uint32_t min_tokens = 0);

  // Adds new token ids; returns the text now final. After a stop string is
  // found, stopped() is true and the text ends before it.
  std::string Add(const std::vector<int32_t>& ids);
  // As Add(), one token at a time, up to the token that completes a stop
  // string: returns how many of `ids` belong to the output (all, unless a
  // stop string ended it) and appends the final text to `*text`. A step may
  // bring several tokens (speculative decoding); none past a stop is kept.
  // `stop_token`: the last of `ids` is the stop token that ended the
  // request, kept as a token but, as vLLM's detokenizer does, without its
  // text (with skip_special_tokens false, an EOS's "</s>"), unless stop
  // strings are included in the output.
  size_t AddUntilStop(const std::vector<int32_t>& ids, std::string* text, bool stop_token = false);
  // The held-back text at the end of the stream (empty after a stop).
  std::string Finish();
  bool stopped() const { return stopped_; }
  // The stop string that ended the output ("" when none).
  const std::string& matched_stop() const { return matched_; }

 private:
  std::string Scan(bool final);

  IncrementalDetokenizer detok_;
  std::vector<std::string> stop_;
  bool include_stop_ = false;
  uint32_t min_tokens_ = 0;
  uint32_t num_tokens_ = 0;  // added so far
  size_t fresh_ = 0;         // pending_ from here on is not yet searched
  size_t hold_ = 0;      // longest stop string - 1
  std::string pending_;  // decoded, not yet returned
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_TEXT_OUTPUT_H_
