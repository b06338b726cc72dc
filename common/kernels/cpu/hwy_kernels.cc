// Highway kernels (see hwy_kernels.h). This file is compiled once per
// target: foreach_target.h re-includes it with HWY_NAMESPACE set to each.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/kernels/cpu/hwy_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/kernels/cpu/hwy_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace tandem::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 lanes: a 32-element block is then whole vectors on every
// target, and a Q4 block's 16 bytes fill at least one.
using DF = hn::CappedTag<float, 16>;
using DI = hn::Rebind<int32_t, DF>;   // a block's integers, widened
using D8 = hn::Rebind<int8_t, DF>;    // Q8_0 quants
using DU8 = hn::Rebind<uint8_t, DF>;  // Q4 nibble pairs

// A block's f16 scale (little-endian bytes) as f32, converted in a vector
// register (F16C's vcvtph2ps on x86, fcvt on Arm): tensor.cc's F16ToF32 is a
// call with branches, once or twice per 32 weights in the loops below. Both
// are exact, so the results are the same bits.
HWY_INLINE float BlockScale(const uint8_t* p) {
  const hn::CappedTag<float, 1> d1;
  const hn::Rebind<hwy::float16_t, decltype(d1)> dh;
  return hn::GetLane(hn::PromoteTo(d1, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p))));
}

template <DType kType>
constexpr size_t kBlockBytes = kType == DType::kQ8_0 ? 34 : kType == DType::kQ4_0 ? 18 : 20;

template <DType kType>
HWY_INLINE void WidenBlocks(const uint8_t* src, int64_t blocks, float* dst) {
  const DF df;
  const size_t N = hn::Lanes(df);
  constexpr size_t kBytes = kBlockBytes<kType>;
  for (int64_t b = 0; b < blocks; ++b, src += kBytes, dst += 32) {
    const auto d = hn::Set(df, BlockScale(src));
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
      const auto offset = with_min ? hn::Set(df, BlockScale(src + 2))
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

// A row's tail: the first CountTrue(m) lanes (m is always FirstN) through a
// stack buffer. Highway 1.0.3's MaskedLoad and BlendedStore read, and write
// back, the whole vector on SSE4 and EMU128, past the end of the row (ASan:
// heap-buffer-overflow); these touch only the lanes they keep.
template <class D, class M>
HWY_INLINE hn::Vec<D> TailLoad(M m, D d, const hn::TFromD<D>* p) {
  alignas(64) hn::TFromD<D> buf[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)] = {};
  std::memcpy(buf, p, hn::CountTrue(d, m) * sizeof(hn::TFromD<D>));
  return hn::Load(d, buf);
}

template <class D, class M>
HWY_INLINE void TailStore(hn::Vec<D> v, M m, D d, hn::TFromD<D>* p) {
  alignas(64) hn::TFromD<D> buf[HWY_MAX_BYTES / sizeof(hn::TFromD<D>)];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, hn::CountTrue(d, m) * sizeof(hn::TFromD<D>));
}

// The row-wise ops. Whole vectors, then one partial vector for the tail.
using DV = hn::ScalableTag<float>;

void SoftmaxImpl(float* x, int64_t n) {
  if (n <= 0) return;
  const DV d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t full = n - n % N;
  const auto tail = hn::FirstN(d, static_cast<size_t>(n - full));
  auto m = hn::Set(d, -HUGE_VALF);
  for (int64_t i = 0; i < full; i += N) m = hn::Max(m, hn::LoadU(d, x + i));
  if (full < n) {
    m = hn::Max(m, hn::IfThenElse(tail, TailLoad(tail, d, x + full), hn::Set(d, -HUGE_VALF)));
  }
  const auto max = hn::Set(d, hn::GetLane(hn::MaxOfLanes(d, m)));
  auto sum = hn::Zero(d);
  for (int64_t i = 0; i < full; i += N) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), max));
    hn::StoreU(e, d, x + i);
    sum = hn::Add(sum, e);
  }
  if (full < n) {
    const auto e = hn::IfThenElseZero(tail, hn::Exp(d, hn::Sub(TailLoad(tail, d, x + full), max)));
    TailStore(e, tail, d, x + full);
    sum = hn::Add(sum, e);
  }
  const auto inv = hn::Set(d, 1.f / hn::GetLane(hn::SumOfLanes(d, sum)));
  for (int64_t i = 0; i < full; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), inv), d, x + i);
  if (full < n) TailStore(hn::Mul(TailLoad(tail, d, x + full), inv), tail, d, x + full);
}

