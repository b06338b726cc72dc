#include "common/graph/graph_policy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CaptureSizesTest, DefaultLadderShape) {
  EXPECT_THAT(DefaultCaptureSizeLadder(1), ElementsAre(1));
  EXPECT_THAT(DefaultCaptureSizeLadder(3), ElementsAre(1, 2));
  EXPECT_THAT(DefaultCaptureSizeLadder(16), ElementsAre(1, 2, 4, 8, 16));
  EXPECT_THAT(DefaultCaptureSizeLadder(0), ElementsAre());
  auto ladder = DefaultCaptureSizeLadder(512);
  // [1,2,4] + 8..248 (31 sizes) + 256..512 step 16 (17 sizes) = 51.
  EXPECT_EQ(ladder.size(), 51u);
  EXPECT_EQ(ladder[3], 8);
  EXPECT_EQ(ladder[33], 248);
  EXPECT_EQ(ladder[34], 256);
  EXPECT_EQ(ladder[35], 272);
  EXPECT_EQ(ladder.back(), 512);
  EXPECT_THAT(DefaultCaptureSizeLadder(300), testing::Contains(288));
  EXPECT_EQ(DefaultCaptureSizeLadder(300).back(), 288);
}

using M = CudaGraphMode;

absl::StatusOr<std::vector<int>> Sizes(const GraphPolicyConfig& c, BatchLimits l = {}) {
  return ResolveCaptureSizes(c, l);
}

GraphPolicyConfig Config(M mode, int q = 1, std::vector<int> sizes = {},
                         std::optional<int> max = std::nullopt) {
  GraphPolicyConfig c;
  c.requested_mode = mode;
  c.uniform_decode_query_len = q;
  c.capture_sizes = std::move(sizes);
  c.max_capture_size = max;
  return c;
}

absl::StatusOr<GraphPolicy> Resolve(const GraphPolicyConfig& c, BatchLimits l = {},
                                    AttentionCgSupport s = AttentionCgSupport::kAlways) {
  return ResolveGraphPolicy(c, l, s, /*piecewise_split=*/true);
}

// Step 1.
TEST(CaptureSizesTest, DefaultMaximum) {
  GraphPolicyConfig c;  // 256 seqs: min(256*1*2, 512) = 512
  EXPECT_EQ(Sizes(c)->back(), 512);
  EXPECT_THAT(*Sizes(c, {8, 8192}), ElementsAre(1, 2, 4, 8, 16));  // min(16, 512)
  EXPECT_EQ(Sizes(c, {256, 100})->back(), 96);  // capped at the token budget
  c.uniform_decode_query_len = 3;               // M = min(2 * 2 * 3, 512) = 12
  EXPECT_THAT(*Sizes(c, {2, 8192}), ElementsAre(1, 2, 4, 8));
}

TEST(CaptureSizesTest, RequestedNoneHasNoSizes) {
  EXPECT_THAT(*Sizes(Config(M::kNone)), ElementsAre());
  EXPECT_THAT(*Sizes(Config(M::kNone, 1, {1, 2})), ElementsAre());
  // Not even an invalid maximum matters when graphs are off.
  EXPECT_TRUE(Sizes(Config(M::kNone, 1, {}, 0)).ok());
}

TEST(CaptureSizesTest, UserSizesSortedDedupedFilteredNotRounded) {
  GraphPolicyConfig c = Config(M::kFullAndPiecewise, 1, {32, 4, 4, 128, 1, 64});
  EXPECT_THAT(*Sizes(c, {256, 64}), ElementsAre(1, 4, 32, 64));
  // Explicit sizes are filtered by the token budget, not by the default M.
  EXPECT_THAT(*Sizes(Config(M::kPiecewise, 1, {1, 100}), {2, 8192}), ElementsAre(1, 100));
  // And not rounded in step 1, whatever q.
  EXPECT_THAT(*Sizes(Config(M::kFullAndPiecewise, 2, {1, 3, 5, 7})), ElementsAre(1, 3, 5, 7));
  // All above the budget: no sizes.
  EXPECT_THAT(*Sizes(Config(M::kPiecewise, 1, {64}), {256, 32}), ElementsAre());
}

TEST(CaptureSizesTest, MaxCaptureSize) {
  EXPECT_THAT(*Sizes(Config(M::kPiecewise, 1, {}, 40)), ElementsAre(1, 2, 4, 8, 16, 24, 32, 40));
  // A lone maximum is the ladder's cap, even between ladder sizes.
  EXPECT_THAT(*Sizes(Config(M::kPiecewise, 1, {}, 10)), ElementsAre(1, 2, 4, 8));
  // Capped by the token budget too.
  EXPECT_EQ(Sizes(Config(M::kPiecewise, 1, {}, 4096), {256, 300})->back(), 288);
}

