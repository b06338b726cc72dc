#include "decode_worker/reasoning.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

}  // namespace

size_t PartialTagAtEnd(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

absl::StatusOr<ReasoningParser> ReasoningParserByName(std::string_view name) {
  if (name.empty()) return ReasoningParser::kNone;
  if (name == "qwen3") return ReasoningParser::kQwen3;
  if (name == "deepseek_r1") return ReasoningParser::kDeepSeekR1;
  return absl::InvalidArgumentError(absl::StrCat("--reasoning-parser='", std::string(name),
                                                 "': expected qwen3, deepseek_r1 or empty (none)"));
}

ReasoningSplitter::ReasoningSplitter(ReasoningParser parser, bool thinking)
    : in_reasoning_(parser != ReasoningParser::kNone && thinking) {}

ReasoningSplitter::Parts ReasoningSplitter::Add(std::string_view text) {
  Parts out;
  if (!in_reasoning_) {
    out.content = std::string(text);
    return out;
  }
  pending_.append(text);
  if (!opened_) {
    // A <think> before the reasoning closes is dropped (the first only).
    const size_t open = pending_.find(kOpen);
    const size_t close = pending_.find(kClose);
    if (open != std::string::npos && (close == std::string::npos || open < close)) {
      pending_.erase(open, kOpen.size());
      opened_ = true;
    }
  }
  const size_t close = pending_.find(kClose);
  if (close != std::string::npos) {
    out.reasoning = pending_.substr(0, close);
    out.content = pending_.substr(close + kClose.size());
    pending_.clear();
    in_reasoning_ = false;
    return out;
  }
  size_t hold = PartialTagAtEnd(pending_, kClose);
  if (!opened_) hold = std::max(hold, PartialTagAtEnd(pending_, kOpen));
  out.reasoning = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::Finish() {
  Parts out;
  out.reasoning = std::move(pending_);
  pending_.clear();
  return out;
}

ReasoningSplitter::Parts ReasoningSplitter::Split(ReasoningParser parser, bool thinking,
                                                  std::string_view text) {
  ReasoningSplitter s(parser, thinking);
  Parts out = s.Add(text);
  Parts rest = s.Finish();
  out.reasoning += rest.reasoning;
  out.content += rest.content;
  return out;
}

}  // namespace tandem
