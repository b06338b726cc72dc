#include "common/serving/text_output.h"

#include <algorithm>

namespace tandem {

TextOutput::TextOutput(const Tokenizer* tokenizer, bool skip_special_tokens,
                       std::vector<std::string> stop, bool include_stop, uint32_t min_tokens)
    : detok_(tokenizer, skip_special_tokens),
      stop_(std::move(stop)),
      include_stop_(include_stop),
      min_tokens_(min_tokens) {
  stop_.erase(std::remove(stop_.begin(), stop_.end(), std::string()), stop_.end());
  for (const std::string& s : stop_) hold_ = std::max(hold_, s.size() - 1);
}

std::string TextOutput::Add(const std::vector<int32_t>& ids) {
  if (stopped_) return "";
  pending_ += detok_.Add(ids);
  num_tokens_ += static_cast<uint32_t>(ids.size());
  if (num_tokens_ <= min_tokens_) fresh_ = pending_.size();  // not looked at for stops
  return Scan(/*final=*/false);
}

size_t TextOutput::AddUntilStop(const std::vector<int32_t>& ids, std::string* text, bool stop_token) {
  const size_t with_text = stop_token && !include_stop_ && !ids.empty() ? ids.size() - 1 : ids.size();
  if (stop_.empty()) {
    *text += Add({ids.begin(), ids.begin() + with_text});
    return ids.size();
  }
  size_t n = 0;
  while (n < with_text && !stopped_) *text += Add({ids[n++]});
  return stopped_ ? n : ids.size();
}

std::string TextOutput::Finish() {
  if (stopped_) return "";
  pending_ += detok_.Finish();
  return Scan(/*final=*/true);
}

std::string TextOutput::Scan(bool final) {
  // Every earlier return held back `hold_` bytes, so a stop string can only
  // start inside pending_: in its new text, or up to its length - 1 bytes
  // before it (a match across the point).
  size_t first = std::string::npos;
  for (const std::string& s : stop_) {
    const size_t from = fresh_ > s.size() - 1 ? fresh_ - (s.size() - 1) : 0;
    const size_t at = pending_.find(s, from);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  std::string out;
  if (first != std::string::npos) {
    stopped_ = true;
    out = pending_.substr(0, include_stop_ ? first + matched_.size() : first);
    pending_.clear();
    fresh_ = 0;
    return out;
  }
  size_t cut = final ? pending_.size() : pending_.size() - std::min(pending_.size(), hold_);
  // Never cut inside a UTF-8 character.
  while (cut > 0 && cut < pending_.size() && (static_cast<uint8_t>(pending_[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  fresh_ = pending_.size();
  return out;
}

}  // namespace tandem
