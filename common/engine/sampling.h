// Sampling parameters and the sampler: greedy (temperature 0), temperature,
// top-k, top-p, min-p, logit bias and the repetition, frequency and presence
// penalties, with a per-request generator so a seeded request gives the same
// tokens on every run and machine. The order is vLLM 0.15.1's (v1 Sampler):
// logit bias, then the penalties (repetition, frequency, presence), then
// greedy argmax, or temperature, min-p, top-k and top-p, and a draw.
#ifndef TANDEM_COMMON_ENGINE_SAMPLING_H_
#define TANDEM_COMMON_ENGINE_SAMPLING_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/structured/json_grammar.h"

namespace tandem {

struct SamplingParams {
  uint32_t max_tokens = 16;
  float temperature = 0.f;  // 0: greedy
  float top_p = 1.f;        // in (0, 1]
  int32_t top_k = -1;       // -1 or 0: no top-k
  std::optional<uint64_t> seed;  // none: unseeded (0 is a seed, as vLLM's)
  std::vector<int32_t> stop_token_ids = {};
  bool ignore_eos = false;
  // Tokens whose probability is below min_p times the most likely token's
  // are dropped (after temperature, before top-k): 0 = off, in [0, 1].
  float min_p = 0.f;
  // vLLM's penalties: a token seen in the prompt or the output has its logit
  // divided by repetition_penalty when positive, multiplied when negative
  // (1 = off, > 0); each output occurrence subtracts frequency_penalty and
  // any output occurrence subtracts presence_penalty once (0 = off, [-2, 2]).
  float repetition_penalty = 1.f;
  float frequency_penalty = 0.f;
  float presence_penalty = 0.f;
  // Added to a token's logit before anything else: (token id, bias), ids
  // distinct and in the vocabulary (checked by LlmEngine::Validate).
  std::vector<std::pair<int32_t, float>> logit_bias = {};
  // vLLM's allowed_token_ids: when not empty, only these tokens may be
  // sampled (ids in the vocabulary, checked by LlmEngine::Validate).
  std::vector<int32_t> allowed_token_ids = {};
  // vLLM's bad_words: as given (passed on to a prefill worker), and as the
  // token sequences they were encoded to: a sequence's last token is banned
  // where the output so far ends with the rest of it (always, for one token).
  std::vector<std::string> bad_words = {};
  std::vector<std::vector<int32_t>> bad_words_token_ids = {};
  // Log-probabilities of each sampled token and of the `logprobs` most
  // likely ones at its position: -1 = none, 0 = the sampled token's only, at
  // most --max-logprobs. vLLM's default mode (raw_logprobs): the log-softmax
  // of the model's logits, before the bias, penalties and temperature.
  int32_t logprobs = -1;
  // Log-probabilities of the prompt's tokens (vLLM's prompt_logprobs): -1 =
  // none, else each prompt token's after the first, and the
  // `prompt_logprobs` most likely at its position (at most --max-logprobs).
  // Such a request computes the logits of every prompt position, so its
  // prompt is computed here whole: no prefix-cache hit, and in chunks no
  // longer than the runner's logit rows.
  int32_t prompt_logprobs = -1;
  // The prompt's last tokens that are output already (a preempted request
  // prefilled again elsewhere): the penalties count them as output.
  uint32_t prior_output_tokens = 0;
  // No stop before this many output tokens: the stop ids (stop_token_ids,
  // and EOS unless ignore_eos) cannot be sampled, and neither they nor stop
  // strings end the output (vLLM's min_tokens). max_tokens still ends it
  // (the API refuses min_tokens > max_tokens; a prefill worker's one-token
  // request carries the caller's min_tokens).
  uint32_t min_tokens = 0;
  // Structured outputs: the reply must match this grammar (a JSON schema, or
  // one of some strings), its tokens masked at each step; null: free text.
  std::shared_ptr<const JsonGrammar> grammar;
  // The LoRA adapter the request runs with (a --lora-modules name; empty:
  // the base model). Not a sampling setting, but the request's, carried with
  // them as far as the engine (vLLM's lora_request); Validate checks it.
  std::string lora_name;
  // The adapter's fingerprint when the caller looked it up (LoraSet::Find;
  // 0: not checked): the request is refused if the name was given other
  // weights since, so that what its caller told a peer about it holds.
  uint64_t lora_fingerprint = 0;
  // The request's place in line under --scheduling-policy=priority (vLLM's
  // `priority`: a lower value is served first, ties by arrival); must be 0
  // under fcfs. Not a sampling setting either: carried as lora_name is.
  int32_t priority = 0;
  // The request's prefix-cache salt (vLLM's `cache_salt`; empty: none): it
  // shares cached blocks only with requests of the same salt and adapter.
  // Carried as lora_name is.
  std::string cache_salt = {};

