// Speculative decoding by n-gram prompt lookup (vLLM's `method: ngram`):
// the configuration, as vLLM's --speculative-config spells it, and the
// proposer.
//
// The proposer looks up the context's last n tokens (n from
// prompt_lookup_max down to prompt_lookup_min) among its earlier n-grams and
// proposes the (at most k) tokens that followed their latest occurrence. The
// target model verifies them in one step of 1 + k tokens per request
// (LlmEngine::Step; Sampler::Verify).
#ifndef TANDEM_COMMON_ENGINE_SPECULATIVE_H_
#define TANDEM_COMMON_ENGINE_SPECULATIVE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace tandem {

struct SpeculativeConfig {
  std::string method;  // "" (off) or "ngram"
  int num_speculative_tokens = 0;
  int prompt_lookup_min = 0;
  int prompt_lookup_max = 0;
  // Tandem's extension ("draft_len_policy"): "adaptive" (the default) drafts
  // fewer tokens, or none for a while, for a request whose drafts fail (see
  // DraftLength); "fixed" always drafts up to k tokens, as vLLM does.
  bool adaptive = true;

  bool enabled() const { return !method.empty(); }
  // The graph policy's uniform_decode_query_len: 1 + k.
  int query_len() const { return enabled() ? 1 + num_speculative_tokens : 1; }
};

// Parses --speculative-config: "" (off) or a JSON object such as
// {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}.
// As vLLM: num_speculative_tokens is required; an unset lookup bound takes
// the other's value, both unset are 5. INVALID_ARGUMENT names the key, the
// value and the limit.
absl::StatusOr<SpeculativeConfig> ParseSpeculativeConfig(const std::string& json);

// How many tokens one request drafts, adapted to how its drafts fared. On a
// CPU a verification step costs more than a plain one (SmolLM2 Q4_1 on a
// 2-core AVX2 EPYC: 1 + 4 tokens 2.3x one token, docs/benchmarks.md), so a
// draft that is rejected costs time that a plain step would not have; on
// output with few repeats that made speculation slower than plain decoding.
// The rule follows transformers' "heuristic" schedule for assistant tokens
// (all accepted: 2 more; some: 1 fewer, at least 1), but none accepted goes
// straight to 1, and there is a way to 0: when even a 1-token draft is
// rejected, the request stops drafting for 1, 2, 4, ... up
// to 64 steps (back to 1 after any accepted draft), so proposals that keep
// failing cost about nothing while a request that starts copying is back at
// k tokens within a few steps. The output does not depend on it: drafts are
// verified exactly (Sampler::Verify), whatever their number.
class DraftLength {
 public:
  DraftLength(int max_len, bool adaptive);
  // Tokens to draft this step, at most max_len; 0 while paused. Counts the
  // step: call once per step in which the request could draft.
  int Next();
  // After a step verified `drafted` (> 0) tokens of which `accepted` were kept.
  void Verified(int drafted, int accepted);

 private:
  static constexpr int kMaxPause = 64;
  int max_len_;
  bool adaptive_;
  int len_;
  int pause_ = 0;    // steps left without drafting
  int backoff_ = 1;  // the next pause
};

// One request's n-gram index. Each token is indexed once, as the context
// grows: for every n, the n-gram ending at a position maps to the latest
// such position, so a proposal costs (max - min + 1) lookups, never a scan of
// the context. Tokens are only ever appended (rejected drafts never enter
// the context), so the index is never rolled back.
class NgramProposer {
 public:
  NgramProposer(int min_n, int max_n);

  // Appends to `drafts` (cleared first) at most `k` tokens that followed the
  // latest earlier occurrence of the longest matching suffix n-gram of
  // `tokens`; none when no suffix of min_n..max_n tokens occurred before.
  void Propose(const std::vector<int32_t>& tokens, int k, std::vector<int32_t>* drafts);

 private:
  // Indexes the n-grams ending at positions [indexed_, end).
  void IndexUpTo(const std::vector<int32_t>& tokens, int64_t end);

  int min_n_;
  int max_n_;
  int64_t indexed_ = 0;
  // maps_[n - min_n_]: hash of the n tokens ending at a position -> the
  // latest such position (a hit is compared token by token).
  std::vector<absl::flat_hash_map<uint64_t, int64_t>> maps_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_SPECULATIVE_H_
