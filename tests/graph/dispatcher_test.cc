#include "common/graph/dispatcher.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using M = CudaGraphMode;

CudaGraphDispatcher Make(M mode, std::vector<int> sizes, int max_num_seqs = 256, int q = 1,
                         bool lora = false, bool specialize_lora = true) {
  DispatcherConfig c;
  c.capture_sizes = std::move(sizes);
  c.max_num_seqs = max_num_seqs;
  c.uniform_decode_query_len = q;
  c.lora_enabled = lora;
  c.specialize_lora = specialize_lora;
  CudaGraphDispatcher d(c);
  EXPECT_TRUE(d.InitializeKeys(mode).ok());
  return d;
}

BatchDescriptor D(int n, std::optional<int> reqs, bool uniform, bool lora = false) {
  return BatchDescriptor(n, reqs, uniform, lora);
}

TEST(DispatcherTest, PaddingAtEveryBoundary) {
  auto d = Make(M::kFullAndPiecewise, {1, 2, 4, 8, 16});
  const int expected[] = {0, 1, 2, 4, 4, 8, 8, 8, 8, 16, 16, 16, 16, 16, 16, 16, 16};
  for (int n = 0; n <= 16; ++n) EXPECT_EQ(d.PaddedSize(n), expected[n]) << n;
  EXPECT_EQ(d.PaddedSize(17), 17);
}

TEST(DispatcherTest, NotInitializedOrNoneGivesNone) {
  DispatcherConfig c;
  c.capture_sizes = {1, 2, 4};
  CudaGraphDispatcher d(c);
  auto r = d.Dispatch(2, true);
  EXPECT_EQ(r->runtime_mode, M::kNone);
  EXPECT_EQ(r->descriptor, BatchDescriptor(2));
  EXPECT_TRUE(d.CaptureDescriptors().empty());
  auto none = Make(M::kNone, {1, 2, 4});
  EXPECT_EQ(none.Dispatch(2, true)->runtime_mode, M::kNone);
  EXPECT_TRUE(none.CaptureDescriptors().empty());
}

TEST(DispatcherTest, FullAndPiecewiseKeys) {
  auto d = Make(M::kFullAndPiecewise, {1, 2, 4, 8}, /*max_num_seqs=*/4);
  EXPECT_THAT(d.keys(M::kPiecewise),
              testing::UnorderedElementsAre(D(1, {}, false), D(2, {}, false), D(4, {}, false),
                                            D(8, {}, false)));
  // FULL uniform keys for sizes in [1, 1 * 4].
  EXPECT_THAT(d.keys(M::kFull),
              testing::UnorderedElementsAre(D(1, 1, true), D(2, 2, true), D(4, 4, true)));
}

TEST(DispatcherTest, DispatchPriority) {
  auto d = Make(M::kFullAndPiecewise, {1, 2, 4, 8}, 4);
  auto r = d.Dispatch(3, true);  // uniform decode -> FULL exact key, padded to 4
  EXPECT_EQ(r->runtime_mode, M::kFull);
  EXPECT_EQ(r->descriptor, D(4, 4, true));
  r = d.Dispatch(3, false);  // mixed -> PIECEWISE relaxed key
  EXPECT_EQ(r->runtime_mode, M::kPiecewise);
  EXPECT_EQ(r->descriptor, D(4, {}, false));
  r = d.Dispatch(8, true);  // beyond q*max_num_seqs: no FULL key, PIECEWISE
  EXPECT_EQ(r->runtime_mode, M::kPiecewise);
  EXPECT_EQ(r->descriptor, D(8, {}, false));
  r = d.Dispatch(9, true);  // above the largest capture size
  EXPECT_EQ(r->runtime_mode, M::kNone);
  EXPECT_EQ(r->descriptor, BatchDescriptor(9));
}

TEST(DispatcherTest, DisableFullFallsBackToPiecewise) {
  auto d = Make(M::kFullAndPiecewise, {1, 2, 4});
  auto r = d.Dispatch(2, true, false, /*disable_full=*/true);
  EXPECT_EQ(r->runtime_mode, M::kPiecewise);
  EXPECT_EQ(r->descriptor, D(2, {}, false));
  auto f = Make(M::kFull, {1, 2, 4});
  r = f.Dispatch(2, true, false, true);
  EXPECT_EQ(r->runtime_mode, M::kNone);
  EXPECT_EQ(r->descriptor, BatchDescriptor(2));
}

TEST(DispatcherTest, FullModeUsesRelaxedKeysForEverything) {
  auto d = Make(M::kFull, {1, 2, 4});
  EXPECT_TRUE(d.keys(M::kPiecewise).empty());
  EXPECT_THAT(d.keys(M::kFull), testing::UnorderedElementsAre(D(1, {}, false), D(2, {}, false),
                                                              D(4, {}, false)));
  // Uniform decode: exact key (uniform) absent, relaxed FULL key hit.
  auto r = d.Dispatch(3, true);
  EXPECT_EQ(r->runtime_mode, M::kFull);
  EXPECT_EQ(r->descriptor, D(4, {}, false));
}

