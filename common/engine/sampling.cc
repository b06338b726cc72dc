#include "common/engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status ValidateSamplingParams(const SamplingParams& p, uint32_t max_tokens_limit,
                                    int32_t max_logprobs) {
  if (p.max_tokens < 1 || p.max_tokens > max_tokens_limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.max_tokens must be in [1, ", max_tokens_limit, "], got ", p.max_tokens));
  }
  if (!(p.temperature >= 0.f) || std::isinf(p.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.temperature must be >= 0, got ", p.temperature));
  }
  if (!(p.top_p > 0.f && p.top_p <= 1.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_p must be in (0, 1], got ", p.top_p));
  }
  if (p.top_k < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_k must be -1 (off), 0 (off) or positive, got ", p.top_k));
  }
  if (!(p.min_p >= 0.f && p.min_p <= 1.f)) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.min_p must be in [0, 1], got ", p.min_p));
  }
  if (!(p.repetition_penalty > 0.f) || std::isinf(p.repetition_penalty)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.repetition_penalty must be > 0 and finite (1 = off), got ", p.repetition_penalty));
  }
  if (!(p.frequency_penalty >= -2.f && p.frequency_penalty <= 2.f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.frequency_penalty must be in [-2, 2], got ", p.frequency_penalty));
  }
  if (!(p.presence_penalty >= -2.f && p.presence_penalty <= 2.f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.presence_penalty must be in [-2, 2], got ", p.presence_penalty));
  }
  if (p.logprobs < -1 || p.logprobs > max_logprobs) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.logprobs must be in [0, ", max_logprobs,
                                                   "] (--max-logprobs) or unset, got ", p.logprobs));
  }
  if (p.prompt_logprobs < -1 || p.prompt_logprobs > max_logprobs) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.prompt_logprobs must be in [0, ",
                                                   max_logprobs, "] (--max-logprobs) or unset, got ",
                                                   p.prompt_logprobs));
  }
  if (p.logit_bias.size() > kMaxLogitBias) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.logit_bias has ", p.logit_bias.size(),
                                                   " entries; the limit is ", kMaxLogitBias));
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (!std::isfinite(bias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.logit_bias[", id, "] must be finite, got ", bias));
    }
  }
  return absl::OkStatus();
}

