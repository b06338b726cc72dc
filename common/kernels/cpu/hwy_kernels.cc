// Highway kernels (see hwy_kernels.h). This file is compiled once per
// target: foreach_target.h re-includes it with HWY_NAMESPACE set to each.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/kernels/cpu/hwy_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <cstring>

#include "common/kernels/cpu/hwy_kernels.h"

#ifndef TANDEM_COMMON_KERNELS_CPU_HWY_KERNELS_ONCE_
#define TANDEM_COMMON_KERNELS_CPU_HWY_KERNELS_ONCE_
namespace tandem::cpu::internal {

// A block's f16 scale (little-endian bytes) as f32.
inline float HalfToFloat(const uint8_t* p) {
  return F16ToF32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

}  // namespace tandem::cpu::internal
#endif

HWY_BEFORE_NAMESPACE();
namespace tandem::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 lanes: a 32-element block is then whole vectors on every
// target, and a Q4 block's 16 bytes fill at least one.
using DF = hn::CappedTag<float, 16>;
using DI = hn::Rebind<int32_t, DF>;   // a block's integers, widened
using D8 = hn::Rebind<int8_t, DF>;    // Q8_0 quants
using DU8 = hn::Rebind<uint8_t, DF>;  // Q4 nibble pairs
template <DType kType>
constexpr size_t kBlockBytes = kType == DType::kQ8_0 ? 34 : kType == DType::kQ4_0 ? 18 : 20;

template <DType kType>
HWY_INLINE void WidenBlocks(const uint8_t* src, int64_t blocks, float* dst) {
  const DF df;
  const size_t N = hn::Lanes(df);
  constexpr size_t kBytes = kBlockBytes<kType>;
  for (int64_t b = 0; b < blocks; ++b, src += kBytes, dst += 32) {
    const auto d = hn::Set(df, internal::HalfToFloat(src));
    if constexpr (kType == DType::kQ8_0) {
      const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
      for (size_t i = 0; i < 32; i += N) {
        const auto v = hn::ConvertTo(df, hn::PromoteTo(DI(), hn::LoadU(D8(), q + i)));
        hn::StoreU(hn::Mul(v, d), df, dst + i);
      }
    } else {
      const bool with_min = kType == DType::kQ4_1;
      const uint8_t* q = src + (with_min ? 4 : 2);
      // Q4_0 centres at 8; Q4_1 adds its f16 minimum.
      const auto offset = with_min ? hn::Set(df, internal::HalfToFloat(src + 2))
                                   : hn::Mul(d, hn::Set(df, -8.f));
      const auto mask = hn::Set(DI(), 0xF);
      for (size_t i = 0; i < 16; i += N) {
        const auto bytes = hn::PromoteTo(DI(), hn::LoadU(DU8(), q + i));
        const auto lo = hn::ConvertTo(df, hn::And(bytes, mask));
        const auto hi = hn::ConvertTo(df, hn::ShiftRight<4>(bytes));
        hn::StoreU(hn::MulAdd(lo, d, offset), df, dst + i);
        hn::StoreU(hn::MulAdd(hi, d, offset), df, dst + 16 + i);
      }
    }
  }
}

void WidenRowImpl(DType dtype, const void* src, int64_t n, float* dst) {
  const uint8_t* s = static_cast<const uint8_t*>(src);
  switch (dtype) {
    case DType::kQ8_0: return WidenBlocks<DType::kQ8_0>(s, n / 32, dst);
    case DType::kQ4_0: return WidenBlocks<DType::kQ4_0>(s, n / 32, dst);
    case DType::kQ4_1: return WidenBlocks<DType::kQ4_1>(s, n / 32, dst);
    case DType::kBF16: {
      const DF df;
      const hn::Rebind<uint16_t, DF> d16;
      const hn::Rebind<uint32_t, DF> du;
      const size_t N = hn::Lanes(df);
      const uint16_t* h = static_cast<const uint16_t*>(src);
      int64_t i = 0;
      for (; i + static_cast<int64_t>(N) <= n; i += N) {
        // bf16 is the top half of an f32.
        const auto wide = hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, h + i)));
        hn::StoreU(hn::BitCast(df, wide), df, dst + i);
      }
      for (; i < n; ++i) {
        const uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
        std::memcpy(dst + i, &bits, 4);
      }
      return;
    }
    default:
      std::memcpy(dst, src, n * sizeof(float));  // f32
  }
}

float DotF32Impl(const float* a, const float* b, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + i + N), hn::LoadU(df, b + i + N), acc1);
  }
  for (; i + N <= n; i += N) acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// x . (one weight row of blocks), each block widened in registers: the
