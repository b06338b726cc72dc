#include "common/engine/sampling.h"

#include <set>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(SamplerTest, GreedyPicksArgmax) {
  Sampler s;
  std::mt19937_64 rng(1);
  float logits[] = {0.1f, 2.f, -1.f, 1.9f};
  SamplingParams p;
  EXPECT_EQ(s.Sample(logits, 4, p, &rng), 1);
}

TEST(SamplerTest, SeededIsReproducibleAndTopKOneIsGreedy) {
  Sampler s;
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = static_cast<float>((i * 37) % 11) * 0.3f;
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::mt19937_64 a(p.seed), b(p.seed);
  std::vector<int32_t> x, y;
  for (int i = 0; i < 50; ++i) {
    x.push_back(s.Sample(logits.data(), 100, p, &a));
    y.push_back(s.Sample(logits.data(), 100, p, &b));
  }
  EXPECT_EQ(x, y);
  EXPECT_GT(std::set<int32_t>(x.begin(), x.end()).size(), 1u);
  p.top_k = 1;
  SamplingParams greedy;
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.Sample(logits.data(), 100, p, &a), s.Sample(logits.data(), 100, greedy, &a));
  p.top_k = -1;
  p.top_p = 1e-6f;  // only the top token survives
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.Sample(logits.data(), 100, p, &a), s.Sample(logits.data(), 100, greedy, &a));
}

TEST(SamplerTest, TopKRestrictsSupport) {
  Sampler s;
  float logits[] = {5.f, 4.f, 3.f, 2.f, 1.f};
  SamplingParams p;
  p.temperature = 2.0f;
  p.top_k = 2;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) EXPECT_LT(s.Sample(logits, 5, p, &rng), 2);
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
}

}  // namespace
}  // namespace tandem
