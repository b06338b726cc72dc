// Sampling parameters and the sampler: greedy (temperature 0), temperature,
// top-k, top-p, with a per-request generator so a seeded request gives the
// same tokens on every run and machine.
#ifndef TANDEM_COMMON_ENGINE_SAMPLING_H_
#define TANDEM_COMMON_ENGINE_SAMPLING_H_

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

struct SamplingParams {
  uint32_t max_tokens = 16;
  float temperature = 0.f;  // 0: greedy
  float top_p = 1.f;        // in (0, 1]
  int32_t top_k = -1;       // -1 or 0: no top-k
  uint64_t seed = 0;        // 0: unseeded
  std::vector<int32_t> stop_token_ids = {};
  bool ignore_eos = false;
};

// INVALID_ARGUMENT naming the field, the value and the limit.
absl::Status ValidateSamplingParams(const SamplingParams& p, uint32_t max_tokens_limit);

// Samples one token from `logits[vocab]`. Scratch space is kept between calls
// (no allocation once warmed up). Not thread-safe.
class Sampler {
 public:
  int32_t Sample(const float* logits, int vocab, const SamplingParams& params,
                 std::mt19937_64* rng);

  // Speculative verification of a drafted token against the target's
  // `logits` at its position, so that the tokens that come out are
  // distributed exactly as Sample()'s (rejection sampling for a
  // deterministic draft, Leviathan et al. 2023): greedy keeps the draft iff
  // it is the argmax; otherwise it is kept with the target's probability p of
  // it, and on rejection a token is drawn from p with the draft removed,
  // renormalised. Returns true when kept; else *token is the replacement.
  bool Verify(const float* logits, int vocab, const SamplingParams& params, int32_t draft,
              std::mt19937_64* rng, int32_t* token);

 private:
  // Fills candidates_ with the unnormalised probabilities after temperature,
  // top-k and top-p, highest first; returns how many are kept and their sum.
  size_t Distribution(const float* logits, int vocab, const SamplingParams& params,
                      double* total);
  // One draw from the first `keep` candidates, skipping token `skip` (whose
  // weight `total` must not include).
  int32_t Draw(size_t keep, double total, int32_t skip, std::mt19937_64* rng) const;

  std::vector<std::pair<float, int32_t>> candidates_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_SAMPLING_H_
