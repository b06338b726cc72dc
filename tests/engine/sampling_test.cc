#include "common/engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(SamplerTest, GreedyPicksArgmax) {
  Sampler s;
  std::mt19937_64 rng(1);
  float logits[] = {0.1f, 2.f, -1.f, 1.9f};
  SamplingParams p;
  EXPECT_EQ(s.Sample(logits, 4, p, {}, &rng), 1);
}

TEST(SamplerTest, SeededIsReproducibleAndTopKOneIsGreedy) {
  Sampler s;
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = static_cast<float>((i * 37) % 11) * 0.3f;
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::mt19937_64 a(*p.seed), b(*p.seed);
  std::vector<int32_t> x, y;
  for (int i = 0; i < 50; ++i) {
    x.push_back(s.Sample(logits.data(), 100, p, {}, &a));
    y.push_back(s.Sample(logits.data(), 100, p, {}, &b));
  }
  EXPECT_EQ(x, y);
  EXPECT_GT(std::set<int32_t>(x.begin(), x.end()).size(), 1u);
  p.top_k = 1;
  SamplingParams greedy;
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.Sample(logits.data(), 100, p, {}, &a), s.Sample(logits.data(), 100, greedy, {}, &a));
  p.top_k = -1;
  p.top_p = 1e-6f;  // only the top token survives
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.Sample(logits.data(), 100, p, {}, &a), s.Sample(logits.data(), 100, greedy, {}, &a));
}

TEST(SamplerTest, TopKRestrictsSupport) {
  Sampler s;
  float logits[] = {5.f, 4.f, 3.f, 2.f, 1.f};
  SamplingParams p;
  p.temperature = 2.0f;
  p.top_k = 2;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) EXPECT_LT(s.Sample(logits, 5, p, {}, &rng), 2);
}

// vLLM's apply_penalties, written out: repetition over the prompt and the
// output, then frequency and presence over the output; the logit bias first.
std::vector<float> Reference(std::vector<float> l, const SamplingParams& p,
                             const std::vector<int32_t>& prompt,
                             const std::vector<int32_t>& output) {
  for (const auto& [id, bias] : p.logit_bias) l[id] += bias;
  for (size_t t = 0; t < l.size(); ++t) {
    const int id = static_cast<int>(t);
    const int count = static_cast<int>(std::count(output.begin(), output.end(), id));
    const bool seen = count > 0 || std::count(prompt.begin(), prompt.end(), id) > 0;
    if (seen) l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
    l[t] -= p.frequency_penalty * static_cast<float>(count);
    if (count > 0) l[t] -= p.presence_penalty;
  }
  return l;
}

TEST(SamplerTest, BiasAndPenaltiesAreVllms) {
  std::vector<float> logits(64);
  for (int i = 0; i < 64; ++i) logits[i] = static_cast<float>((i * 29) % 17) * 0.4f - 3.f;
  const std::vector<int32_t> prompt = {3, 9, 9, 20, 41, 3};
  const std::vector<int32_t> output = {9, 5, 5, 5, 60, 20};
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.25f;
  p.presence_penalty = -0.5f;
  p.logit_bias = {{5, 2.f}, {7, -100.f}, {41, 0.5f}};
  Sampler s;
  const float* got = s.Adjust(logits.data(), 64, p, {prompt, output, {}});
  EXPECT_EQ(std::vector<float>(got, got + 64), Reference(logits, p, prompt, output));
  // Drafts accepted before a position count as output, and nothing of one
  // call is left in the next.
  const std::vector<int32_t> head = {9, 5}, drafts = {5, 5, 60, 20};
  got = s.Adjust(logits.data(), 64, p, {prompt, head, drafts});
  EXPECT_EQ(std::vector<float>(got, got + 64), Reference(logits, p, prompt, output));
  got = s.Adjust(logits.data(), 64, p, {{}, {}, {}});
  EXPECT_EQ(std::vector<float>(got, got + 64), Reference(logits, p, {}, {}));
  // Neutral parameters: the logits themselves.
  EXPECT_EQ(s.Adjust(logits.data(), 64, SamplingParams{}, {prompt, output, {}}), logits.data());
}

