// Request: one generation request as the engine tracks it.
//
// Token accounting (vLLM's): tokens = prompt followed by output; the first
// num_computed tokens have their KV in the cache; a step schedules some of
// the rest and samples when it reaches the end of tokens.
#ifndef TANDEM_COMMON_ENGINE_REQUEST_H_
#define TANDEM_COMMON_ENGINE_REQUEST_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/engine/sampling.h"

namespace tandem {

enum class FinishReason { kNone, kStop, kLength, kAborted, kError };

enum class RequestKind {
  kGenerate,     // prefill then decode until a stop condition
  kPrefillOnly,  // prefill, sample the first token, then finish keeping its KV
};

struct Request {
  std::string id;
  RequestKind kind = RequestKind::kGenerate;
  std::vector<int32_t> tokens;  // prompt followed by output, contiguous
  int64_t prompt_len = 0;
  SamplingParams params;
  int64_t num_computed = 0;
  uint64_t arrival = 0;  // admission order, for preemption (latest first)
  std::mt19937_64 rng;
  FinishReason finish = FinishReason::kNone;
  absl::Status error;
  int preemptions = 0;
  // When preempted, leave the engine and report it (RequestOutput::preempted)
  // instead of waiting to be recomputed here: the caller has its KV computed
  // elsewhere (a decode worker re-prefills it on a prefill worker).
  bool return_on_preemption = false;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_output_tokens() const { return num_tokens() - prompt_len; }
  bool finished() const { return finish != FinishReason::kNone; }
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_REQUEST_H_
