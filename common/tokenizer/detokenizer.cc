#include "common/tokenizer/detokenizer.h"

#include "absl/strings/match.h"

namespace tandem {

std::string IncrementalDetokenizer::Window(size_t begin, size_t end) const {
  return tokenizer_->Decode(std::vector<int32_t>(ids_.begin() + begin, ids_.begin() + end),
                            skip_special_);
}

std::string IncrementalDetokenizer::Add(const std::vector<int32_t>& ids) {
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  // A byte-fallback run may still turn invalid: wait for a token that ends it.
  if (!ids_.empty() && tokenizer_->IsByteFallbackToken(ids_.back())) return "";
  const std::string prefix_text = Window(prefix_offset_, read_offset_);
  const std::string new_text = Window(prefix_offset_, ids_.size());
  if (new_text.size() <= prefix_text.size() || absl::EndsWith(new_text, "\xEF\xBF\xBD")) {
    return "";
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return new_text.substr(prefix_text.size());
}

std::string IncrementalDetokenizer::Finish() {
  const std::string prefix_text = Window(prefix_offset_, read_offset_);
  const std::string new_text = Window(prefix_offset_, ids_.size());
  prefix_offset_ = read_offset_ = ids_.size();
  return new_text.size() > prefix_text.size() ? new_text.substr(prefix_text.size()) : "";
}

}  // namespace tandem