TEST(SamplerTest, PenaltiesDecideTheGreedyToken) {
  Sampler s;
  std::mt19937_64 rng(1);
  float logits[] = {3.f, 2.f, -1.f, -1.2f};
  SamplingParams p;
  const std::vector<int32_t> three_zeros = {0, 0, 0};
  p.frequency_penalty = 0.3f;  // 3 - 0.9 > 2
  EXPECT_EQ(s.Sample(logits, 4, p, {{}, three_zeros, {}}, &rng), 0);
  p.frequency_penalty = 0.4f;  // 3 - 1.2 < 2
  EXPECT_EQ(s.Sample(logits, 4, p, {{}, three_zeros, {}}, &rng), 1);
  EXPECT_EQ(s.Sample(logits, 4, p, {{}, {}, three_zeros}, &rng), 1);  // drafts count
  EXPECT_EQ(s.Sample(logits, 4, p, {three_zeros, {}, {}}, &rng), 0);  // the prompt does not
  p.frequency_penalty = 0;
  p.presence_penalty = 1.1f;  // once, however many times
  EXPECT_EQ(s.Sample(logits, 4, p, {{}, three_zeros, {}}, &rng), 1);
  p.presence_penalty = 0;
  p.repetition_penalty = 1.6f;  // the prompt counts: 3 / 1.6 < 2
  EXPECT_EQ(s.Sample(logits, 4, p, {{0}, {}, {}}, &rng), 1);
  p.repetition_penalty = 1.4f;  // 3 / 1.4 > 2
  EXPECT_EQ(s.Sample(logits, 4, p, {{0}, {}, {}}, &rng), 0);
  p.repetition_penalty = 1.f;
  p.logit_bias = {{3, 4.5f}};
  EXPECT_EQ(s.Sample(logits, 4, p, {}, &rng), 3);
}

TEST(SamplerTest, MinPDropsTokensBelowItsShareOfTheTopOne) {
  Sampler s;
  // Probabilities relative to the top token: 1, 0.5, 0.2.
  float logits[] = {0.f, std::log(0.5f), std::log(0.2f)};
  SamplingParams p;
  p.temperature = 1.f;
  p.min_p = 0.3f;
  std::mt19937_64 rng(3);
  std::set<int32_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(s.Sample(logits, 3, p, {}, &rng));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
  // After temperature 2 the shares are 1, 0.71, 0.45: all kept.
  p.temperature = 2.f;
  seen.clear();
  for (int i = 0; i < 400; ++i) seen.insert(s.Sample(logits, 3, p, {}, &rng));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2}));
  // Verification draws from the same support: token 2 is never kept.
  p.temperature = 1.f;
  int32_t token = 0;
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(s.Verify(logits, 3, p, {}, /*draft=*/2, &rng, &token));
    EXPECT_NE(token, 2);
  }
}

TEST(SamplerTest, MinTokensBansStopIdsWhileTheOutputIsShort) {
  Sampler s;
  std::mt19937_64 rng(1);
  float logits[] = {5.f, 4.f, 3.f, 2.f};  // 0 is EOS, 1 a stop id
  const std::vector<int32_t> eos = {0};
  SamplingParams p;
  p.stop_token_ids = {1};
  p.min_tokens = 3;
  const std::vector<int32_t> two = {3, 3}, three = {3, 3, 3};
  EXPECT_EQ(s.Sample(logits, 4, p, {{}, {}, {}, eos}, &rng), 2);
  EXPECT_EQ(s.Sample(logits, 4, p, {{}, two, {}, eos}, &rng), 2);
  EXPECT_EQ(s.Sample(logits, 4, p, {{}, {3}, {3}, eos}, &rng), 2);  // drafts count
  EXPECT_EQ(s.Sample(logits, 4, p, {{}, three, {}, eos}, &rng), 0);
  p.ignore_eos = true;  // EOS is no stop then, so not banned
  EXPECT_EQ(s.Sample(logits, 4, p, {{}, two, {}, eos}, &rng), 0);
  // Sampling never draws a banned id.
  p.ignore_eos = false;
  p.temperature = 1.f;
  for (int i = 0; i < 200; ++i) EXPECT_GE(s.Sample(logits, 4, p, {{}, {}, {}, eos}, &rng), 2);
}