// silu(g) * u = g * u / (1 + exp(-g)); exp's argument capped at 88 (exp(88)
// is finite, and g * u / exp(88) is 0 to f32 precision anyway).
void SiluMulImpl(const float* gate, const float* up, float* out, int64_t n) {
  const DV d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.f), cap = hn::Set(d, 88.f);
  const auto silu_mul = [&](auto g, auto u) {
    return hn::Div(hn::Mul(g, u), hn::Add(one, hn::Exp(d, hn::Min(hn::Neg(g), cap))));
  };
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(silu_mul(hn::LoadU(d, gate + i), hn::LoadU(d, up + i)), d, out + i);
  if (i < n) {
    const auto tail = hn::FirstN(d, static_cast<size_t>(n - i));
    TailStore(silu_mul(TailLoad(tail, d, gate + i), TailLoad(tail, d, up + i)),
                     tail, d, out + i);
  }
}

// out = y / rms(y) * w, y = base (+ add, stored into sum).
void RmsNormRowImpl(const float* base, const float* add, float* sum, const float* w, float eps,
                    int64_t n, float* out) {
  const DV d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t full = n - n % N;
  const auto tail = hn::FirstN(d, static_cast<size_t>(n - full));
  auto ss = hn::Zero(d);
  if (add != nullptr) {
    for (int64_t i = 0; i < full; i += N) {
      const auto y = hn::Add(hn::LoadU(d, base + i), hn::LoadU(d, add + i));
      hn::StoreU(y, d, sum + i);
      ss = hn::MulAdd(y, y, ss);
    }
    if (full < n) {
      const auto y = hn::Add(TailLoad(tail, d, base + full), TailLoad(tail, d, add + full));
      TailStore(y, tail, d, sum + full);
      ss = hn::MulAdd(y, y, ss);
    }
  } else {
    for (int64_t i = 0; i < full; i += N) {
      const auto y = hn::LoadU(d, base + i);
      ss = hn::MulAdd(y, y, ss);
    }
    if (full < n) {
      const auto y = TailLoad(tail, d, base + full);
      ss = hn::MulAdd(y, y, ss);
    }
  }
  const float* y = add != nullptr ? sum : base;
  const float mean = hn::GetLane(hn::SumOfLanes(d, ss)) / static_cast<float>(n);
  const auto inv = hn::Set(d, 1.f / std::sqrt(mean + eps));
  for (int64_t i = 0; i < full; i += N) {
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, y + i), inv), hn::LoadU(d, w + i)), d, out + i);
  }
  if (full < n) {
    TailStore(hn::Mul(hn::Mul(TailLoad(tail, d, y + full), inv),
                             TailLoad(tail, d, w + full)),
                     tail, d, out + full);
  }
}

// Each 32-element block's sum of x, for Q4_1's minimum (m * sum(x of the
// block)): computed once per call, not once per weight row.
HWY_INLINE void BlockSums(const float* x, int64_t blocks, float* sums) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (int64_t b = 0; b < blocks; ++b, x += 32) {
    auto xs = hn::Zero(df);
    for (size_t i = 0; i < 16; i += N) {
      xs = hn::Add(xs, hn::Add(hn::LoadU(df, x + i), hn::LoadU(df, x + 16 + i)));
    }
    sums[b] = hn::GetLane(hn::SumOfLanes(df, xs));
  }
}

