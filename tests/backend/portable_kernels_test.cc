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
#include "gtest/gtest.h"

namespace tandem {
namespace {

// Runs fn once per Highway target compiled in that this CPU runs (x86: SSE4,
// AVX2 and, where present, AVX-512 ones; Arm: NEON, SVE, SVE2; EMU128 or
// scalar too), with the kernels switched to it; then back to the best.
template <typename Fn>
void OnEveryTarget(Fn fn) {
  const std::vector<std::string> targets = cpu::Targets();
  ASSERT_FALSE(targets.empty());
  std::string names;
  for (const std::string& target : targets) {
    ASSERT_TRUE(cpu::UseTarget(target)) << target;
    SCOPED_TRACE(target);
    EXPECT_EQ(cpu::Target(), target);
    fn();
    names += (names.empty() ? "" : " ") + target;
  }
  ASSERT_TRUE(cpu::UseTarget(""));
  ::testing::Test::RecordProperty("targets", names);
}

TEST(PortableKernelsTest, TargetsAreChosenByName) {
  const std::vector<std::string> targets = cpu::Targets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(cpu::Target(), targets.front());  // the best one by default
  std::string lower = targets.back();
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  ASSERT_TRUE(cpu::UseTarget(lower));
  EXPECT_EQ(cpu::Target(), targets.back());
  EXPECT_FALSE(cpu::UseTarget("NO_SUCH_TARGET"));
  EXPECT_EQ(cpu::Target(), targets.back());  // unchanged
  ASSERT_TRUE(cpu::UseTarget(""));
  EXPECT_EQ(cpu::Target(), targets.front());
}

// Widening equals ConvertToF32, and the matmuls equal widened weights times
// x for every weight type, at row counts that fill register tiles, leave
// remainders and cross a block of 64 rows, and lengths with a tail past the
// vectors; a row's product is the same bits whatever the number of rows
// beside it (a verification step of 1 + k tokens gives plain decoding's
// logits).
TEST(PortableKernelsTest, EveryTargetWidensAndMultipliesAsTheReference) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const int64_t rows = 7, max_n = 70;
  OnEveryTarget([&] {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
      // 96, 544, 800: odd block counts (3, 17, 25); 192: three block pairs;
      // 800: long enough for the integer path's 32 rows on AVX-512.
      for (int64_t k : {int64_t{96}, int64_t{37}, int64_t{544}, int64_t{192}, int64_t{800}}) {
        if (IsBlockType(dt) && k % 32 != 0) continue;
        SCOPED_TRACE(std::string(DTypeName(dt)) + " k=" + std::to_string(k));
        std::vector<float> w(rows * k), x(max_n * k);
        for (float& v : w) v = uni(rng);
        for (float& v : x) v = uni(rng);
        std::vector<uint8_t> stored(DTypeBytes(dt, rows * k));
        ConvertFromF32(w.data(), dt, stored.data(), rows * k);
        std::vector<float> want(rows * k), got(rows * k);
        ConvertToF32(stored.data(), dt, want.data(), rows * k);
        cpu::WidenRow(dt, stored.data(), rows * k, got.data());
        for (int64_t i = 0; i < rows * k; ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-6f * std::max(1.f, std::fabs(want[i]))) << i;
        }
        // Columns [1, 6) of out[m, 8] = x * w^T.
        const auto matmul = [&](int64_t m, float* out) {
          std::vector<float> scratch(cpu::MatmulBlocksScratchFloats(m, k));
          switch (dt) {
            case DType::kF32:
              return cpu::MatmulF32(x.data(), k, m, w.data(), k, 1, 6, out, 8);
            case DType::kBF16:
              return cpu::MatmulBf16(x.data(), k, m, reinterpret_cast<uint16_t*>(stored.data()),
                                     k, 1, 6, out, 8);
            default:
              return cpu::MatmulBlocks(dt, x.data(), k, m, stored.data(), k, 1, 6, out, 8,
                                       scratch.data());
          }
        };
        std::vector<float> alone(8 * max_n, -1.f);  // each row of x on its own
        for (int64_t r = 0; r < max_n; ++r) {
          std::vector<float> one(8, -1.f);
          const float* xr = x.data() + r * k;
          std::vector<float> scratch(cpu::MatmulBlocksScratchFloats(1, k));
          if (dt == DType::kF32) cpu::MatmulF32(xr, k, 1, w.data(), k, 1, 6, one.data(), 8);
          if (dt == DType::kBF16) {
            cpu::MatmulBf16(xr, k, 1, reinterpret_cast<uint16_t*>(stored.data()), k, 1, 6,
                            one.data(), 8);
          }
          if (IsBlockType(dt)) {
            cpu::MatmulBlocks(dt, xr, k, 1, stored.data(), k, 1, 6, one.data(), 8,
                              scratch.data());
          }
          std::copy(one.begin(), one.end(), alone.begin() + r * 8);
        }
        for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{6}, int64_t{8}, int64_t{9}, int64_t{32}, max_n}) {
          std::vector<float> out(m * 8, -1.f);
          matmul(m, out.data());
          for (int64_t r = 0; r < m; ++r) {
            float amax = 0.f;  // the row's largest |x|, which sets its int16 scale
            for (int64_t e = 0; e < k; ++e) amax = std::max(amax, std::fabs(x[r * k + e]));
            for (int64_t j = 0; j < 8; ++j) {
              if (j < 1 || j >= 6) {
                ASSERT_EQ(out[r * 8 + j], -1.f);  // outside the slice: untouched
                continue;
              }
              // Block types multiply x rounded to int16 per 32 elements:
              // each element off by at most its block's max|x| / 65534.
              double ref = 0, bound = 1e-4;
              for (int64_t i = 0; i < k; ++i) {
                ref += double{x[r * k + i]} * want[j * k + i];
                if (IsBlockType(dt)) {  // x rounded to int16 against its row's largest
                  bound += std::fabs(want[j * k + i]) * amax / 65534.0;
                }
              }
              ASSERT_NEAR(out[r * 8 + j], ref, bound) << r << "," << j;
              if (!IsBlockType(dt) || m <= cpu::BlocksIntegerMaxRows()) {
                ASSERT_EQ(out[r * 8 + j], alone[r * 8 + j]) << m << " rows: " << r << "," << j;
              }
            }
          }
        }
      }
    }
    // A length with a tail past the vectors.
    std::vector<float> a(37), b(37);
    for (float& v : a) v = uni(rng);
    for (float& v : b) v = uni(rng);
    double ref = 0;
    for (int64_t i = 0; i < 37; ++i) ref += double{a[i]} * b[i];
    EXPECT_NEAR(cpu::Dot(a.data(), b.data(), 37), ref, 1e-5);
  });
}

