#include "common/graph/cudagraph_mode.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

using M = CudaGraphMode;

struct Row {
  M mode;
  M decode;
  M mixed;
  bool needs_piecewise;
};

// The routing table of seed 000, every mode x decode/mixed x needs-piecewise.
TEST(CudaGraphModeTest, RoutingTable) {
  const Row rows[] = {
      {M::kNone, M::kNone, M::kNone, false},
      {M::kPiecewise, M::kPiecewise, M::kPiecewise, true},
      {M::kFull, M::kFull, M::kFull, false},
      {M::kFullDecodeOnly, M::kFull, M::kNone, false},
      {M::kFullAndPiecewise, M::kFull, M::kPiecewise, true},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.mode.name());
    EXPECT_EQ(r.mode.decode_mode(), r.decode);
    EXPECT_EQ(r.mode.mixed_mode(), r.mixed);
    EXPECT_EQ(r.mode.requires_piecewise_compilation(), r.needs_piecewise);
    EXPECT_EQ(r.mode.has_piecewise_cudagraphs(), r.needs_piecewise);
  }
}

TEST(CudaGraphModeTest, SeparateRoutineOnlyForComposites) {
  EXPECT_FALSE(M(M::kNone).separate_routine());
  EXPECT_FALSE(M(M::kPiecewise).separate_routine());
  EXPECT_FALSE(M(M::kFull).separate_routine());
  EXPECT_TRUE(M(M::kFullDecodeOnly).separate_routine());
  EXPECT_TRUE(M(M::kFullAndPiecewise).separate_routine());
}

TEST(CudaGraphModeTest, HasMode) {
  EXPECT_TRUE(M(M::kFullDecodeOnly).has_mode(M::kFull));
  EXPECT_TRUE(M(M::kFullDecodeOnly).has_mode(M::kNone));
  EXPECT_FALSE(M(M::kFullDecodeOnly).has_mode(M::kPiecewise));
  EXPECT_TRUE(M(M::kFullAndPiecewise).has_mode(M::kPiecewise));
  EXPECT_FALSE(M(M::kFullAndPiecewise).has_mode(M::kNone));
  EXPECT_TRUE(M(M::kFull).has_mode(M::kFull));
  EXPECT_FALSE(M(M::kFull).has_mode(M::kNone));
  EXPECT_TRUE(M(M::kNone).has_mode(M::kNone));
  EXPECT_FALSE(M(M::kPiecewise).has_mode(M::kFull));
}

TEST(CudaGraphModeDeathTest, HasModeRejectsCompositeTarget) {
  EXPECT_DEATH(M(M::kFull).has_mode(M::kFullDecodeOnly), "single mode");
}

TEST(CudaGraphModeTest, MaxModeAndFullGraphs) {
  EXPECT_EQ(M(M::kNone).max_cudagraph_mode(), M::kNone);
  EXPECT_EQ(M(M::kPiecewise).max_cudagraph_mode(), M::kPiecewise);
  EXPECT_EQ(M(M::kFull).max_cudagraph_mode(), M::kFull);
  EXPECT_EQ(M(M::kFullDecodeOnly).max_cudagraph_mode(), M::kFull);
  EXPECT_EQ(M(M::kFullAndPiecewise).max_cudagraph_mode(), M::kFull);
  EXPECT_FALSE(M(M::kNone).has_full_cudagraphs());
  EXPECT_FALSE(M(M::kPiecewise).has_full_cudagraphs());
  EXPECT_TRUE(M(M::kFull).has_full_cudagraphs());
  EXPECT_TRUE(M(M::kFullDecodeOnly).has_full_cudagraphs());
  EXPECT_TRUE(M(M::kFullAndPiecewise).has_full_cudagraphs());
}

TEST(CudaGraphModeTest, ValidRuntimeModes) {
  EXPECT_TRUE(M(M::kNone).valid_runtime_mode());
  EXPECT_TRUE(M(M::kPiecewise).valid_runtime_mode());
  EXPECT_TRUE(M(M::kFull).valid_runtime_mode());
  EXPECT_FALSE(M(M::kFullDecodeOnly).valid_runtime_mode());
  EXPECT_FALSE(M(M::kFullAndPiecewise).valid_runtime_mode());
}

TEST(CudaGraphModeTest, ParseAndPrintRoundTrip) {
  for (M m : {M::kNone, M::kPiecewise, M::kFull, M::kFullDecodeOnly, M::kFullAndPiecewise}) {
    auto parsed = CudaGraphMode::Parse(m.name());
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_EQ(*CudaGraphMode::Parse("full_decode_only"), M::kFullDecodeOnly);
  EXPECT_EQ(*CudaGraphMode::Parse("Piecewise"), M::kPiecewise);
  EXPECT_EQ(M(M::kFullAndPiecewise).name(), "FULL_AND_PIECEWISE");
}

TEST(CudaGraphModeTest, ParseErrorListsValidNames) {
  auto parsed = CudaGraphMode::Parse("FULLY");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("FULLY"), std::string::npos);
  EXPECT_NE(parsed.status().message().find("FULL_AND_PIECEWISE"), std::string::npos);
}

}  // namespace
}  // namespace tandem