// The block dot products below multiply integers: the weights' quants
// (0..15 or -127..127) by x rounded to int16 per 32-element block
// (x ~= scale * q, scale = max|x| / 32767), 16-bit pairs multiplied and
// summed into int32 lanes (vpmaddwd on x86, smlal on Arm). Against widening
// each quant to f32 for an FMA this halves the instructions per weight, and
// the weight stream is what a decode step waits on once the arithmetic keeps
// up. x's rounding error is at most max|x| / 65534 per element, 2^-16 of the
// block's largest: far below the weights' own 4- or 8-bit quantization.
using DQ = hn::CappedTag<int16_t, 16>;       // x's and the weights' int16 lanes
using DS = hn::Repartition<int32_t, DQ>;     // sums of adjacent products
using DSF = hn::Rebind<float, DS>;           // those sums as f32

HWY_INLINE void QuantizeBlocksI16(const float* x, int64_t blocks, int16_t* q, float* scales) {
  const DF df;
  const hn::Rebind<int16_t, DF> dh;
  const size_t N = hn::Lanes(df);
  for (int64_t b = 0; b < blocks; ++b, x += 32, q += 32) {
    auto m = hn::Zero(df);
    for (size_t i = 0; i < 32; i += N) m = hn::Max(m, hn::Abs(hn::LoadU(df, x + i)));
    const float amax = hn::GetLane(hn::MaxOfLanes(df, m));
    scales[b] = amax / 32767.f;
    const auto inv = hn::Set(df, amax > 0.f ? 32767.f / amax : 0.f);
    for (size_t i = 0; i < 32; i += N) {
      hn::StoreU(hn::DemoteTo(dh, hn::NearestInt(hn::Mul(hn::LoadU(df, x + i), inv))), dh, q + i);
    }
  }
}