// AVX-VNNI's multiply-add gives the AVX2 target's integer sums exactly (no
// pair of products of a quant and x, rounded to +-32767, reaches int32's
// limit; vpdpwssd does not saturate): the same bits for every block type and
// row count, extremes included (x and the weights at their largest). Skips on
// CPUs without AVX-VNNI or the AVX2 target (Arm, under qemu).
// More rows of x than one pass over the blocks takes, by more weight rows
// than one chunk of the passes holds (a slice that starts and ends inside
// chunks): every row's products the same bits as that row multiplied alone;
// and above BlocksIntegerMaxRows() (AVX-512's interleaved products, 16
// weight rows a group, the last one partial), the same bits as that row in
// any other product of more than BlocksIntegerMaxRows() rows.
TEST(PortableKernelsTest, BlockRowsInChunksEqualEachRowAlone) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const int64_t k = 1024, rows = 300, n = 16, j0 = 7, j1 = 290, many = 75;
  std::vector<float> w(rows * k), x(many * k);
  for (float& v : w) v = uni(rng);
  for (float& v : x) v = uni(rng);
  OnEveryTarget([&] {
    for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
      SCOPED_TRACE(DTypeName(dt));
      ASSERT_GE(cpu::BlocksIntegerMaxRows(), n);
      std::vector<uint8_t> stored(DTypeBytes(dt, rows * k));
      ConvertFromF32(w.data(), dt, stored.data(), rows * k);
      ASSERT_GT(j1 - j0, 2 * 65536 / static_cast<int64_t>(DTypeBytes(dt, k)));  // > 2 chunks
      std::vector<float> all(n * rows, -1.f), one(rows, -1.f);
      std::vector<float> scratch(cpu::MatmulBlocksScratchFloats(n, k));
      cpu::MatmulBlocks(dt, x.data(), k, n, stored.data(), k, j0, j1, all.data(), rows,
                        scratch.data());
      for (int64_t r = 0; r < n; ++r) {
        cpu::MatmulBlocks(dt, x.data() + r * k, k, 1, stored.data(), k, j0, j1, one.data(),
                          rows, scratch.data());
        for (int64_t j = 0; j < rows; ++j) {
          if (j < j0 || j >= j1) {
            ASSERT_EQ(all[r * rows + j], -1.f) << r << "," << j;  // outside the slice
          } else {
            ASSERT_EQ(all[r * rows + j], one[j]) << r << "," << j;
          }
        }
      }
      // Rows [3, 3 + above) of x, within a product of all `many` rows.
      const int64_t above = cpu::BlocksIntegerMaxRows() + 1;
      std::vector<float> big(many * rows, -1.f), part(above * rows, -1.f);
      std::vector<float> big_scratch(cpu::MatmulBlocksScratchFloats(many, k));
      cpu::MatmulBlocks(dt, x.data(), k, many, stored.data(), k, j0, j1, big.data(), rows,
                        big_scratch.data());
      cpu::MatmulBlocks(dt, x.data() + 3 * k, k, above, stored.data(), k, j0, j1, part.data(),
                        rows, big_scratch.data());
      for (int64_t r = 0; r < above; ++r) {
        for (int64_t j = 0; j < rows; ++j) {
          ASSERT_EQ(part[r * rows + j], big[(3 + r) * rows + j]) << r << "," << j;
        }
      }
    }
  });
}

