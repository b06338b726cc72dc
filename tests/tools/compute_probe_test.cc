// The compute probe's kernels: each listed form runs on this CPU (no
// SIGILL: only what it has is listed), does exactly the multiply-adds it
// claims (the accumulators' sum after N rounds is N x its products per
// round), and the probe reports a rate for each. Built for aarch64 too
// (tests/cross) and run under qemu there.
#include "tools/compute_probe.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ComputeProbeTest, EveryListedKernelDoesTheWorkItCounts) {
  const std::vector<ProbeKernel> kernels = SupportedProbeKernels();
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    ASSERT_FALSE(kernels.empty());
    EXPECT_EQ(kernels[0].form, "f32 FMA");
  }
#elif defined(__aarch64__)
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(kernels[0].form, "f32 FMA");
#endif
  for (const ProbeKernel& k : kernels) {
    for (int64_t n : {1, 7, 1000}) {
      EXPECT_EQ(k.run(n), double(n) * k.ops_per_iteration / 2) << k.instruction << ", " << n;
    }
  }
}

TEST(ComputeProbeTest, EveryFormGetsARate) {
  // One thread: on the caller's (qemu-user, which runs the aarch64 build,
  // starts no threads here).
  const std::vector<ComputePeak> peaks = MeasureComputePeaks(1, 0.03);
  ASSERT_EQ(peaks.size(), SupportedProbeKernels().size());
  for (const ComputePeak& p : peaks) {
    EXPECT_GT(p.gops, 0) << p.instruction;
    EXPECT_FALSE(p.instruction.empty());
  }
#if defined(__x86_64__)
  const std::vector<ComputePeak> two = MeasureComputePeaks(2, 0.03);
  ASSERT_EQ(two.size(), peaks.size());
  for (const ComputePeak& p : two) EXPECT_GT(p.gops, 0) << p.instruction;
#endif
}

}  // namespace
}  // namespace tandem