  // Whether the logits are changed before sampling (bias or a penalty).
  bool AdjustsLogits() const {
    return !logit_bias.empty() || !allowed_token_ids.empty() || !bad_words_token_ids.empty() ||
           repetition_penalty != 1.f ||
           frequency_penalty != 0.f || presence_penalty != 0.f || min_tokens > 0;
  }
};

// At most this many logit_bias entries a request.
inline constexpr size_t kMaxLogitBias = 1024;
// At most this many top log-probabilities a token unless --max-logprobs
// says otherwise (vLLM's max_logprobs default: OpenAI's limit).
inline constexpr int32_t kDefaultMaxLogprobs = 20;
// At most this many bad words a request, each at most this many bytes.
inline constexpr size_t kMaxBadWords = 256;
inline constexpr size_t kMaxBadWordBytes = 256;

// A sampled token's log-probability and the most likely tokens' at its
// position (token id, log-probability), most likely first.
struct TokenLogprobs {
  float logprob = 0.f;
  int32_t rank = 0;  // 1 + the tokens more likely than it (vLLM's rank)
  std::vector<std::pair<int32_t, float>> top;
};

// What the penalties and min_tokens look at: the prompt, and the output so
// far (the tokens sampled, then any drafted tokens already accepted before
// this position); and the model's EOS ids.
struct TokenHistory {
  absl::Span<const int32_t> prompt;
  absl::Span<const int32_t> output;
  absl::Span<const int32_t> accepted_drafts;
  absl::Span<const int32_t> eos_ids;
};

// INVALID_ARGUMENT naming the field, the value and the limit; logprobs and
// prompt_logprobs at most `max_logprobs` (--max-logprobs).
absl::Status ValidateSamplingParams(const SamplingParams& p, uint32_t max_tokens_limit,
                                    int32_t max_logprobs = kDefaultMaxLogprobs);

// Samples one token from `logits[vocab]`. Scratch space is kept between calls
// (no allocation once warmed up). Not thread-safe.
class Sampler {
 public:
  int32_t Sample(const float* logits, int vocab, const SamplingParams& params,
                 const TokenHistory& history, std::mt19937_64* rng);

  // Speculative verification of a drafted token against the target's
  // `logits` at its position, so that the tokens that come out are
  // distributed exactly as Sample()'s (rejection sampling for a
  // deterministic draft, Leviathan et al. 2023): greedy keeps the draft iff
  // it is the argmax; otherwise it is kept with the target's probability p of
  // it, and on rejection a token is drawn from p with the draft removed,
  // renormalised. Returns true when kept; else *token is the replacement.
  bool Verify(const float* logits, int vocab, const SamplingParams& params,
              const TokenHistory& history, int32_t draft, std::mt19937_64* rng, int32_t* token);

  // `token`'s log-probability under `logits` and the `top` most likely
  // tokens' (ties: the lower id first).
  void Logprobs(const float* logits, int vocab, int32_t token, int top, TokenLogprobs* out);

  // The logits greedy and temperature sampling start from: `logits` itself,
  // or a copy with min_tokens' bans, the logit bias and the penalties
  // applied (valid until the next call).
  const float* Adjust(const float* logits, int vocab, const SamplingParams& params,
                      const TokenHistory& history);

 private:
  // Fills candidates_ with the unnormalised probabilities after temperature,
  // top-k and top-p, highest first; returns how many are kept and their sum.
  size_t Distribution(const float* logits, int vocab, const SamplingParams& params,
                      double* total);
  // One draw from the first `keep` candidates, skipping token `skip` (whose
  // weight `total` must not include).
  int32_t Draw(size_t keep, double total, int32_t skip, std::mt19937_64* rng) const;

  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<float> adjusted_;
  std::vector<std::pair<float, int32_t>> ranked_;
  // Per token: output occurrences, and whether it is in the prompt; zero
  // between calls (only the touched entries are reset).
  std::vector<int32_t> counts_;
  std::vector<uint8_t> in_prompt_;
  std::vector<int32_t> touched_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_SAMPLING_H_
