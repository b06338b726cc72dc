#include "common/graph/capture_sizes.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;

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

TEST(CaptureSizesTest, DefaultMaximum) {
  CaptureSizeConfig c;  // 256 seqs: min(256*1*2, 512) = 512
  EXPECT_EQ(ResolveCaptureSizes(c)->back(), 512);
  c.max_num_seqs = 8;  // min(16, 512) = 16
  EXPECT_THAT(*ResolveCaptureSizes(c), ElementsAre(1, 2, 4, 8, 16));
  c.max_num_seqs = 256;
  c.max_num_batched_tokens = 100;  // capped at the token budget
  EXPECT_EQ(ResolveCaptureSizes(c)->back(), 96);
}

TEST(CaptureSizesTest, UserSizesSortedDedupedFiltered) {
  CaptureSizeConfig c;
  c.max_num_batched_tokens = 64;
  c.capture_sizes = {32, 4, 4, 128, 1, 64};
  EXPECT_THAT(*ResolveCaptureSizes(c), ElementsAre(1, 4, 32, 64));
}

TEST(CaptureSizesTest, RoundedToMultipleOfQuery) {
  CaptureSizeConfig c;
  c.uniform_decode_query_len = 4;
  c.capture_sizes = {1, 2, 4, 5, 8};
  EXPECT_THAT(*ResolveCaptureSizes(c), ElementsAre(4, 8));
  c.capture_sizes = {};
  c.max_num_seqs = 4;  // M = min(4*4*2, 512) = 32
  EXPECT_THAT(*ResolveCaptureSizes(c), ElementsAre(4, 8, 16, 24, 32));
  c.uniform_decode_query_len = 3;  // M = 24; 1,2->3, 4->6, 8->9, 16->18, 24->24
  EXPECT_THAT(*ResolveCaptureSizes(c), ElementsAre(3, 6, 9, 18, 24));
}

TEST(CaptureSizesTest, MaxCaptureSize) {
  CaptureSizeConfig c;
  c.max_capture_size = 40;
  EXPECT_THAT(*ResolveCaptureSizes(c), ElementsAre(1, 2, 4, 8, 16, 24, 32, 40));
}

TEST(CaptureSizesTest, Errors) {
  CaptureSizeConfig c;
  c.capture_sizes = {0, 4};
  EXPECT_EQ(ResolveCaptureSizes(c).status().code(), absl::StatusCode::kInvalidArgument);
  c.capture_sizes = {4};
  c.max_capture_size = 8;
  EXPECT_EQ(ResolveCaptureSizes(c).status().code(), absl::StatusCode::kInvalidArgument);
  CaptureSizeConfig d;
  d.max_num_seqs = 0;
  auto s = ResolveCaptureSizes(d).status();
  EXPECT_NE(s.message().find("max_num_seqs"), std::string::npos);
}

}  // namespace
}  // namespace tandem