// out[r * ldo] = x_r . (one weight row of blocks) for the R (1..4) rows
// x_r (int16 quants xq + r * 32 * blocks, scales xs + r * blocks, f32 block
// sums xsums + r * blocks for Q4_1's minimum): each block's quants are
// loaded once and multiplied by every row, so a step of 1 + k tokens
// (speculative verification) or a small decode batch reads and decodes the
// weights once. A row's arithmetic is the same whatever R is, so its result
// does not depend on the batch it was computed in. Separate variables, not
// arrays: Highway's scalable vectors (SVE) cannot be array elements.
template <DType kType, int R>
HWY_INLINE void DotBlocksRows(const int16_t* xq, const float* xs, const float* xsums,
                              const uint8_t* src, int64_t blocks, float* out, int64_t ldo) {
  static_assert(R >= 1 && R <= 4);
  const DQ dq;
  const DS ds;
  const DSF dsf;
  const size_t N = hn::Lanes(dq);
  constexpr size_t kBytes = kBlockBytes<kType>;
  const int64_t stride = 32 * blocks;  // between rows' quants
  const int16_t* q0 = xq;
  const int16_t* q1 = xq + (R > 1 ? stride : 0);
  const int16_t* q2 = xq + (R > 2 ? 2 * stride : 0);
  const int16_t* q3 = xq + (R > 3 ? 3 * stride : 0);
  auto acc0 = hn::Zero(dsf), acc1 = hn::Zero(dsf), acc2 = hn::Zero(dsf), acc3 = hn::Zero(dsf);
  float min0 = 0.f, min1 = 0.f, min2 = 0.f, min3 = 0.f;  // Q4_1's minimum terms
  // Sums of the products of w (elements [i, i + N)) with each row's x there.
  // sum1: the odd products on targets whose widening multiply keeps them
  // apart (RearrangeToOddPlusEven adds them back).
#define TANDEM_MUL_ROWS(w, o)                                                 \
  do {                                                                        \
    s0 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q0 + (o)), s0, t0); \
    if constexpr (R > 1)                                                      \
      s1 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q1 + (o)), s1, t1); \
    if constexpr (R > 2)                                                      \
      s2 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q2 + (o)), s2, t2); \
    if constexpr (R > 3)                                                      \
      s3 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q3 + (o)), s3, t3); \
  } while (0)
  for (int64_t b = 0; b < blocks; ++b, src += kBytes) {
    const int64_t o = b * 32;
    auto s0 = hn::Zero(ds), s1 = hn::Zero(ds), s2 = hn::Zero(ds), s3 = hn::Zero(ds);
    auto t0 = hn::Zero(ds), t1 = hn::Zero(ds), t2 = hn::Zero(ds), t3 = hn::Zero(ds);
    if constexpr (kType == DType::kQ8_0) {
      const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
      for (size_t i = 0; i < 32; i += N) {
        const auto w = hn::PromoteTo(dq, hn::LoadU(hn::Rebind<int8_t, DQ>(), q + i));
        TANDEM_MUL_ROWS(w, o + i);
      }
    } else {
      const uint8_t* q = src + (kType == DType::kQ4_1 ? 4 : 2);
      const auto mask = hn::Set(dq, 0xF);
      for (size_t i = 0; i < 16; i += N) {
        const auto bytes = hn::PromoteTo(dq, hn::LoadU(hn::Rebind<uint8_t, DQ>(), q + i));
        auto lo = hn::And(bytes, mask);
        auto hi = hn::ShiftRight<4>(bytes);
        if constexpr (kType == DType::kQ4_0) {  // centred at 8
          lo = hn::Sub(lo, hn::Set(dq, 8));
          hi = hn::Sub(hi, hn::Set(dq, 8));
        }
        TANDEM_MUL_ROWS(lo, o + i);
        TANDEM_MUL_ROWS(hi, o + 16 + i);
      }
      if constexpr (kType == DType::kQ4_1) {
        const float m = BlockScale(src + 2);
        min0 += m * xsums[b];
        if constexpr (R > 1) min1 += m * xsums[blocks + b];
        if constexpr (R > 2) min2 += m * xsums[2 * blocks + b];
        if constexpr (R > 3) min3 += m * xsums[3 * blocks + b];
      }
    }
    const float d = BlockScale(src);
    const auto sum = [&](auto s, auto t) { return hn::ConvertTo(dsf, hn::RearrangeToOddPlusEven(s, t)); };
    acc0 = hn::MulAdd(sum(s0, t0), hn::Set(dsf, d * xs[b]), acc0);
    if constexpr (R > 1) acc1 = hn::MulAdd(sum(s1, t1), hn::Set(dsf, d * xs[blocks + b]), acc1);
    if constexpr (R > 2) acc2 = hn::MulAdd(sum(s2, t2), hn::Set(dsf, d * xs[2 * blocks + b]), acc2);
    if constexpr (R > 3) acc3 = hn::MulAdd(sum(s3, t3), hn::Set(dsf, d * xs[3 * blocks + b]), acc3);
  }
#undef TANDEM_MUL_ROWS
  out[0] = hn::GetLane(hn::SumOfLanes(dsf, acc0)) + min0;
  if constexpr (R > 1) out[ldo] = hn::GetLane(hn::SumOfLanes(dsf, acc1)) + min1;
  if constexpr (R > 2) out[2 * ldo] = hn::GetLane(hn::SumOfLanes(dsf, acc2)) + min2;
  if constexpr (R > 3) out[3 * ldo] = hn::GetLane(hn::SumOfLanes(dsf, acc3)) + min3;
}