TEST(DispatcherTest, FullDecodeOnly) {
  auto d = Make(M::kFullDecodeOnly, {1, 2, 4, 8});
  EXPECT_TRUE(d.keys(M::kPiecewise).empty());
  EXPECT_EQ(d.keys(M::kFull).size(), 4u);
  EXPECT_EQ(d.Dispatch(5, true)->runtime_mode, M::kFull);
  EXPECT_EQ(d.Dispatch(5, true)->descriptor, D(8, 8, true));
  EXPECT_EQ(d.Dispatch(5, false)->runtime_mode, M::kNone);
  EXPECT_EQ(d.Dispatch(5, false)->descriptor, BatchDescriptor(5));
}

TEST(DispatcherTest, PiecewiseOnlyTreatsUniformAsMixed) {
  auto d = Make(M::kPiecewise, {1, 2, 4}, 2);
  auto r = d.Dispatch(3, true);
  EXPECT_EQ(r->runtime_mode, M::kPiecewise);
  EXPECT_EQ(r->descriptor, D(4, {}, false));
}

TEST(DispatcherTest, MixedNumReqsCappedAtMaxNumSeqsBeforeRelaxing) {
  // The unrelaxed padded descriptor of a mixed batch has num_reqs =
  // min(padded, max_num_seqs); only the relaxed form is a key.
  auto d = Make(M::kFullAndPiecewise, {1, 2, 4, 8}, 2);
  EXPECT_EQ(d.Dispatch(7, false)->descriptor, D(8, {}, false));
}

TEST(DispatcherTest, QueryLenTwoAndFour) {
  auto d2 = Make(M::kFullAndPiecewise, {2, 4, 8, 16}, /*max_num_seqs=*/4, /*q=*/2);
  // FULL keys for sizes in [2, 8].
  EXPECT_THAT(d2.keys(M::kFull),
              testing::UnorderedElementsAre(D(2, 1, true), D(4, 2, true), D(8, 4, true)));
  auto r = d2.Dispatch(6, true);
  EXPECT_EQ(r->runtime_mode, M::kFull);
  EXPECT_EQ(r->descriptor, D(8, 4, true));
  EXPECT_EQ(d2.Dispatch(16, true)->runtime_mode, M::kPiecewise);

  auto d4 = Make(M::kFullAndPiecewise, {4, 8, 12}, 2, 4);
  EXPECT_THAT(d4.keys(M::kFull), testing::UnorderedElementsAre(D(4, 1, true), D(8, 2, true)));
  EXPECT_EQ(d4.Dispatch(1, true)->descriptor, D(4, 1, true));
  EXPECT_EQ(d4.Dispatch(12, true)->runtime_mode, M::kPiecewise);
}

TEST(DispatcherTest, UniformPaddedSizeNotMultipleOfQueryIsError) {
  DispatcherConfig c;
  c.capture_sizes = {1, 2, 3};
  c.uniform_decode_query_len = 2;
  CudaGraphDispatcher d(c);
  EXPECT_EQ(d.InitializeKeys(M::kFullAndPiecewise).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DispatcherTest, LoraCases) {
  auto both = Make(M::kFullAndPiecewise, {1, 2}, 4, 1, /*lora=*/true, /*specialize=*/true);
  EXPECT_EQ(both.keys(M::kPiecewise).size(), 4u);
  EXPECT_EQ(both.keys(M::kFull).size(), 4u);
  EXPECT_EQ(both.Dispatch(2, true, /*has_lora=*/true)->descriptor, D(2, 2, true, true));
  EXPECT_EQ(both.Dispatch(2, true, false)->descriptor, D(2, 2, true, false));
  auto only = Make(M::kFullAndPiecewise, {1, 2}, 4, 1, true, /*specialize=*/false);
  EXPECT_EQ(only.keys(M::kPiecewise).size(), 2u);
  EXPECT_EQ(only.Dispatch(2, true, true)->runtime_mode, M::kFull);
  EXPECT_EQ(only.Dispatch(2, true, false)->runtime_mode, M::kNone);
}

TEST(DispatcherTest, CaptureOrderPiecewiseFirstLargestFirst) {
  auto d = Make(M::kFullAndPiecewise, {1, 2, 4, 8}, 4);
  auto groups = d.CaptureDescriptors();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].mode, M::kPiecewise);
  EXPECT_THAT(groups[0].descriptors,
              testing::ElementsAre(D(8, {}, false), D(4, {}, false), D(2, {}, false),
                                   D(1, {}, false)));
  EXPECT_EQ(groups[1].mode, M::kFull);
  EXPECT_THAT(groups[1].descriptors,
              testing::ElementsAre(D(4, 4, true), D(2, 2, true), D(1, 1, true)));
}

TEST(DispatcherTest, DefaultLadderKeyCounts) {
  std::vector<int> ladder = {1, 2, 4};
  for (int s = 8; s <= 248; s += 8) ladder.push_back(s);
  for (int s = 256; s <= 512; s += 16) ladder.push_back(s);
  ASSERT_EQ(ladder.size(), 51u);
  auto d = Make(M::kFullAndPiecewise, ladder, 256);
  EXPECT_EQ(d.keys(M::kPiecewise).size(), 51u);
  EXPECT_EQ(d.keys(M::kFull).size(), 35u);  // sizes <= 256
}

TEST(DispatcherTest, NegativeTokensIsError) {
  auto d = Make(M::kFullAndPiecewise, {1, 2});
  EXPECT_EQ(d.Dispatch(-1, false).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
