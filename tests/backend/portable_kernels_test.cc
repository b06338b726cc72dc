// The portable (Highway) kernels on every target compiled in that this CPU
// runs. Depends only on the kernels and tensor conversions, so it is also
// cross-built for aarch64 and run under qemu (scripts/cross_arm.sh).
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/backend/tensor.h"
#include "common/kernels/cpu/cpu_kernels.h"
#include "common/kernels/cpu/hwy_kernels.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"

namespace tandem {
namespace {

// The Highway kernels on every target compiled in that this CPU runs
// (x86: SSE4, AVX2 and, where present, AVX-512 ones; Arm: NEON, SVE, SVE2;
// scalar/EMU128 too): widening equals ConvertToF32 and the small matmul equals widened
// weights times x, for every narrow weight type; a row's product is the same
// bits whatever the number of rows beside it (a verification step of 1 + k
// tokens gives plain decoding's logits).
TEST(PortableKernelsTest, EveryTargetWidensAndMultipliesAsTheReference) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const int64_t rows = 7, k = 96, n = 6;
  std::vector<float> w(rows * k), x(n * k);
  for (float& v : w) v = uni(rng);
  for (float& v : x) v = uni(rng);
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    EXPECT_STREQ(cpu::PortableTarget(), hwy::TargetName(target));
    for (DType dt : {DType::kF32, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
      SCOPED_TRACE(std::string(DTypeName(dt)));
      std::vector<uint8_t> stored(DTypeBytes(dt, rows * k));
      ConvertFromF32(w.data(), dt, stored.data(), rows * k);
      std::vector<float> want(rows * k), got(rows * k);
      ConvertToF32(stored.data(), dt, want.data(), rows * k);
      cpu::WidenRow(dt, stored.data(), rows * k, got.data());
      for (int64_t i = 0; i < rows * k; ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-6f * std::max(1.f, std::fabs(want[i]))) << i;
      }
      // Columns [2, 6) of out[m, rows] = x * w^T, out rows 8 apart; one row
      // of x (decode), three, and six (four at a time, then two).
      std::vector<std::vector<float>> alone(n);  // each row of x on its own
      for (int64_t r = 0; r < n; ++r) {
        alone[r].assign(8, -1.f);
        std::vector<float> row(cpu::SmallMatmulScratchFloats(1, k));
        cpu::SmallMatmulWiden(dt, x.data() + r * k, k, 1, stored.data(), k, 2, 6,
                              alone[r].data(), 8, row.data());
      }
      for (int64_t m : {int64_t{1}, int64_t{3}, n}) {
        std::vector<float> out(m * 8, -1.f), row(cpu::SmallMatmulScratchFloats(m, k));
        cpu::SmallMatmulWiden(dt, x.data(), k, m, stored.data(), k, 2, 6, out.data(), 8, row.data());
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t j = 0; j < 8; ++j) {
            if (j < 2 || j >= 6) {
              EXPECT_EQ(out[r * 8 + j], -1.f);  // outside the slice: untouched
              continue;
            }
            // Block types multiply x rounded to int16 per 32 elements: each
            // element off by at most its block's max|x| / 65534.
            double ref = 0, bound = 1e-4;
            for (int64_t i = 0; i < k; ++i) {
              ref += double{x[r * k + i]} * want[j * k + i];
              if (IsBlockType(dt)) {
                float amax = 0.f;
                for (int64_t e = i / 32 * 32; e < i / 32 * 32 + 32; ++e) {
                  amax = std::max(amax, std::fabs(x[r * k + e]));
                }
                bound += std::fabs(want[j * k + i]) * amax / 65534.0;
              }
            }
            EXPECT_NEAR(out[r * 8 + j], ref, bound) << r << "," << j;
            EXPECT_EQ(out[r * 8 + j], alone[r][j]) << m << " rows: " << r << "," << j;
          }
        }
      }
    }
    // A length with a tail past the vectors.
    double ref = 0;
    for (int64_t i = 0; i < 37; ++i) ref += double{x[i]} * w[i];
    EXPECT_NEAR(cpu::DotF32(x.data(), w.data(), 37), ref, 1e-5);
  }
  hwy::SetSupportedTargetsForTest(0);
  std::string names;
  for (int64_t target : targets) names += std::string(names.empty() ? "" : " ") + hwy::TargetName(target);
  ::testing::Test::RecordProperty("targets", names);
}