namespace {

// 53 random bits -> [0, 1): the same on every platform (unlike
// std::uniform_real_distribution, whose algorithm is implementation-defined).
double Uniform(std::mt19937_64* rng) {
  return static_cast<double>((*rng)() >> 11) * (1.0 / 9007199254740992.0);
}

int32_t Argmax(const float* logits, int vocab) {  // ties go to the lowest id
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

}  // namespace

const float* Sampler::Adjust(const float* logits, int vocab, const SamplingParams& params,
                             const TokenHistory& history) {
  if (!params.AdjustsLogits()) return logits;
  if (params.allowed_token_ids.empty()) {
    adjusted_.assign(logits, logits + vocab);
  } else {  // every other token out of the draw
    adjusted_.assign(vocab, -std::numeric_limits<float>::infinity());
    for (int32_t id : params.allowed_token_ids) {
      if (id >= 0 && id < vocab) adjusted_[id] = logits[id];
    }
  }
  // vLLM's bad words: a sequence's last token, where the output ends with
  // the rest of it.
  if (!params.bad_words_token_ids.empty()) {
    auto output_at = [&](size_t back) {  // back-th token from the end of the output so far
      const size_t drafts = history.accepted_drafts.size();
      return back < drafts ? history.accepted_drafts[drafts - 1 - back]
                           : history.output[history.output.size() - 1 - (back - drafts)];
    };
    const size_t produced = history.output.size() + history.accepted_drafts.size();
    for (const std::vector<int32_t>& seq : params.bad_words_token_ids) {
      if (seq.empty() || seq.size() - 1 > produced) continue;
      const size_t prefix = seq.size() - 1;
      bool match = true;
      for (size_t k = 0; k < prefix && match; ++k) match = output_at(k) == seq[prefix - 1 - k];
      if (match && seq.back() >= 0 && seq.back() < vocab) {
        adjusted_[seq.back()] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  // vLLM's MinTokensLogitsProcessor: no stop id while the output is short.
  if (history.output.size() + history.accepted_drafts.size() < params.min_tokens) {
    auto ban = [&](absl::Span<const int32_t> ids) {
      for (int32_t id : ids) {
        if (id >= 0 && id < vocab) adjusted_[id] = -std::numeric_limits<float>::infinity();
      }
    };
    ban(params.stop_token_ids);
    if (!params.ignore_eos) ban(history.eos_ids);
  }
  for (const auto& [id, bias] : params.logit_bias) {
    if (id >= 0 && id < vocab) adjusted_[id] += bias;
  }
  const bool repetition = params.repetition_penalty != 1.f;
  const bool by_output = params.frequency_penalty != 0.f || params.presence_penalty != 0.f;
  if (!repetition && !by_output) return adjusted_.data();
  if (counts_.size() != static_cast<size_t>(vocab)) {
    counts_.assign(vocab, 0);
    in_prompt_.assign(vocab, 0);
  }
  touched_.clear();
  auto count = [&](absl::Span<const int32_t> ids) {
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab) continue;
      if (counts_[id]++ == 0) touched_.push_back(id);  // the prompt is marked after
    }
  };
  count(history.output);
  count(history.accepted_drafts);
  if (repetition) {
    for (int32_t id : history.prompt) {
      if (id < 0 || id >= vocab || in_prompt_[id]) continue;
      if (counts_[id] == 0) touched_.push_back(id);
      in_prompt_[id] = 1;
    }
  }
  // vLLM's apply_penalties: repetition over the prompt and the output, then
  // frequency and presence over the output.
  for (int32_t id : touched_) {
    float& l = adjusted_[id];
    if (repetition) l = l > 0.f ? l / params.repetition_penalty : l * params.repetition_penalty;
    if (counts_[id] > 0) {
      l -= params.frequency_penalty * static_cast<float>(counts_[id]);
      l -= params.presence_penalty;
    }
    counts_[id] = 0;
    in_prompt_[id] = 0;
  }
  return adjusted_.data();
}

void Sampler::Logprobs(const float* logits, int vocab, int32_t token, int top,
                       TokenLogprobs* out) {
  const float max_logit = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double log_z = max_logit + std::log(sum);
  out->logprob = static_cast<float>(logits[token] - log_z);
  out->rank = 1 + static_cast<int32_t>(std::count_if(
                      logits, logits + vocab, [&](float x) { return x > logits[token]; }));
  out->top.clear();
  if (top <= 0) return;
  top = std::min(top, vocab);
  ranked_.resize(vocab);
  for (int i = 0; i < vocab; ++i) ranked_[i] = {logits[i], i};
  std::partial_sort(ranked_.begin(), ranked_.begin() + top, ranked_.end(),
                    [](const auto& a, const auto& b) {
                      return a.first != b.first ? a.first > b.first : a.second < b.second;
                    });
  for (int i = 0; i < top; ++i) {
    out->top.emplace_back(ranked_[i].second, static_cast<float>(ranked_[i].first - log_z));
  }
}

size_t Sampler::Distribution(const float* logits, int vocab, const SamplingParams& params,
                             double* total_out) {
  candidates_.resize(vocab);
  for (int i = 0; i < vocab; ++i) candidates_[i] = {logits[i] / params.temperature, i};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t keep = candidates_.size();
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < keep) {
    keep = params.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  const float max_logit = candidates_[0].first;
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    candidates_[i].first = std::exp(candidates_[i].first - max_logit);
    // min-p: a token's probability over the most likely one's is its weight
    // here, and the weights fall along the sorted candidates.
    if (candidates_[i].first < params.min_p) {
      keep = i;
      break;
    }
    total += candidates_[i].first;
  }
  if (params.top_p < 1.f) {  // smallest prefix whose mass reaches top_p
    double cum = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cum += candidates_[i].first / total;
      if (cum >= params.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = 0;
    for (size_t i = 0; i < keep; ++i) total += candidates_[i].first;
  }
  *total_out = total;
  return keep;
}

int32_t Sampler::Draw(size_t keep, double total, int32_t skip, std::mt19937_64* rng) const {
  const double target = Uniform(rng) * total;
  double acc = 0;
  size_t last = keep;
  for (size_t i = 0; i < keep; ++i) {
    if (candidates_[i].second == skip) continue;
    last = i;
    acc += candidates_[i].first;
    if (target < acc) return candidates_[i].second;
  }
  return candidates_[last].second;
}

int32_t Sampler::Sample(const float* logits, int vocab, const SamplingParams& params,
                        const TokenHistory& history, std::mt19937_64* rng) {
  logits = Adjust(logits, vocab, params, history);
  if (params.temperature == 0.f) return Argmax(logits, vocab);
  double total = 0;
  const size_t keep = Distribution(logits, vocab, params, &total);
  return Draw(keep, total, /*skip=*/-1, rng);
}

bool Sampler::Verify(const float* logits, int vocab, const SamplingParams& params,
                     const TokenHistory& history, int32_t draft, std::mt19937_64* rng,
                     int32_t* token) {
  logits = Adjust(logits, vocab, params, history);
  if (params.temperature == 0.f) {
    *token = Argmax(logits, vocab);
    return *token == draft;
  }
  double total = 0;
  const size_t keep = Distribution(logits, vocab, params, &total);
  double p = 0;  // the draft's weight; 0 when top-k/top-p dropped it
  for (size_t i = 0; i < keep; ++i) {
    if (candidates_[i].second == draft) {
      p = candidates_[i].first;
      break;
    }
  }
  if (Uniform(rng) * total < p) {
    *token = draft;
    return true;
  }
  *token = Draw(keep, total - p, draft, rng);
  return false;
}

}  // namespace tandem