// Above BlocksIntegerMaxRows() the AVX2 target's interleaved products round
// x to int16 with a scale per block of 32, so a row with one outlying
// element (a channel of massive activations) loses no precision in its other
// blocks: each product within its blocks' largest / 65534 of the exact one,
// where one scale per row would be 1000x that.
TEST(PortableKernelsTest, Avx2InterleavedProductsScaleXPerBlock) {
  const std::vector<std::string> targets = cpu::Targets();
  if (std::find(targets.begin(), targets.end(), "AVX2") == targets.end()) {
    GTEST_SKIP() << "no AVX2 target on this CPU";
  }
  ASSERT_TRUE(cpu::UseTarget("AVX2"));
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const int64_t k = 256, rows = 11, n = cpu::BlocksIntegerMaxRows() + 7;
  std::vector<float> w(rows * k), x(n * k);
  for (float& v : w) v = uni(rng);
  for (float& v : x) v = uni(rng);
  for (int64_t r = 0; r < n; ++r) x[r * k + 5] = 1000.f;  // block 0's outlier
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    SCOPED_TRACE(DTypeName(dt));
    std::vector<uint8_t> stored(DTypeBytes(dt, rows * k));
    ConvertFromF32(w.data(), dt, stored.data(), rows * k);
    std::vector<float> want(rows * k), out(n * rows);
    ConvertToF32(stored.data(), dt, want.data(), rows * k);
    std::vector<float> scratch(cpu::MatmulBlocksScratchFloats(n, k));
    cpu::MatmulBlocks(dt, x.data(), k, n, stored.data(), k, 0, rows, out.data(), rows,
                      scratch.data());
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < rows; ++j) {
        double ref = 0, bound = 1e-4;
        for (int64_t b = 0; b < k / 32; ++b) {
          float amax = 0.f;
          for (int64_t e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(x[r * k + b * 32 + e]));
          for (int64_t e = b * 32; e < b * 32 + 32; ++e) {
            ref += double{x[r * k + e]} * want[j * k + e];
            bound += std::fabs(want[j * k + e]) * amax / 65534.0;
          }
        }
        ASSERT_NEAR(out[r * rows + j], ref, bound) << r << "," << j;
      }
    }
  }
  ASSERT_TRUE(cpu::UseTarget(""));
}

