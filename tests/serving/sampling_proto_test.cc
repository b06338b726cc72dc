// The API's sampling message to the engine's and back, and what a decode
// worker asks of the prefill worker that samples a prompt's first token.
#include "common/serving/sampling_proto.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(SamplingProtoTest, FieldsReachTheEngineWithTheirNeutralDefaults) {
  v1::SamplingParams p;
  p.set_max_tokens(9);
  SamplingParams s = *FromProto(p);
  EXPECT_EQ(s.top_p, 1.f);
  EXPECT_EQ(s.repetition_penalty, 1.f);
  EXPECT_EQ(s.logprobs, -1);
  EXPECT_FALSE(s.AdjustsLogits());
  p.set_min_p(0.2f);
  p.set_repetition_penalty(1.3f);
  p.set_frequency_penalty(-0.5f);
  p.set_presence_penalty(0.25f);
  (*p.mutable_logit_bias())[30] = 2.f;
  (*p.mutable_logit_bias())[4] = -1.f;
  p.mutable_logprobs()->set_value(0);
  p.set_min_tokens(3);
  s = *FromProto(p);
  EXPECT_EQ(s.min_p, 0.2f);
  EXPECT_EQ(s.repetition_penalty, 1.3f);
  EXPECT_EQ(s.frequency_penalty, -0.5f);
  EXPECT_EQ(s.presence_penalty, 0.25f);
  EXPECT_EQ(s.logit_bias, (std::vector<std::pair<int32_t, float>>{{4, -1.f}, {30, 2.f}}));
  EXPECT_EQ(s.logprobs, 0);
  EXPECT_EQ(s.min_tokens, 3u);
}

TEST(SamplingProtoTest, TheFirstTokensSamplingCarriesTheDistributionAndMinTokensBans) {
  SamplingParams s;
  s.max_tokens = 50;
  s.temperature = 0.7f;
  s.seed = 11;
  s.frequency_penalty = 0.5f;
  s.logit_bias = {{7, 3.f}};
  s.logprobs = 4;
  s.stop_token_ids = {5, 6};
  s.min_tokens = 3;
  v1::SamplingParams p;
  FirstTokenSampling(s, /*prior_output_tokens=*/0, &p);
  EXPECT_EQ(p.max_tokens(), 1u);
  EXPECT_EQ(p.temperature(), 0.7f);
  EXPECT_EQ(p.seed().value(), 11u);
  EXPECT_EQ(p.frequency_penalty(), 0.5f);
  EXPECT_EQ(p.logit_bias().at(7), 3.f);
  EXPECT_EQ(p.logprobs().value(), 4);
  // The first token may not stop the output: its stop ids are banned there.
  EXPECT_EQ(p.min_tokens(), 1u);
  EXPECT_EQ(p.stop_token_ids_size(), 2);
  const SamplingParams back = *FromProto(p);
  EXPECT_EQ(back.min_tokens, 1u);
  EXPECT_EQ(back.prior_output_tokens, 0u);
  EXPECT_EQ(back.seed, 11u);
  // Seed 0 is carried as a seed; none stays none.
  s.seed = 0;
  FirstTokenSampling(s, 0, &p);
  EXPECT_TRUE(p.has_seed());
  EXPECT_EQ(FromProto(p)->seed, 0u);
  s.seed.reset();
  p.Clear();
  FirstTokenSampling(s, 0, &p);
  EXPECT_FALSE(p.has_seed());
  EXPECT_FALSE(FromProto(p)->seed.has_value());
  // A preempted request with 2 tokens out: its next may not stop either.
  v1::SamplingParams resumed;
  FirstTokenSampling(s, 2, &resumed);
  EXPECT_EQ(resumed.prior_output_tokens(), 2u);
  EXPECT_EQ(resumed.min_tokens(), 3u);
  // With 3 out it may.
  v1::SamplingParams past;
  FirstTokenSampling(s, 3, &past);
  EXPECT_EQ(past.min_tokens(), 0u);
  EXPECT_EQ(past.stop_token_ids_size(), 0);
}

}  // namespace
}  // namespace tandem