TEST(CaptureSizesTest, ExplicitSizesWithMaximum) {
  EXPECT_THAT(*Sizes(Config(M::kPiecewise, 1, {1, 2, 4, 8}, 8)), ElementsAre(1, 2, 4, 8));
  auto s = Sizes(Config(M::kPiecewise, 1, {1, 2, 4, 8}, 16)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_capture_size 16"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("largest capture size kept (8"));
  // The maximum is compared with the largest size kept within the budget.
  EXPECT_TRUE(Sizes(Config(M::kPiecewise, 1, {4, 64}, 4), {256, 32}).ok());
  EXPECT_FALSE(Sizes(Config(M::kPiecewise, 1, {4, 64}, 64), {256, 32}).ok());
}

TEST(CaptureSizesTest, Errors) {
  EXPECT_EQ(Sizes(Config(M::kPiecewise, 1, {0, 4})).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto m = Sizes(Config(M::kPiecewise, 1, {}, 0)).status();  // M < 1
  EXPECT_EQ(m.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.message()), HasSubstr("max_capture_size must be >= 1"));
  auto s = Sizes(GraphPolicyConfig{}, {0, 8192}).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_num_seqs"));
  EXPECT_FALSE(Sizes(Config(M::kPiecewise, 0)).ok());
  // A typo must not allocate a padding table of billions of entries.
  EXPECT_THAT(std::string(Sizes(Config(M::kPiecewise, 1, {}, 2000000000), {256, 2000000000})
                              .status()
                              .message()),
              HasSubstr("the limit is 1048576"));
  EXPECT_FALSE(Sizes(Config(M::kPiecewise, 1, {1, 2000000000}), {256, 2000000000}).ok());
}

// Step 3.
TEST(RoundCaptureSizesTest, RoundsWithinTheLargestSize) {
  EXPECT_THAT(*RoundCaptureSizesToQueryLen({1, 3, 5, 7}, 2), ElementsAre(2, 4, 6));
  EXPECT_THAT(*RoundCaptureSizesToQueryLen({1, 2, 4, 8}, 3), ElementsAre(3, 6));
  EXPECT_THAT(*RoundCaptureSizesToQueryLen({1, 2, 4, 8}, 1), ElementsAre(1, 2, 4, 8));
  EXPECT_THAT(*RoundCaptureSizesToQueryLen({5, 7}, 4), ElementsAre(4));  // falls back to [q]
  auto s = RoundCaptureSizesToQueryLen({3}, 4).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("no valid capture sizes after rounding to a multiple of q"));
}

TEST(GraphPolicyTest, RoundsOnlyForSeparateFullDecodeRoutines) {
  const std::vector<int> given = {1, 3, 5, 7};
  // FULL_AND_PIECEWISE and FULL_DECODE_ONLY round.
  for (M mode : {M::kFullAndPiecewise, M::kFullDecodeOnly}) {
    auto p = Resolve(Config(mode, 2, given), {4, 8192});
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_THAT(p->dispatcher.capture_sizes, ElementsAre(2, 4, 6)) << mode;
    ASSERT_EQ(p->resolution.notes.size(), 1u);
    EXPECT_THAT(p->resolution.notes[0], HasSubstr("[1,3,5,7] -> [2,4,6]"));
  }
  // FULL, PIECEWISE and NONE never do.
  for (M mode : {M::kFull, M::kPiecewise}) {
    auto p = Resolve(Config(mode, 2, given));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_THAT(p->dispatcher.capture_sizes, ElementsAre(1, 3, 5, 7)) << mode;
    EXPECT_TRUE(p->resolution.notes.empty());
  }
  EXPECT_THAT(Resolve(Config(M::kNone, 2, given))->dispatcher.capture_sizes, ElementsAre());
  // A FULL_AND_PIECEWISE request downgraded to PIECEWISE (rule d) keeps its sizes.
  auto down = Resolve(Config(M::kFullAndPiecewise, 2, given), {},
                      AttentionCgSupport::kUniformSingleTokenDecode);
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_EQ(down->resolution.mode, M::kPiecewise);
  EXPECT_THAT(down->dispatcher.capture_sizes, ElementsAre(1, 3, 5, 7));
}

TEST(GraphPolicyTest, DefaultLadderRounded) {
  auto p = Resolve(Config(M::kFullAndPiecewise, 3), {2, 8192});  // ladder [1,2,4,8]
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->dispatcher.capture_sizes, ElementsAre(3, 6));
  p = Resolve(Config(M::kFullAndPiecewise, 4), {4, 8192});  // M = 32
  EXPECT_THAT(p->dispatcher.capture_sizes, ElementsAre(4, 8, 16, 24, 32));
  ASSERT_EQ(p->resolution.notes.size(), 1u);
  EXPECT_THAT(p->resolution.notes[0], HasSubstr("[1,2,4,8,16,24,32] -> [4,8,16,24,32]"));
  // Sizes that are already multiples need no note.
  p = Resolve(Config(M::kFullAndPiecewise, 4, {4, 8}));
  EXPECT_THAT(p->dispatcher.capture_sizes, ElementsAre(4, 8));
  EXPECT_TRUE(p->resolution.notes.empty());
}

TEST(GraphPolicyTest, FallsBackToQOrFails) {
  auto p = Resolve(Config(M::kFullAndPiecewise, 4, {5, 7}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->dispatcher.capture_sizes, ElementsAre(4));
  auto s = Resolve(Config(M::kFullAndPiecewise, 4, {3})).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("no valid capture sizes after rounding to a multiple of q"));
}

TEST(GraphPolicyTest, QAndLimitsReachTheDispatcher) {
  GraphPolicyConfig c = Config(M::kFullDecodeOnly, 2, {2, 4});
  c.lora_enabled = true;
  c.specialize_lora = false;
  auto p = Resolve(c, {3, 100});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dispatcher.uniform_decode_query_len, 2);
  EXPECT_EQ(p->dispatcher.max_num_seqs, 3);
  EXPECT_TRUE(p->dispatcher.lora_enabled);
  EXPECT_FALSE(p->dispatcher.specialize_lora);
}

}  // namespace
}  // namespace tandem