TEST(PortableKernelsTest, AvxVnniBlockDotsEqualTheAvx2Target) {
  const std::vector<std::string> targets = cpu::Targets();
  if (std::find(targets.begin(), targets.end(), cpu::kAvx2Vnni) == targets.end()) {
    GTEST_SKIP() << "no AVX-VNNI on this CPU (targets: " << targets.front() << " ...)";
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const int64_t rows = 9, k = 544, max_n = 13;
  std::vector<float> w(rows * k), x(max_n * k);
  for (float& v : w) v = uni(rng);
  for (float& v : x) v = uni(rng);
  for (int64_t i = 0; i < k; ++i) {  // row 0 of x and of w at full scale
    x[i] = i % 2 ? 1.f : -1.f;
    w[i] = i % 3 ? 1.f : -1.f;
  }
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    std::vector<uint8_t> stored(DTypeBytes(dt, rows * k));
    ConvertFromF32(w.data(), dt, stored.data(), rows * k);
    std::vector<float> scratch(cpu::MatmulBlocksScratchFloats(max_n, k));
    const auto product = [&](const std::string& target, int64_t n) {
      EXPECT_TRUE(cpu::UseTarget(target));
      EXPECT_EQ(cpu::Target(), target);
      std::vector<float> out(n * rows);
      cpu::MatmulBlocks(dt, x.data(), k, n, stored.data(), k, 0, rows, out.data(), rows,
                        scratch.data());
      return out;
    };
    for (int64_t n = 1; n <= max_n; ++n) {
      EXPECT_EQ(product(cpu::kAvx2Vnni, n), product("AVX2", n)) << DTypeName(dt) << " n=" << n;
    }
  }
  ASSERT_TRUE(cpu::UseTarget(""));
}