// Weight rows [j0, j1) of blocks times the n rows of a, four rows at a time.
// scratch: x's int16 quants (n * k / 2 floats' room), then its block scales
// and sums (n * k / 32 floats each).
template <DType kType>
HWY_INLINE void SmallMatmulBlocks(const float* a, int64_t lda, int64_t n, const uint8_t* w,
                                  int64_t k, int64_t j0, int64_t j1, float* c, int64_t ldc,
                                  float* scratch) {
  const int64_t blocks = k / 32;
  const size_t row_bytes = static_cast<size_t>(blocks) * kBlockBytes<kType>;
  int16_t* xq = reinterpret_cast<int16_t*>(scratch);
  float* xs = scratch + n * k / 2;
  float* sums = xs + n * blocks;
  for (int64_t r = 0; r < n; ++r) {
    QuantizeBlocksI16(a + r * lda, blocks, xq + r * k, xs + r * blocks);
    if constexpr (kType == DType::kQ4_1) BlockSums(a + r * lda, blocks, sums + r * blocks);
  }
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* src = w + j * row_bytes;
    for (int64_t r = 0; r < n; r += 4) {
      const int16_t* q = xq + r * k;
      const float* s = xs + r * blocks;
      const float* m = sums + r * blocks;
      float* out = c + r * ldc + j;
      switch (std::min<int64_t>(4, n - r)) {
        case 4: DotBlocksRows<kType, 4>(q, s, m, src, blocks, out, ldc); break;
        case 3: DotBlocksRows<kType, 3>(q, s, m, src, blocks, out, ldc); break;
        case 2: DotBlocksRows<kType, 2>(q, s, m, src, blocks, out, ldc); break;
        default: DotBlocksRows<kType, 1>(q, s, m, src, blocks, out, ldc); break;
      }
    }
  }
}

// f32 or bf16 weights (bf16: the top half of an f32, widened in registers
// exactly). One weight row times the R (1..4) rows x_r = x + r * lda: each
// weight vector is loaded once for all rows; two accumulators per row keep
// two FMA chains in flight at R = 1 (decode). A row's arithmetic does not
// depend on R.
template <typename T>
HWY_INLINE hn::Vec<DV> LoadWeights(DV d, const T* w) {
  if constexpr (sizeof(T) == 4) {
    return hn::LoadU(d, w);
  } else {
    const hn::Rebind<uint16_t, DV> d16;
    const hn::Rebind<uint32_t, DV> du;
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, w))));
  }
}

template <typename T>
HWY_INLINE hn::Vec<DV> LoadWeightsN(DV d, const T* w, size_t count) {
  if constexpr (sizeof(T) == 4) {
    return TailLoad(hn::FirstN(d, count), d, w);
  } else {
    const hn::Rebind<uint16_t, DV> d16;
    const hn::Rebind<uint32_t, DV> du;
    const auto bits = TailLoad(hn::FirstN(d16, count), d16, w);
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, bits)));
  }
}

template <typename T, int R>
HWY_INLINE void DotRowsF(const float* x, int64_t lda, const T* w, int64_t k, float* out,
                         int64_t ldo) {
  static_assert(R >= 1 && R <= 4);
  const DV d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float* x0 = x;
  const float* x1 = x + (R > 1 ? lda : 0);
  const float* x2 = x + (R > 2 ? 2 * lda : 0);
  const float* x3 = x + (R > 3 ? 3 * lda : 0);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  auto b0 = hn::Zero(d), b1 = hn::Zero(d), b2 = hn::Zero(d), b3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * N <= k; i += 2 * N) {
    const auto u = LoadWeights(d, w + i), v = LoadWeights(d, w + i + N);
    a0 = hn::MulAdd(u, hn::LoadU(d, x0 + i), a0);
    b0 = hn::MulAdd(v, hn::LoadU(d, x0 + i + N), b0);
    if constexpr (R > 1) {
      a1 = hn::MulAdd(u, hn::LoadU(d, x1 + i), a1);
      b1 = hn::MulAdd(v, hn::LoadU(d, x1 + i + N), b1);
    }
    if constexpr (R > 2) {
      a2 = hn::MulAdd(u, hn::LoadU(d, x2 + i), a2);
      b2 = hn::MulAdd(v, hn::LoadU(d, x2 + i + N), b2);
    }
    if constexpr (R > 3) {
      a3 = hn::MulAdd(u, hn::LoadU(d, x3 + i), a3);
      b3 = hn::MulAdd(v, hn::LoadU(d, x3 + i + N), b3);
    }
  }
  for (; i < k; i += N) {  // at most two more vectors, the last masked
    const size_t count = static_cast<size_t>(std::min<int64_t>(N, k - i));
    const auto m = hn::FirstN(d, count);
    const auto u = LoadWeightsN(d, w + i, count);
    a0 = hn::MulAdd(u, TailLoad(m, d, x0 + i), a0);
    if constexpr (R > 1) a1 = hn::MulAdd(u, TailLoad(m, d, x1 + i), a1);
    if constexpr (R > 2) a2 = hn::MulAdd(u, TailLoad(m, d, x2 + i), a2);
    if constexpr (R > 3) a3 = hn::MulAdd(u, TailLoad(m, d, x3 + i), a3);
  }
  out[0] = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, b0)));
  if constexpr (R > 1) out[ldo] = hn::GetLane(hn::SumOfLanes(d, hn::Add(a1, b1)));
  if constexpr (R > 2) out[2 * ldo] = hn::GetLane(hn::SumOfLanes(d, hn::Add(a2, b2)));
  if constexpr (R > 3) out[3 * ldo] = hn::GetLane(hn::SumOfLanes(d, hn::Add(a3, b3)));
}

