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

// Requests with the same structured output share one compiled grammar
// (and the automaton its replies build); another text, another grammar.
TEST(SamplingProtoTest, TheSameStructuredOutputIsOneGrammar) {
  const auto grammar = [](const v1::SamplingParams& p) {
    absl::StatusOr<SamplingParams> s = FromProto(p);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->grammar.get() : nullptr;
  };
  v1::SamplingParams a;
  a.set_max_tokens(4);
  a.set_structured_json_schema(R"({"type": "object", "properties": {"x": {"type": "string"}}})");
  v1::SamplingParams b = a;
  b.set_structured_json_schema(R"({"type": "object", "properties": {"y": {"type": "string"}}})");
  const JsonGrammar* first = grammar(a);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(grammar(a), first);
  EXPECT_NE(grammar(b), first);
  EXPECT_EQ(grammar(a), first);
  // Choices are told apart by where each ends, not only by their bytes.
  v1::SamplingParams c1, c2;
  c1.set_max_tokens(4);
  c2.set_max_tokens(4);
  for (const char* c : {"ab", "c"}) c1.add_structured_choice(c);
  for (const char* c : {"a", "bc"}) c2.add_structured_choice(c);
  EXPECT_NE(grammar(c1), grammar(c2));
  EXPECT_EQ(grammar(c1)->choices(), (std::vector<std::string>{"ab", "c"}));
  // A regex and a grammar of the same text are different grammars.
  v1::SamplingParams r, g;
  r.set_max_tokens(4);
  g.set_max_tokens(4);
  r.set_structured_regex("root");
  g.set_structured_grammar("root ::= \"a\"");
  EXPECT_EQ(grammar(r)->regex(), "root");
  EXPECT_EQ(grammar(g)->grammar(), "root ::= \"a\"");
  // A refused one is refused again, not cached.
  v1::SamplingParams bad;
  bad.set_max_tokens(4);
  bad.set_structured_grammar("root ::= root \"a\"");
  EXPECT_EQ(FromProto(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromProto(bad).status().code(), absl::StatusCode::kInvalidArgument);
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