// Attention's kernels against double-precision definitions on every target,
// for head sizes of whole vectors and not (64, 128, 80, 6) and contexts with
// tails: the scores over K transposed, the weighted sum of V rows, and the
// decode form reading f32 or bf16 rows in place at scattered offsets.
TEST(PortableKernelsTest, AttentionKernelsMatchTheirDefinitionsOnEveryTarget) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  OnEveryTarget([&] {
    for (int hd : {64, 128, 80, 6}) {
      for (int64_t ctx : {int64_t{1}, int64_t{5}, int64_t{16}, int64_t{67}}) {
        SCOPED_TRACE("hd=" + std::to_string(hd) + " ctx=" + std::to_string(ctx));
        const int64_t rows = 5, ldq = hd + 3, ldkt = ctx + 2, lds = ctx + 1;
        const float scale = 0.125f;
        std::vector<float> q(rows * ldq), kt(hd * ldkt), s(rows * lds, 9.f);
        for (float& v : q) v = uni(rng);
        for (float& v : kt) v = uni(rng);
        cpu::AttentionScores(q.data(), ldq, rows, kt.data(), ldkt, ctx, hd, scale, s.data(), lds);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < ctx; ++j) {
            double ref = 0;
            for (int d = 0; d < hd; ++d) ref += double{q[r * ldq + d]} * kt[d * ldkt + j];
            ASSERT_NEAR(s[r * lds + j], scale * ref, 1e-5) << r << "," << j;
          }
          ASSERT_EQ(s[r * lds + ctx], 9.f);  // past ctx: untouched
        }
        // out = p * v.
        const int64_t ldo = hd + 2;
        std::vector<float> p(rows * ctx), v(ctx * hd), out(rows * ldo, 9.f);
        for (float& e : p) e = uni(rng);
        for (float& e : v) e = uni(rng);
        cpu::AttentionPv(p.data(), ctx, rows, v.data(), ctx, hd, out.data(), ldo);
        for (int64_t r = 0; r < rows; ++r) {
          for (int d = 0; d < hd; ++d) {
            double ref = 0;
            for (int64_t j = 0; j < ctx; ++j) ref += double{p[r * ctx + j]} * v[j * hd + d];
            ASSERT_NEAR(out[r * ldo + d], ref, 1e-5) << r << "," << d;
          }
          ASSERT_EQ(out[r * ldo + hd], 9.f);
        }
        // Decode: 3 query heads over keys at scattered, reversed offsets of
        // a cache whose rows are 2 heads wide (this head's rows at + hd).
        const int heads = 3;
        const int64_t row = 2 * hd;
        std::vector<float> cache_k(ctx * row), cache_v(ctx * row), qd(heads * hd);
        for (float& e : cache_k) e = uni(rng);
        for (float& e : cache_v) e = uni(rng);
        for (float& e : qd) e = uni(rng);
        std::vector<int64_t> off(ctx);
        for (int64_t j = 0; j < ctx; ++j) off[j] = (ctx - 1 - j) * row;
        std::vector<uint16_t> kb(cache_k.size()), vb(cache_v.size());
        ConvertFromF32(cache_k.data(), DType::kBF16, kb.data(), kb.size());
        ConvertFromF32(cache_v.data(), DType::kBF16, vb.data(), vb.size());
        for (bool bf16 : {false, true}) {
          SCOPED_TRACE(bf16 ? "bf16 cache" : "f32 cache");
          std::vector<float> kf(cache_k), vf(cache_v);
          if (bf16) {
            ConvertToF32(kb.data(), DType::kBF16, kf.data(), kf.size());
            ConvertToF32(vb.data(), DType::kBF16, vf.data(), vf.size());
          }
          std::vector<float> scratch(heads * ctx), od(heads * hd + 1, 9.f);
          if (bf16) {
            cpu::AttentionDecode(qd.data(), heads, hd, kb.data() + hd, vb.data() + hd, off.data(),
                                 ctx, scale, scratch.data(), od.data());
          } else {
            cpu::AttentionDecode(qd.data(), heads, hd, cache_k.data() + hd, cache_v.data() + hd,
                                 off.data(), ctx, scale, scratch.data(), od.data());
          }
          for (int h = 0; h < heads; ++h) {
            std::vector<double> w(ctx);
            double max = -HUGE_VAL, total = 0;
            for (int64_t j = 0; j < ctx; ++j) {
              double dot = 0;
              for (int d = 0; d < hd; ++d) dot += double{qd[h * hd + d]} * kf[off[j] + hd + d];
              w[j] = scale * dot;
              max = std::max(max, w[j]);
            }
            for (double& e : w) total += (e = std::exp(e - max));
            for (int d = 0; d < hd; ++d) {
              double ref = 0;
              for (int64_t j = 0; j < ctx; ++j) ref += w[j] / total * vf[off[j] + hd + d];
              ASSERT_NEAR(od[h * hd + d], ref, 1e-5) << h << "," << d;
            }
          }
          EXPECT_EQ(od[heads * hd], 9.f);
        }
      }
    }
  });
}

// LoRA's second product: out += a . b with bf16 rows of b, at widths that
// fill column groups, single vectors and a partial one, row counts past a
// tile, and strides wider than the rows; nothing outside [0, ncols) written.
TEST(PortableKernelsTest, AddProductBf16AddsToWhatIsThereOnEveryTarget) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  OnEveryTarget([&] {
    for (int64_t ncols : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{67}, int64_t{192}}) {
      for (int64_t nrows : {int64_t{1}, int64_t{3}, int64_t{9}}) {
        for (int64_t inner : {int64_t{1}, int64_t{8}, int64_t{16}}) {
          SCOPED_TRACE("ncols=" + std::to_string(ncols) + " nrows=" + std::to_string(nrows) +
                       " inner=" + std::to_string(inner));
          const int64_t lda = inner + 5, ldb = ncols + 3, ldo = ncols + 2;
          std::vector<float> a(nrows * lda), bf(inner * ldb), out(nrows * ldo + 1);
          for (float& e : a) e = uni(rng);
          for (float& e : bf) e = uni(rng);
          for (float& e : out) e = uni(rng);
          std::vector<uint16_t> b(bf.size());
          ConvertFromF32(bf.data(), DType::kBF16, b.data(), static_cast<int64_t>(b.size()));
          ConvertToF32(b.data(), DType::kBF16, bf.data(), static_cast<int64_t>(bf.size()));
          const std::vector<float> before = out;
          cpu::AddProductBf16(a.data(), lda, nrows, inner, b.data(), ldb, ncols, out.data(), ldo);
          for (int64_t r = 0; r < nrows; ++r) {
            for (int64_t c = 0; c < ldo; ++c) {
              if (c >= ncols) {
                ASSERT_EQ(out[r * ldo + c], before[r * ldo + c]) << r << "," << c;
                continue;
              }
              double ref = before[r * ldo + c];
              for (int64_t k = 0; k < inner; ++k) ref += double{a[r * lda + k]} * bf[k * ldb + c];
              ASSERT_NEAR(out[r * ldo + c], ref, 1e-5) << r << "," << c;
            }
          }
          ASSERT_EQ(out.back(), before.back());
        }
      }
    }
  });
}

