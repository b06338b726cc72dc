// The API's SamplingParams message as the engine's SamplingParams.
#ifndef TANDEM_COMMON_SERVING_SAMPLING_PROTO_H_
#define TANDEM_COMMON_SERVING_SAMPLING_PROTO_H_

#include "absl/status/statusor.h"
#include "common/engine/sampling.h"
#include "common/tokenizer/tokenizer.h"
#include "proto/tandem/v1/tandem.pb.h"

namespace tandem {

// Sampling parameters from the API message (top_p 0 means 1); its
// structured output compiled, its bad words encoded with `tokenizer` (as
// vLLM's update_from_tokenizer: each word, and with a leading space where
// that gives other tokens of the same count). INVALID_ARGUMENT names a
// schema's fault, or bad words without a tokenizer.
absl::StatusOr<SamplingParams> FromProto(const v1::SamplingParams& p,
                                         const Tokenizer* tokenizer = nullptr);

// What decides a prompt's first token, for the prefill worker that samples
// it: max_tokens 1, and the distribution's fields (temperature, top-p/k,
// min-p, seed, logit bias, allowed tokens, bad words, penalties, logprobs, structured output); the stop conditions stay
// with the decode worker. `prior_output_tokens`: the prompt's last tokens
// that are output already (a preempted request prefilled again).
void FirstTokenSampling(const SamplingParams& s, uint32_t prior_output_tokens,
                        v1::SamplingParams* p);

void ToProto(const TokenLogprobs& lp, v1::TokenLogprobs* p);
TokenLogprobs FromProto(const v1::TokenLogprobs& p);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_SAMPLING_PROTO_H_
