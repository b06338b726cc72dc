#include "common/engine/speculative.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

constexpr int kDefaultLookup = 5;  // vLLM's default for an unset bound
constexpr int kMaxSpeculativeTokens = 32;
constexpr int kMaxLookup = 64;

uint64_t HashNgram(const int32_t* t, int n) {
  // FNV-1a over the token ids; a hit is verified, so collisions cost nothing
  // but a missed proposal.
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; ++i) {
    h ^= static_cast<uint32_t>(t[i]);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

absl::StatusOr<SpeculativeConfig> ParseSpeculativeConfig(const std::string& text) {
  SpeculativeConfig c;
  if (text.empty()) return c;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-config is not a JSON object: '", text,
        "' (e.g. {\"method\": \"ngram\", \"num_speculative_tokens\": 3})"));
  }
  auto int_key = [&](const char* key, int* out, bool* set) -> absl::Status {
    auto it = j.find(key);
    *set = it != j.end() && !it->is_null();
    if (!*set) return absl::OkStatus();
    if (!it->is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--speculative-config: ", key, " must be an integer, got ", it->dump()));
    }
    *out = it->get<int>();
    return absl::OkStatus();
  };
  for (const auto& [key, value] : j.items()) {
    if (key != "method" && key != "num_speculative_tokens" && key != "prompt_lookup_min" &&
        key != "prompt_lookup_max" && key != "draft_len_policy") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--speculative-config: unknown key '", key,
          "' (known: method, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, "
          "draft_len_policy)"));
    }
  }
  if (auto policy = j.find("draft_len_policy"); policy != j.end()) {
    if (!policy->is_string() ||
        (policy->get<std::string>() != "adaptive" && policy->get<std::string>() != "fixed")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--speculative-config: draft_len_policy must be \"adaptive\" or \"fixed\", got ",
          policy->dump()));
    }
    c.adaptive = policy->get<std::string>() == "adaptive";
  }
  auto method = j.find("method");
  if (method == j.end() || !method->is_string() || method->get<std::string>() != "ngram") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-config: method must be \"ngram\" (the one method without a draft "
        "model), got ", method == j.end() ? "nothing" : method->dump()));
  }
  c.method = "ngram";
  bool k_set = false, min_set = false, max_set = false;
  if (auto s = int_key("num_speculative_tokens", &c.num_speculative_tokens, &k_set); !s.ok()) {
    return s;
  }
  if (auto s = int_key("prompt_lookup_min", &c.prompt_lookup_min, &min_set); !s.ok()) return s;
  if (auto s = int_key("prompt_lookup_max", &c.prompt_lookup_max, &max_set); !s.ok()) return s;
  if (!k_set || c.num_speculative_tokens < 1 || c.num_speculative_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-config: num_speculative_tokens must be in [1, ", kMaxSpeculativeTokens,
        "], got ", k_set ? std::to_string(c.num_speculative_tokens) : "nothing"));
  }
  if (!min_set && !max_set) {
    c.prompt_lookup_min = c.prompt_lookup_max = kDefaultLookup;
  } else if (!min_set) {
    c.prompt_lookup_min = c.prompt_lookup_max;
  } else if (!max_set) {
    c.prompt_lookup_max = c.prompt_lookup_min;
  }
  if (c.prompt_lookup_min < 1 || c.prompt_lookup_max > kMaxLookup ||
      c.prompt_lookup_min > c.prompt_lookup_max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-config: need 1 <= prompt_lookup_min (", c.prompt_lookup_min,
        ") <= prompt_lookup_max (", c.prompt_lookup_max, ") <= ", kMaxLookup));
  }
  return c;
}

DraftLength::DraftLength(int max_len, bool adaptive)
    : max_len_(max_len), adaptive_(adaptive), len_(max_len) {}

int DraftLength::Next() {
  if (pause_ > 0) {
    --pause_;
    return 0;
  }
  return len_;
}

void DraftLength::Verified(int drafted, int accepted) {
  if (!adaptive_ || drafted <= 0) return;
  if (accepted > 0) backoff_ = 1;
  if (accepted == drafted) {
    len_ = std::min(max_len_, len_ + 2);
  } else if (accepted > 0 || len_ > 1) {
    len_ = std::max(1, accepted == 0 ? 1 : len_ - 1);
  } else {  // a 1-token draft rejected: pause
    pause_ = backoff_;
    backoff_ = std::min(kMaxPause, 2 * backoff_);
  }
}

NgramProposer::NgramProposer(int min_n, int max_n)
    : min_n_(min_n), max_n_(max_n), maps_(max_n - min_n + 1) {}

void NgramProposer::IndexUpTo(const std::vector<int32_t>& tokens, int64_t end) {
  for (; indexed_ < end; ++indexed_) {
    for (int n = min_n_; n <= max_n_ && n <= indexed_ + 1; ++n) {
      maps_[n - min_n_][HashNgram(tokens.data() + indexed_ - n + 1, n)] = indexed_;
    }
  }
}

void NgramProposer::Propose(const std::vector<int32_t>& tokens, int k,
                            std::vector<int32_t>* drafts) {
  drafts->clear();
  const int64_t len = static_cast<int64_t>(tokens.size());
  // Earlier occurrences end at len - 2 at the latest (one token must follow).
  IndexUpTo(tokens, len - 1);
  if (k < 1) return;
  for (int n = std::min<int64_t>(max_n_, len - 1); n >= min_n_; --n) {
    const int32_t* suffix = tokens.data() + len - n;
    const auto& map = maps_[n - min_n_];
    auto it = map.find(HashNgram(suffix, n));
    if (it == map.end()) continue;
    const int64_t end = it->second;
    if (!std::equal(suffix, suffix + n, tokens.data() + end - n + 1)) continue;
    const int64_t count = std::min<int64_t>(k, len - 1 - end);
    drafts->assign(tokens.begin() + end + 1, tokens.begin() + end + 1 + count);
    return;
  }
}

}  // namespace tandem