// bf16 rounding on every target: tensor.cc's bits, ties to even and NaNs
// included, at every length (vector tails); nothing past n written.
TEST(PortableKernelsTest, Bf16RoundingEqualsTheScalarConversionOnEveryTarget) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1e4f, 1e4f);
  OnEveryTarget([&] {
    for (int n : {1, 3, 15, 16, 17, 100}) {
      std::vector<float> x(n);
      for (int i = 0; i < n; ++i) x[i] = d(rng);
      x[0] = 1.f + 1.f / 256;  // halfway between two bf16: rounds to even (1.0)
      if (n > 2) x[2] = std::nanf("");
      std::vector<uint16_t> fast(n + 1, 7), scalar(n);
      cpu::ToBf16(x.data(), fast.data(), n);
      ConvertFromF32(x.data(), DType::kBF16, scalar.data(), n);
      EXPECT_EQ(std::vector<uint16_t>(fast.begin(), fast.begin() + n), scalar) << n;
      EXPECT_EQ(fast[0], 0x3f80) << n;
      EXPECT_EQ(fast[n], 7) << n;
    }
  });
}

// The AVX512-BF16 prefill kernel where the CPU has it (whether or not the
// matmul op prefers it here: DpBf16Speedup decides that): x rounded to bf16
// then multiplied exactly as the reference, for K with a masked tail (37,
// 100) and without (64, 576), tiles of 4 x 4 and the rows and columns left
// over; columns outside [j0, j1) untouched.
TEST(PortableKernelsTest, Avx512Bf16PrefillKernelMatchesItsDefinition) {
  if (!cpu::HasAvx512Bf16()) {
    EXPECT_EQ(cpu::DpBf16Speedup(), 0);
    EXPECT_FALSE(cpu::PreferDpBf16());
    GTEST_SKIP() << "no AVX512-BF16 on this CPU (or the kernels run below AVX-512)";
  }
  EXPECT_GT(cpu::DpBf16Speedup(), 0);
  EXPECT_EQ(cpu::PreferDpBf16(), cpu::DpBf16Speedup() > 1);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  const int64_t cols = 11, j0 = 1, j1 = 10;
  for (int64_t k : {int64_t{37}, int64_t{64}, int64_t{100}, int64_t{576}}) {
    // 70 and 133: more than one block of kDpBf16RowBlock rows.
    for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{33}, int64_t{70}, int64_t{133}}) {
      SCOPED_TRACE("k=" + std::to_string(k) + " n=" + std::to_string(n));
      std::vector<float> x(n * k), w(cols * k);
      for (float& v : x) v = uni(rng);
      for (float& v : w) v = uni(rng);
      std::vector<uint16_t> wb(cols * k), xb(n * k);
      ConvertFromF32(w.data(), DType::kBF16, wb.data(), cols * k);
      ConvertFromF32(x.data(), DType::kBF16, xb.data(), n * k);
      std::vector<float> wr(cols * k), xr(n * k);
      ConvertToF32(wb.data(), DType::kBF16, wr.data(), cols * k);
      ConvertToF32(xb.data(), DType::kBF16, xr.data(), n * k);
      std::vector<float> out(n * cols, -1.f);
      std::vector<uint16_t> scratch(cpu::MatmulDpBf16ScratchElems(k));
      cpu::MatmulDpBf16(x.data(), k, n, wb.data(), k, j0, j1, out.data(), cols, scratch.data());
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          if (j < j0 || j >= j1) {
            ASSERT_EQ(out[i * cols + j], -1.f) << i << "," << j;
            continue;
          }
          double ref = 0, mag = 0;
          for (int64_t d = 0; d < k; ++d) {
            ref += double{xr[i * k + d]} * wr[j * k + d];
            mag += std::fabs(double{xr[i * k + d]} * wr[j * k + d]);
          }
          ASSERT_NEAR(out[i * cols + j], ref, 1e-5 * mag + 1e-6) << i << "," << j;
        }
      }
    }
  }
}

