// Request: one generation request as the engine tracks it.
//
// Token accounting (vLLM's): tokens = prompt followed by output; the first
// num_computed tokens have their KV in the cache; a step schedules some of
// the rest and samples when it reaches the end of tokens.
//
// States (vLLM v1's RequestStatus):
//   WAITING ----------------> RUNNING -----> FINISHED_*
//      |  (remote prefill)       |  ^
//      v                         v  |
//   WAITING_FOR_REMOTE_KV     PREEMPTED (blocks freed, waits to be recomputed)
//      | (KV and first token in)
//      +--> WAITING (holding its blocks)
// A request owns its block table in every state but PREEMPTED (and WAITING
// before its first admission); the engine's one Abort path frees it wherever
// it is. A finished prefill-only request keeps its blocks for export until
// the caller releases it (vLLM's delayed free for KV transfer).
#ifndef TANDEM_COMMON_ENGINE_REQUEST_H_
#define TANDEM_COMMON_ENGINE_REQUEST_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/engine/sampling.h"
#include "common/engine/speculative.h"

namespace tandem {

enum class FinishReason { kNone, kStop, kLength, kAborted, kError };

enum class RequestState {
  kWaiting,
  kWaitingForRemoteKv,
  kRunning,
  kPreempted,
  kFinishedStopped,
  kFinishedLengthCapped,
  kFinishedAborted,
  kFinishedError,
};
inline constexpr int kNumRequestStates = 8;
// "waiting", "waiting_for_remote_kv", "running", ... (metric labels).
const char* RequestStateName(RequestState s);
inline bool IsFinished(RequestState s) { return s >= RequestState::kFinishedStopped; }

enum class RequestKind {
  kGenerate,       // prefill then decode until a stop condition
  kPrefillOnly,    // prefill, sample the first token, then finish keeping its KV
  // Generate, but the prompt's KV and first token are computed elsewhere (a
  // prefill worker): once blocks are reserved the request waits in
  // WAITING_FOR_REMOTE_KV for them, then decodes here.
  kRemotePrefill,
};

struct Request {
  std::string id;
  RequestKind kind = RequestKind::kGenerate;
  RequestState state = RequestState::kWaiting;
  std::vector<int32_t> tokens;  // prompt followed by output, contiguous
  int64_t prompt_len = 0;
  SamplingParams params;
  // Its LoRA adapter (params.lora_name's LoraSet slot; 0: the base model),
  // and the root of its prefix-cache blocks: that adapter's fingerprint,
  // salted by params.cache_salt when it has one.
  int lora_slot = 0;
  uint64_t cache_root = 0;
  int64_t num_computed = 0;
  // Tokens of the last admission served from the prefix cache.
  int64_t num_cached_tokens = 0;
  uint64_t arrival = 0;     // admission order, for preemption (latest first)
  absl::Time queued_at;     // when it was added, for the waiting timeout
  absl::Time admitted_at = absl::InfinitePast();  // first given blocks
  std::mt19937_64 rng;
  FinishReason finish = FinishReason::kNone;
  bool stop_token = false;  // finish is kStop by a stop token (EOS or stop_token_ids)
  absl::Status error;
  int preemptions = 0;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_output_tokens() const { return num_tokens() - prompt_len; }
  bool finished() const { return finish != FinishReason::kNone; }
  // A kRemotePrefill request whose uncomputed tokens' KV must come from a
  // prefill worker (set when added and when preempted, cleared when it came).
  bool needs_remote_kv = false;
  // Speculative decoding: the request's n-gram index (made on its first
  // proposal), and this step's drafted tokens: proposed before scheduling,
  // trimmed by the scheduler, verified after the step (never in `tokens`).
  std::unique_ptr<NgramProposer> proposer;
  std::unique_ptr<DraftLength> draft_length;
  std::vector<int32_t> drafts;
  // The step's input when it carries drafts: the last token, then drafts.
  std::vector<int32_t> step_tokens;
  // Structured outputs: the reply's progress through params.grammar.
  std::unique_ptr<GrammarMatcher> matcher;
  // While a step computes this kPrefillOnly request's rows [num_computed,
  // step_kv_end): they become final layer by layer (LlmEngine::KvReadyTokens).
  // 0 outside a step.
  int64_t step_kv_end = 0;
  // Prompt logprobs: positions [1, prompt_logprobs_end()) of the prompt get
  // one (the original prompt: not output prefilled again); those up to
  // prompt_logprobs_done have been reported (a recomputed prompt does not
  // report them twice).
  int64_t prompt_logprobs_done = 0;
  int64_t prompt_logprobs_end() const {
    return params.prompt_logprobs < 0 ? 0 : prompt_len - params.prior_output_tokens;
  }
  // Whether a chunk of the prompt from `start` computes logits for every
  // row (some position after it is owed a prompt logprob).
  bool WantsPromptLogits(int64_t start) const { return start + 1 < prompt_logprobs_end(); }
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_REQUEST_H_
