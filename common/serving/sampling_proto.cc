#include "common/serving/sampling_proto.h"

namespace tandem {

SamplingParams FromProto(const v1::SamplingParams& p) {
  SamplingParams s;
  s.max_tokens = p.max_tokens();
  s.temperature = p.temperature();
  s.top_p = p.top_p() == 0.f ? 1.f : p.top_p();
  s.top_k = p.top_k();
  s.seed = p.seed();
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  return s;
}

}  // namespace tandem