// The row-wise kernels on every target, at lengths with a masked tail:
// softmax, SiLU x up, RMSNorm (with and without the residual add), RoPE and
// the bias add against
// double-precision definitions; lanes past n are never written.
TEST(PortableKernelsTest, RowKernelsMatchTheirDefinitionsOnEveryTarget) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-4.f, 4.f);
  OnEveryTarget([&] {
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
      cpu::Softmax(soft.data(), n);
      double max = -HUGE_VAL, total = 0;
      for (int64_t i = 0; i < n; ++i) max = std::max(max, double{x[i]});
      for (int64_t i = 0; i < n; ++i) total += std::exp(x[i] - max);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(soft[i], std::exp(x[i] - max) / total, 1e-6) << i;
      }
      EXPECT_EQ(soft[n], guard);

      std::vector<float> out(n + 1, 7.f);
      cpu::SiluMul(gate.data(), up.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double g = gate[i], want = g / (1.0 + std::exp(-g)) * up[i];
        ASSERT_NEAR(out[i], want, 1e-6 * (1 + std::fabs(want))) << i;
      }
      EXPECT_EQ(out[n], 7.f);

      for (bool residual : {false, true}) {
        std::vector<float> sum(n + 1, 7.f), normed(n + 1, 7.f);
        cpu::RmsNormRow(base.data(), residual ? add.data() : nullptr,
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
    // RoPE of 3 heads (head sizes of whole vectors and not) and a bias add.
    for (int hd : {64, 6, 128}) {
      const int heads = 3, half = hd / 2;
      std::vector<float> row(heads * hd + 1), cos(half), sin(half);
      for (float& v : row) v = uni(rng);
      for (int f = 0; f < half; ++f) {
        const float angle = uni(rng) * 3.f;
        cos[f] = std::cos(angle);
        sin[f] = std::sin(angle);
      }
      const std::vector<float> before = row;
      cpu::RopeRow(row.data(), heads, hd, cos.data(), sin.data());
      for (int h = 0; h < heads; ++h) {
        for (int f = 0; f < half; ++f) {
          const double a = before[h * hd + f], b = before[h * hd + f + half];
          ASSERT_NEAR(row[h * hd + f], a * cos[f] - b * sin[f], 1e-6) << hd << " " << h << " " << f;
          ASSERT_NEAR(row[h * hd + f + half], b * cos[f] + a * sin[f], 1e-6) << hd << " " << f;
        }
      }
      EXPECT_EQ(row[heads * hd], before[heads * hd]);
    }
    for (int64_t n : {1, 7, 16, 37}) {
      std::vector<float> x(n + 1, 1.5f), b(n);
      for (int64_t i = 0; i < n; ++i) b[i] = static_cast<float>(i);
      cpu::AddRow(x.data(), b.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], 1.5f + i);
      EXPECT_EQ(x[n], 1.5f);
    }
    // exp within 1 ulp.
    for (float e = -80.f; e < 80.f; e += 0.37f) {
      ASSERT_NEAR(cpu::ExpForTest(e), std::exp(e), 1.2e-7f * std::exp(e)) << e;
    }
  });
  // On the best target, the same definitions.
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