// batch-1 decode product (no store of the widened row).
template <DType kType>
HWY_INLINE float DotBlocks(const float* x, const uint8_t* src, int64_t blocks) {
  const DF df;
  const size_t N = hn::Lanes(df);
  constexpr size_t kBytes = kBlockBytes<kType>;
  auto acc = hn::Zero(df);
  float min_sum = 0.f;  // Q4_1: sum over blocks of m * sum(x of the block)
  for (int64_t b = 0; b < blocks; ++b, src += kBytes, x += 32) {
    auto part = hn::Zero(df);
    if constexpr (kType == DType::kQ8_0) {
      const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
      for (size_t i = 0; i < 32; i += N) {
        const auto v = hn::ConvertTo(df, hn::PromoteTo(DI(), hn::LoadU(D8(), q + i)));
        part = hn::MulAdd(v, hn::LoadU(df, x + i), part);
      }
    } else {
      const uint8_t* q = src + (kType == DType::kQ4_1 ? 4 : 2);
      const auto mask = hn::Set(DI(), 0xF);
      // Q4_0's -8 folded in: d * (q - 8) . x.
      const auto centre = hn::Set(df, kType == DType::kQ4_0 ? -8.f : 0.f);
      auto xs = hn::Zero(df);
      for (size_t i = 0; i < 16; i += N) {
        const auto bytes = hn::PromoteTo(DI(), hn::LoadU(DU8(), q + i));
        const auto lo = hn::Add(hn::ConvertTo(df, hn::And(bytes, mask)), centre);
        const auto hi = hn::Add(hn::ConvertTo(df, hn::ShiftRight<4>(bytes)), centre);
        const auto x_lo = hn::LoadU(df, x + i), x_hi = hn::LoadU(df, x + 16 + i);
        part = hn::MulAdd(lo, x_lo, hn::MulAdd(hi, x_hi, part));
        if constexpr (kType == DType::kQ4_1) xs = hn::Add(xs, hn::Add(x_lo, x_hi));
      }
      if constexpr (kType == DType::kQ4_1) {
        min_sum += internal::HalfToFloat(src + 2) * hn::GetLane(hn::SumOfLanes(df, xs));
      }
    }
    acc = hn::MulAdd(hn::Set(df, internal::HalfToFloat(src)), part, acc);
  }
  return hn::GetLane(hn::SumOfLanes(df, acc)) + min_sum;
}

void SmallMatmulWidenImpl(DType dtype, const float* a, int64_t lda, int64_t n, const uint8_t* w,
                          int64_t k, int64_t j0, int64_t j1, float* c, int64_t ldc, float* row) {
  const size_t row_bytes = DTypeBytes(dtype, k);
  if (n == 1 && IsBlockType(dtype)) {
    for (int64_t j = j0; j < j1; ++j) {
      const uint8_t* src = w + j * row_bytes;
      switch (dtype) {
        case DType::kQ8_0: c[j] = DotBlocks<DType::kQ8_0>(a, src, k / 32); break;
        case DType::kQ4_0: c[j] = DotBlocks<DType::kQ4_0>(a, src, k / 32); break;
        default: c[j] = DotBlocks<DType::kQ4_1>(a, src, k / 32); break;
      }
    }
    return;
  }
  for (int64_t j = j0; j < j1; ++j) {
    WidenRowImpl(dtype, w + j * row_bytes, k, row);
    for (int64_t r = 0; r < n; ++r) c[r * ldc + j] = DotF32Impl(a + r * lda, row, k);
  }
}

const char* TargetImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace tandem::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::cpu {

HWY_EXPORT(WidenRowImpl);
HWY_EXPORT(DotF32Impl);
HWY_EXPORT(SmallMatmulWidenImpl);
HWY_EXPORT(TargetImpl);

void WidenRow(DType dtype, const void* src, int64_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(WidenRowImpl)(dtype, src, n, dst);
}

float DotF32(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotF32Impl)(a, b, n);
}

void SmallMatmulWiden(DType dtype, const float* a, int64_t lda, int64_t n, const uint8_t* w,
                      int64_t k, int64_t j0, int64_t j1, float* c, int64_t ldc, float* row) {
  HWY_DYNAMIC_DISPATCH(SmallMatmulWidenImpl)(dtype, a, lda, n, w, k, j0, j1, c, ldc, row);
}

const char* PortableTarget() { return HWY_DYNAMIC_DISPATCH(TargetImpl)(); }

}  // namespace tandem::cpu
#endif  // HWY_ONCE
