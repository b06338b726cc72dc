// Request: one generation request as the engine tracks it.
//
// Token accounting (vLLM's): tokens() = prompt + output; num_computed tokens
// have their KV in the cache; a step schedules some of the rest and samples
// when it reaches the end of tokens().
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
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::vector<int32_t> output;
  std::vector<int32_t> all_tokens;  // prompt followed by output, contiguous
  int64_t num_computed = 0;
  uint64_t arrival = 0;  // admission order, for preemption (latest first)
  std::mt19937_64 rng;
  FinishReason finish = FinishReason::kNone;
  absl::Status error;
  int preemptions = 0;

  int64_t num_tokens() const { return static_cast<int64_t>(prompt.size() + output.size()); }
  void AppendOutput(int32_t token) {
    output.push_back(token);
    all_tokens.push_back(token);
  }
  bool finished() const { return finish != FinishReason::kNone; }
};

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_REQUEST_H_