template <typename T>
HWY_INLINE void SmallMatmulRowsF(const float* a, int64_t lda, int64_t n, const T* w, int64_t k,
                                 int64_t j0, int64_t j1, float* c, int64_t ldc) {
  for (int64_t j = j0; j < j1; ++j) {
    const T* wj = w + j * k;
    for (int64_t r = 0; r < n; r += 4) {
      const float* x = a + r * lda;
      float* out = c + r * ldc + j;
      switch (std::min<int64_t>(4, n - r)) {
        case 4: DotRowsF<T, 4>(x, lda, wj, k, out, ldc); break;
        case 3: DotRowsF<T, 3>(x, lda, wj, k, out, ldc); break;
        case 2: DotRowsF<T, 2>(x, lda, wj, k, out, ldc); break;
        default: DotRowsF<T, 1>(x, lda, wj, k, out, ldc); break;
      }
    }
  }
}

void SmallMatmulWidenImpl(DType dtype, const float* a, int64_t lda, int64_t n, const uint8_t* w,
                          int64_t k, int64_t j0, int64_t j1, float* c, int64_t ldc, float* row) {
  switch (dtype) {
    case DType::kQ8_0:
      return SmallMatmulBlocks<DType::kQ8_0>(a, lda, n, w, k, j0, j1, c, ldc, row);
    case DType::kQ4_0:
      return SmallMatmulBlocks<DType::kQ4_0>(a, lda, n, w, k, j0, j1, c, ldc, row);
    case DType::kQ4_1:
      return SmallMatmulBlocks<DType::kQ4_1>(a, lda, n, w, k, j0, j1, c, ldc, row);
    case DType::kBF16:
      return SmallMatmulRowsF(a, lda, n, reinterpret_cast<const uint16_t*>(w), k, j0, j1, c, ldc);
    default:
      return SmallMatmulRowsF(a, lda, n, reinterpret_cast<const float*>(w), k, j0, j1, c, ldc);
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
HWY_EXPORT(SoftmaxImpl);
HWY_EXPORT(SiluMulImpl);
HWY_EXPORT(RmsNormRowImpl);
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

void SoftmaxPortable(float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxImpl)(x, n); }

void SiluMulPortable(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluMulImpl)(gate, up, out, n);
}

void RmsNormRowPortable(const float* base, const float* add, float* sum, const float* w,
                        float eps, int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(RmsNormRowImpl)(base, add, sum, w, eps, n, out);
}

int64_t SmallMatmulScratchFloats(int64_t n, int64_t k) {
  // Block types: int16 quants (two per float), then scales and sums.
  return std::max(k, n * k / 2 + 2 * n * (k / 32));
}

const char* PortableTarget() { return HWY_DYNAMIC_DISPATCH(TargetImpl)(); }

}  // namespace tandem::cpu
#endif  // HWY_ONCE