// vLLM's bad words: a one-token word is never sampled; a longer one's last
// token is banned only where the output (drafts kept before included) ends
// with the rest of it; the prompt does not count.
TEST(SamplerTest, BadWordsBanTheirLastTokenAfterTheRest) {
  Sampler s;
  std::mt19937_64 rng(1);
  float logits[] = {1.f, 5.f, 4.f, 3.f, 2.f};
  SamplingParams p;
  p.bad_words_token_ids = {{1}, {3, 4, 2}};
  const std::vector<int32_t> eos = {0};
  EXPECT_EQ(s.Sample(logits, 5, p, {{}, {}, {}, eos}, &rng), 2);          // 1 banned
  EXPECT_EQ(s.Sample(logits, 5, p, {{}, {3, 4}, {}, eos}, &rng), 3);      // "3 4" then 2: banned
  EXPECT_EQ(s.Sample(logits, 5, p, {{}, {3}, {4}, eos}, &rng), 3);        // a kept draft counts
  EXPECT_EQ(s.Sample(logits, 5, p, {{}, {4, 3}, {}, eos}, &rng), 2);      // another order
  EXPECT_EQ(s.Sample(logits, 5, p, {{3, 4}, {}, {}, eos}, &rng), 2);      // the prompt does not count
  EXPECT_EQ(s.Sample(logits, 5, p, {{}, {4}, {}, eos}, &rng), 2);         // only part of the rest
  p.temperature = 1.f;
  for (int i = 0; i < 200; ++i) {
    const int32_t t = s.Sample(logits, 5, p, {{}, {3, 4}, {}, eos}, &rng);
    EXPECT_TRUE(t != 1 && t != 2) << t;
  }
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmax) {
  std::vector<float> logits = {1.f, 3.f, -2.f, 3.f, 0.5f, 40.f, -40.f};
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  auto expected = [&](int id) { return static_cast<float>(logits[id] - std::log(z)); };
  Sampler s;
  TokenLogprobs lp;
  s.Logprobs(logits.data(), 7, /*token=*/2, /*top=*/3, &lp);
  EXPECT_FLOAT_EQ(lp.logprob, expected(2));
  ASSERT_EQ(lp.top.size(), 3u);  // most likely first; the tie (1 and 3) by id
  EXPECT_EQ(lp.top[0].first, 5);
  EXPECT_EQ(lp.top[1].first, 1);
  EXPECT_EQ(lp.top[2].first, 3);
  for (const auto& [id, logprob] : lp.top) EXPECT_FLOAT_EQ(logprob, expected(id));
  // Neither the bias nor the penalties nor temperature change them (vLLM's
  // raw logprobs); no top list at 0; at most the vocabulary.
  s.Logprobs(logits.data(), 7, 6, 0, &lp);
  EXPECT_FLOAT_EQ(lp.logprob, expected(6));
  EXPECT_TRUE(lp.top.empty());
  s.Logprobs(logits.data(), 7, 0, 20, &lp);
  EXPECT_EQ(lp.top.size(), 7u);
}

TEST(SamplingParamsTest, ValidationNamesFieldValueAndLimit) {
  SamplingParams p;
  p.max_tokens = 0;
  auto s = ValidateSamplingParams(p, 100);
  EXPECT_NE(s.message().find("max_tokens"), std::string::npos);
  EXPECT_NE(s.message().find("100"), std::string::npos);
  p.max_tokens = 101;
  EXPECT_FALSE(ValidateSamplingParams(p, 100).ok());
  p.max_tokens = 10;
  p.temperature = -0.5f;
  EXPECT_NE(ValidateSamplingParams(p, 100).message().find("temperature"), std::string::npos);
  p.temperature = 0;
  p.top_p = 0;
  EXPECT_NE(ValidateSamplingParams(p, 100).message().find("top_p"), std::string::npos);
  p.top_p = 1.5f;
  EXPECT_FALSE(ValidateSamplingParams(p, 100).ok());
  p.top_p = 1;
  p.top_k = -2;
  EXPECT_NE(ValidateSamplingParams(p, 100).message().find("top_k"), std::string::npos);
  p.top_k = -1;
  EXPECT_TRUE(ValidateSamplingParams(p, 100).ok());
  auto message = [&](auto set) {
    SamplingParams q = p;
    set(q);
    return std::string(ValidateSamplingParams(q, 100).message());
  };
  EXPECT_NE(message([](auto& q) { q.min_p = 1.5f; }).find("sampling.min_p must be in [0, 1], got 1.5"),
            std::string::npos);
  EXPECT_NE(message([](auto& q) { q.repetition_penalty = 0; }).find("repetition_penalty"),
            std::string::npos);
  EXPECT_NE(message([](auto& q) { q.frequency_penalty = -2.5f; })
                .find("sampling.frequency_penalty must be in [-2, 2], got -2.5"),
            std::string::npos);
  EXPECT_NE(message([](auto& q) { q.presence_penalty = 3; }).find("presence_penalty"),
            std::string::npos);
  EXPECT_NE(message([](auto& q) { q.logit_bias.resize(kMaxLogitBias + 1); }).find("limit is 1024"),
            std::string::npos);
  EXPECT_NE(message([](auto& q) { q.logit_bias = {{4, std::nanf("")}}; }).find("logit_bias[4]"),
            std::string::npos);
  EXPECT_NE(message([](auto& q) { q.logprobs = 21; }).find("sampling.logprobs must be in [0, 20]"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
