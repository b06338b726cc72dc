#include "common/graph/attention_support.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

using M = CudaGraphMode;
using S = AttentionCgSupport;

M Resolve(M mode, S support, bool split, int q = 1) {
  auto r = ResolveCudaGraphMode(mode, support, split, q);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->mode : M(M::kNone);
}

TEST(AttentionSupportTest, SupportOrderAndNames) {
  EXPECT_GT(S::kAlways, S::kUniformBatch);
  EXPECT_GT(S::kUniformBatch, S::kUniformSingleTokenDecode);
  EXPECT_GT(S::kUniformSingleTokenDecode, S::kNever);
  EXPECT_EQ(*ParseAttentionCgSupport("uniform_batch"), S::kUniformBatch);
  EXPECT_FALSE(ParseAttentionCgSupport("SOMETIMES").ok());
}

TEST(AttentionSupportTest, AlwaysKeepsEverything) {
  for (M m : {M::kNone, M::kPiecewise, M::kFull, M::kFullDecodeOnly, M::kFullAndPiecewise}) {
    auto r = ResolveCudaGraphMode(m, S::kAlways, true, 1);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->mode, m);
    EXPECT_TRUE(r->notes.empty());
  }
}

TEST(AttentionSupportTest, RuleA_NotSplit) {
  EXPECT_EQ(Resolve(M::kPiecewise, S::kAlways, false), M::kNone);
  EXPECT_EQ(Resolve(M::kFullAndPiecewise, S::kAlways, false), M::kFull);
  EXPECT_EQ(Resolve(M::kFullDecodeOnly, S::kAlways, false), M::kFullDecodeOnly);
  auto r = ResolveCudaGraphMode(M::kPiecewise, S::kAlways, false, 1);
  ASSERT_EQ(r->notes.size(), 1u);
  EXPECT_NE(r->notes[0].find("not split"), std::string::npos);
}

TEST(AttentionSupportTest, RuleB_FullNeedsAlways) {
  EXPECT_EQ(Resolve(M::kFull, S::kUniformBatch, true), M::kFullAndPiecewise);
  EXPECT_EQ(Resolve(M::kFull, S::kUniformBatch, false), M::kFullDecodeOnly);
  EXPECT_EQ(Resolve(M::kFull, S::kUniformSingleTokenDecode, true), M::kFullAndPiecewise);
  // (a) then (b): FULL_AND_PIECEWISE, not split -> FULL -> FULL_DECODE_ONLY.
  auto r = ResolveCudaGraphMode(M::kFullAndPiecewise, S::kUniformBatch, false, 1);
  EXPECT_EQ(r->mode, M::kFullDecodeOnly);
  EXPECT_EQ(r->notes.size(), 2u);
}

TEST(AttentionSupportTest, RuleB_FullWithNeverIsError) {
  auto r = ResolveCudaGraphMode(M::kFull, S::kNever, true, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("NEVER"), std::string::npos);
  EXPECT_NE(r.status().message().find("PIECEWISE"), std::string::npos);
}

TEST(AttentionSupportTest, RuleC_DecodeFullWithNever) {
  EXPECT_EQ(Resolve(M::kFullAndPiecewise, S::kNever, true), M::kPiecewise);
  EXPECT_EQ(Resolve(M::kFullDecodeOnly, S::kNever, true), M::kPiecewise);
  EXPECT_EQ(Resolve(M::kFullDecodeOnly, S::kNever, false), M::kNone);
}

TEST(AttentionSupportTest, RuleD_SpeculativeQueryNeedsUniformBatch) {
  EXPECT_EQ(Resolve(M::kFullAndPiecewise, S::kUniformSingleTokenDecode, true, 2), M::kPiecewise);
  EXPECT_EQ(Resolve(M::kFullDecodeOnly, S::kUniformSingleTokenDecode, false, 4), M::kNone);
  EXPECT_EQ(Resolve(M::kFullDecodeOnly, S::kUniformBatch, false, 4), M::kFullDecodeOnly);
  EXPECT_EQ(Resolve(M::kFullDecodeOnly, S::kUniformSingleTokenDecode, false, 1),
            M::kFullDecodeOnly);
  // (b) then (d): FULL -> FULL_AND_PIECEWISE -> PIECEWISE.
  auto r = ResolveCudaGraphMode(M::kFull, S::kUniformSingleTokenDecode, true, 2);
  EXPECT_EQ(r->mode, M::kPiecewise);
  EXPECT_EQ(r->notes.size(), 2u);
}

TEST(AttentionSupportTest, PiecewiseUntouchedByNever) {
  EXPECT_EQ(Resolve(M::kPiecewise, S::kNever, true), M::kPiecewise);
  EXPECT_EQ(Resolve(M::kNone, S::kNever, false), M::kNone);
}

}  // namespace
}  // namespace tandem