// The row-wise kernels on every target, at lengths with a masked tail
// (and cpu_kernels.h's entry points, which use them without AVX-512):
// softmax, SiLU x up and RMSNorm (with and without the residual add) against
// double-precision definitions; lanes past n are never written.
TEST(PortableKernelsTest, RowKernelsMatchTheirDefinitionsOnEveryTarget) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-4.f, 4.f);
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (int64_t n : {1, 7, 16, 37, 576}) {
      SCOPED_TRACE(n);
      std::vector<float> x(n + 1), gate(n), up(n), w(n), base(n), add(n);
      for (float& v : x) v = uni(rng);
      for (int64_t i = 0; i < n; ++i) {
        gate[i] = uni(rng) * 30.f;  // far into exp's tails both ways
        up[i] = uni(rng);
        w[i] = uni(rng);
        base[i] = uni(rng);
        add[i] = uni(rng);
      }
      if (n > 1) x[3 % n] = -HUGE_VALF;  // a masked score
      const float guard = x[n];
      std::vector<float> soft(x);
      cpu::SoftmaxPortable(soft.data(), n);
      double max = -HUGE_VAL, total = 0;
      for (int64_t i = 0; i < n; ++i) max = std::max(max, double{x[i]});
      for (int64_t i = 0; i < n; ++i) total += std::exp(x[i] - max);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(soft[i], std::exp(x[i] - max) / total, 1e-6) << i;
      }
      EXPECT_EQ(soft[n], guard);

      std::vector<float> out(n + 1, 7.f);
      cpu::SiluMulPortable(gate.data(), up.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double g = gate[i], want = g / (1.0 + std::exp(-g)) * up[i];
        ASSERT_NEAR(out[i], want, 1e-6 * (1 + std::fabs(want))) << i;
      }
      EXPECT_EQ(out[n], 7.f);

      for (bool residual : {false, true}) {
        std::vector<float> sum(n + 1, 7.f), normed(n + 1, 7.f);
        cpu::RmsNormRowPortable(base.data(), residual ? add.data() : nullptr,
                                residual ? sum.data() : nullptr, w.data(), 1e-5f, n,
                                normed.data());
        double ss = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double y = double{base[i]} + (residual ? add[i] : 0.f);
          ss += y * y;
          if (residual) {
            ASSERT_EQ(sum[i], base[i] + add[i]) << i;
          }
        }
        const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
        for (int64_t i = 0; i < n; ++i) {
          const double y = double{base[i]} + (residual ? add[i] : 0.f);
          ASSERT_NEAR(normed[i], y * inv * w[i], 1e-5 * (1 + std::fabs(y * inv * w[i]))) << i;
        }
        EXPECT_EQ(normed[n], 7.f);
        EXPECT_EQ(sum[n], 7.f);
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  // The entry points the CPU backend calls (AVX-512 where present, else the
  // above): the same definitions.
  std::vector<float> x = {1.f, 2.f, 3.f, -1.f, 0.5f};
  cpu::Softmax(x.data(), static_cast<int64_t>(x.size()));
  double sum = 0;
  for (float v : x) sum += v;
  EXPECT_NEAR(sum, 1.0, 1e-6);
  EXPECT_NEAR(x[2] / x[1], std::exp(1.f), 1e-5);
  const std::vector<float> gate = {-2.f, 0.f, 3.f}, up = {1.f, 2.f, -1.f};
  std::vector<float> out(3);
  cpu::SiluMul(gate.data(), up.data(), out.data(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(out[i], gate[i] / (1.f + std::exp(-gate[i])) * up[i], 1e-6) << i;
  }
  const std::vector<float> a = {1.f, 2.f, 3.f}, b = {4.f, -5.f, 6.f};
  EXPECT_FLOAT_EQ(cpu::Dot(a.data(), b.data(), 3), 12.f);
}

}  // namespace
}  // namespace tandem
