// ForwardContext: what every CudaGraphWrapper trusts. Scopes nest and
// restore, each thread has its own, and composite modes are refused.
#include "common/graph/forward_context.h"

#include <thread>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ForwardContextTest, ScopesNestAndRestore) {
  EXPECT_EQ(CurrentForwardContext(), nullptr);
  {
    ForwardContextScope outer(CudaGraphMode::kFull, BatchDescriptor(8, 8, true, false));
    ASSERT_NE(CurrentForwardContext(), nullptr);
    EXPECT_EQ(CurrentForwardContext()->runtime_mode, CudaGraphMode::kFull);
    EXPECT_EQ(CurrentForwardContext()->descriptor.num_tokens, 8);
    EXPECT_FALSE(CurrentForwardContext()->capture_only);
    {
      ForwardContextScope inner(CudaGraphMode::kPiecewise, BatchDescriptor(32), true);
      EXPECT_EQ(CurrentForwardContext()->runtime_mode, CudaGraphMode::kPiecewise);
      EXPECT_EQ(CurrentForwardContext()->descriptor.num_tokens, 32);
      EXPECT_TRUE(CurrentForwardContext()->capture_only);
    }
    EXPECT_EQ(CurrentForwardContext()->runtime_mode, CudaGraphMode::kFull);
    EXPECT_EQ(CurrentForwardContext()->descriptor.num_tokens, 8);
  }
  EXPECT_EQ(CurrentForwardContext(), nullptr);
}

TEST(ForwardContextTest, EachThreadHasItsOwn) {
  ForwardContextScope scope(CudaGraphMode::kFull, BatchDescriptor(4));
  const ForwardContext* seen = &*CurrentForwardContext();
  std::thread other([&] {
    seen = CurrentForwardContext();
    ForwardContextScope mine(CudaGraphMode::kNone, BatchDescriptor(2));
    EXPECT_EQ(CurrentForwardContext()->runtime_mode, CudaGraphMode::kNone);
  });
  other.join();
  EXPECT_EQ(seen, nullptr);
  EXPECT_EQ(CurrentForwardContext()->runtime_mode, CudaGraphMode::kFull);
}

TEST(ForwardContextTest, OnlyRuntimeModesAreValid) {
  EXPECT_TRUE(ValidateRuntimeMode(CudaGraphMode::kNone).ok());
  EXPECT_TRUE(ValidateRuntimeMode(CudaGraphMode::kPiecewise).ok());
  EXPECT_TRUE(ValidateRuntimeMode(CudaGraphMode::kFull).ok());
  for (CudaGraphMode m : {CudaGraphMode::kFullDecodeOnly, CudaGraphMode::kFullAndPiecewise}) {
    absl::Status s = ValidateRuntimeMode(m);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(m.name()), std::string::npos) << s;
  }
}

TEST(ForwardContextDeathTest, CompositeRuntimeModeRejected) {
  EXPECT_DEATH(ForwardContextScope(CudaGraphMode::kFullAndPiecewise, BatchDescriptor(1)),
               "NONE, PIECEWISE or FULL");
}

TEST(PerModeTest, IndexedByRuntimeMode) {
  PerMode<int> counts;
  ++counts[CudaGraphMode::kFull];
  counts[CudaGraphMode::kPiecewise] += 2;
  EXPECT_EQ(counts[CudaGraphMode::kNone], 0);
  EXPECT_EQ(counts[CudaGraphMode::kPiecewise], 2);
  EXPECT_EQ(counts[CudaGraphMode::kFull], 1);
  int total = 0;
  for (CudaGraphMode m : PerMode<int>::kModes) total += counts[m];
  EXPECT_EQ(total, 3);
}

TEST(PerModeDeathTest, CompositeModeIsNotAnIndex) {
  PerMode<int> counts;
  EXPECT_DEATH(counts[CudaGraphMode::kFullDecodeOnly]++, "");
}

}  // namespace
}  // namespace tandem
