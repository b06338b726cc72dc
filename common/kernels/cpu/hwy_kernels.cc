// The CPU kernels of cpu_kernels.h, written once against Highway's vector
// API. This file is compiled once per target: foreach_target.h re-includes
// it with HWY_NAMESPACE set to each, and HWY_DYNAMIC_DISPATCH picks the best
// one the running CPU supports at the first call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/kernels/cpu/hwy_kernels.cc"
// Also compiled for AVX3_DL (AVX-512 with VNNI: Ice Lake and later Xeons,
// Zen 4 and later), which Highway 1.0 builds only when asked: its integer
// block dots take one instruction per multiply-add (MulAddPairs).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "absl/strings/match.h"
#include "common/kernels/cpu/cpu_kernels.h"

// A lambda's body inlined where it is called: the block loop's lambda
// captures the accumulators by reference, and a call that is not inlined
// keeps them in memory (Q4_1 at 5 rows of x: 2.6x slower).
#define TANDEM_ALWAYS_INLINE __attribute__((always_inline))

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

// Rotates each of `heads` heads (hd floats apart) of one token's row: for
// f < hd / 2, (x[f], x[f + hd/2]) by the angle whose cos and sin are given.
void RopeRowImpl(float* x, int heads, int hd, const float* cos, const float* sin) {
  const DV d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t half = hd / 2, full = half - half % N;
  const auto rotate = [&](auto a, auto b, auto c, auto s, auto store) {
    store(hn::MulSub(a, c, hn::Mul(b, s)), hn::MulAdd(b, c, hn::Mul(a, s)));
  };
  for (int h = 0; h < heads; ++h) {
    float* lo = x + int64_t{h} * hd;
    float* hi = lo + half;
    for (int64_t f = 0; f < full; f += N) {
      rotate(hn::LoadU(d, lo + f), hn::LoadU(d, hi + f), hn::LoadU(d, cos + f),
             hn::LoadU(d, sin + f), [&](auto u, auto v) {
               hn::StoreU(u, d, lo + f);
               hn::StoreU(v, d, hi + f);
             });
    }
    if (full < half) {
      const auto m = hn::FirstN(d, static_cast<size_t>(half - full));
      rotate(TailLoad(m, d, lo + full), TailLoad(m, d, hi + full), TailLoad(m, d, cos + full),
             TailLoad(m, d, sin + full), [&](auto u, auto v) {
               TailStore(u, m, d, lo + full);
               TailStore(v, m, d, hi + full);
             });
    }
  }
}

// x[:n] += b[:n].
void AddRowImpl(float* x, const float* b, int64_t n) {
  const DV d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Add(hn::LoadU(d, x + i), hn::LoadU(d, b + i)), d, x + i);
  if (i < n) {
    const auto m = hn::FirstN(d, static_cast<size_t>(n - i));
    TailStore(hn::Add(TailLoad(m, d, x + i), TailLoad(m, d, b + i)), m, d, x + i);
  }
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
// (0..15 or -127..127) by x rounded to int16 with one scale per row
// (x ~= scale * q, scale = max|x| / 32767), 16-bit pairs multiplied and
// summed into int32 lanes (vpmaddwd on x86, smlal on Arm). Against widening
// each quant to f32 for an FMA this halves the instructions per weight, and
// the weight stream is what a decode step waits on once the arithmetic keeps
// up. x's rounding error is at most max|x| / 65534 per element, 2^-16 of the
// row's largest: far below the weights' own 4- or 8-bit quantization, and
// finer than bf16's 2^-8 relative step unless the row's largest is 256 times
// the element. One scale per row, not per block: a block then costs each row
// a multiply-add, a conversion and a multiply-add by the block's scale, where
// a scale per block and row cost two instructions more (SmolLM2 Q4_1, 1 + 4
// token verification step, see docs/benchmarks.md).
// x's and the weights' int16 lanes: a whole block per vector on AVX-512 (one
// multiply-add per block and row instead of two: SmolLM2 Q8_0 decode at
// batch 1 and 5, see docs/backends.md); at most 16 on SVE, whose vector
// length is known only at run time.
#if HWY_HAVE_SCALABLE
using DQ = hn::CappedTag<int16_t, 16>;
#else
using DQ = hn::CappedTag<int16_t, 32>;
#endif
using DS = hn::Repartition<int32_t, DQ>;     // sums of adjacent products
using DSF = hn::Rebind<float, DS>;           // those sums as f32

// Q4 blocks in pairs on x86: a pair's quants fill vectors of int16 lanes
// with half of each from each block (AVX-512: a vector of both blocks' low
// nibbles, elements 0-15 of each, then one of their high nibbles; AVX2: four
// vectors of 8 elements from each), so that the multiply-adds' int32 sums
// of adjacent products (vpmaddwd) keep the two blocks in separate halves,
// and one conversion and one multiply-add by the pair's scales (a vector of
// each block's scale in its half) serve two blocks instead of one. SmolLM2
// Q4_1 decode on a Zen 5 core, AVX-512: batches 1 and 5 6-11% faster at 1
// and 2 threads; AVX2 (with rows of x taken one after another): batches 5
// and 8 7-9% faster, batch 1 unchanged (docs/benchmarks.md, "Q4 block
// pairs"). Q8_0 blocks pair on AVX-512 only (TANDEM_Q8_PAIRS: elements 0-15
// of both blocks in one vector, 16-31 in the next): on a Zen 5 core it was
// measured slower (batch 1 3-4% on AVX-512, 6% on AVX2: a block's 32 bytes
// widen to whole vectors, and putting halves together cost more than the
// conversions it saved), on an Intel Xeon (family 6 model 207) it is 20% faster
// at batch 1 and 21-27% at 5 rows of x (AVX3), 23-28% and 30-35% with VNNI's
// multiply-add (AVX3_DL); docs/benchmarks.md, "Q8_0 block pairs". Arm's
// widening multiply-adds (Highway's ReorderWidenMulAccumulate) sum a
// vector's halves rather than adjacent lanes, so the blocks would mix.
// The same targets (x86 from AVX2 up) take rows of x apart: a unit's quants
// (a block or a pair) are one, two or four vectors, and each row of x is
// multiplied and accumulated before the next (DotBlocksRows).
#undef TANDEM_BLOCK_PAIRS  // this file is compiled once per target
#undef TANDEM_Q8_PAIRS
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define TANDEM_BLOCK_PAIRS 1
#else
#define TANDEM_BLOCK_PAIRS 0
#endif
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define TANDEM_Q8_PAIRS 1
#else
#define TANDEM_Q8_PAIRS 0
#endif
template <DType kType>
constexpr int64_t kPairBlocks =
    TANDEM_BLOCK_PAIRS && (kType != DType::kQ8_0 || TANDEM_Q8_PAIRS) ? 2 : 1;

// Blocks in x's quantized layout: rounded up to whole pairs (zeros after).
template <DType kType>
constexpr int64_t PaddedBlocks(int64_t blocks) {
  return (blocks + kPairBlocks<kType> - 1) / kPairBlocks<kType> * kPairBlocks<kType>;
}

// x rounded to int16, PaddedBlocks(blocks) * 32 elements at q. With block
// pairs, each pair's 64 elements as its weights' vectors hold them, in
// chunks of half a vector (h = 16 on AVX-512, 8 on AVX2): block 0's [0, h),
// block 1's [0, h), block 0's [h, 2h), ... (an odd count's last block pairs
// with zeros). kInOrder: blocks * 32 elements in order (InterleavedBlocks).
template <DType kType, bool kInOrder = false>
HWY_INLINE void QuantizeRowI16(const float* x, int64_t blocks, int16_t* q, float* scale) {
  const DF df;
  const hn::Rebind<int16_t, DF> dh;
  const size_t N = hn::Lanes(df);
  const int64_t k = 32 * blocks;
  auto m = hn::Zero(df);
  for (int64_t i = 0; i < k; i += N) m = hn::Max(m, hn::Abs(hn::LoadU(df, x + i)));
  const float amax = hn::GetLane(hn::MaxOfLanes(df, m));
  *scale = amax / 32767.f;
  const auto inv = hn::Set(df, amax > 0.f ? 32767.f / amax : 0.f);
  if (!kInOrder && PaddedBlocks<kType>(blocks) > blocks) {
    std::fill(q + k - 32, q + k + 32, int16_t{0});
  }
  for (int64_t i = 0; i < k; i += N) {
    int64_t at = i;
    if constexpr (!kInOrder && kPairBlocks<kType> == 2) {  // N: half a vector of int16
      const int64_t b = i / 32, e = i % 32, h = static_cast<int64_t>(N);
      at = (b / 2) * 64 + e / h * 2 * h + (b % 2) * h;
    }
    hn::StoreU(hn::DemoteTo(dh, hn::NearestInt(hn::Mul(hn::LoadU(df, x + i), inv))), dh, q + at);
  }
}

// Lane kLane of each 128-bit block of v in every lane of a vector of d (as
// many lanes as v, or half as many). A template, so that clang does not
// check the branch a target does not take.
template <int kLane, class D, class V>
HWY_INLINE hn::Vec<D> BroadcastLane(D /*d*/, V v) {
  if constexpr (hn::MaxLanes(D()) == hn::MaxLanes(hn::DFromV<V>())) {
    return hn::Broadcast<kLane>(v);
  } else {
    return hn::Broadcast<kLane>(hn::LowerHalf(v));
  }
}

// s + the sums of adjacent products of w and x's int16 lanes (ReorderWidenMulAccumulate:
// vpmaddwd, then vpaddd on x86). AVX3_DL targets have VNNI's vpdpwssd, both
// in one instruction (the same integer sums: no product pair of quants and
// x rounded to +-32767 reaches int32's limit). Measured on a Xeon (family 6
// model 207), SmolLM2 Q4_1: a 1 + 4 token verification step 8-13% faster,
// batch 1 4% (docs/benchmarks.md, "VNNI's one-instruction multiply-add").
// kVnni (AVX2 target only): AVX-VNNI's VEX-encoded vpdpwssd on 256-bit
// vectors, for CPUs that have it without AVX-512 (Intel's cores from Alder
// Lake on, Sierra Forest; AvxVnni()): on an Intel Xeon (family 6 model 207)
// running the AVX2 kernels, SmolLM2's Q4_1 products at 5 rows of x 15-25%
// faster, batch 1 2-6%, Q8_0 at 5 rows 3-10% (docs/benchmarks.md, "AVX-VNNI
// on the AVX2 target").
template <bool kVnni, class DS32, class V16>
HWY_INLINE hn::Vec<DS32> MulAddPairs(DS32 ds, V16 w, V16 x, hn::Vec<DS32> s, hn::Vec<DS32>& t) {
#if HWY_TARGET == HWY_AVX3_DL
  if constexpr (hn::MaxLanes(DS32()) == 16) {
    // Written out: Highway 1.0 compiles AVX3_DL without GCC's avx512vnni
    // option, which the intrinsic needs (the target itself requires the
    // feature at run time).
    __m512i acc = s.raw;
    asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(w.raw), "vm"(x.raw));
    return hn::Vec<DS32>{acc};
  }
#elif HWY_TARGET == HWY_AVX2
  if constexpr (kVnni && hn::MaxLanes(DS32()) == 8) {
    // Written out for the same reason (no avxvnni option on this target);
    // called only where the CPU has the instruction (SmallMatmulBlocks).
    __m256i acc = s.raw;
    asm("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(w.raw), "xm"(x.raw));
    return hn::Vec<DS32>{acc};
  }
#endif
  return hn::ReorderWidenMulAccumulate(ds, w, x, s, t);
}

// Rows of x per pass over a weight row's blocks: 8 on x86 from AVX2 up
// (rows taken one after another on the TANDEM_BLOCK_PAIRS targets: only the
// accumulators stay live, which fit AVX2's 16 registers too; with every row's sums live
// at once AVX2 spilled from 4 rows on), 4 elsewhere. A verification step
// of 1 + 4 tokens then reads and decodes each block once, not twice.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
constexpr int64_t kBlockRows = 8;
#elif HWY_TARGET == HWY_SCALAR
constexpr int64_t kBlockRows = 1;  // vectors of one lane: Q4_1's minimum terms
#else
constexpr int64_t kBlockRows = 4;
#endif

// How far ahead of the block being multiplied its weight stream is
// prefetched (one hint per block: the stream crosses rows, and a batch-1
// decode step runs through the whole matrix row after row). Without it the
// batch-1 loop waited on each block's scale load: SmolLM2 Q8_0 decode at one
// thread on a Zen 5 core 5.1 -> 4.0 ms (1.3-1.5x -> 1.1-1.2x the read probe),
// Q4_1 4.4 -> 4.1 ms, the AVX2 target alike; 256 B to 4 KiB ahead helped
// less, 16 KiB as much (docs/benchmarks.md).
constexpr int64_t kBlocksPrefetchBytes = 8192;

// Weight bytes per chunk of SmallMatmulBlocks' passes over more rows of x
// than one pass takes. Matmul_blocks_benchmark's expert shapes (K = 2048 by
// 1536, 768 by 2048) at 16 rows on a Zen 5 core, GMAC/s one chunk of one
// weight row (the old order) / 16 KiB / 64 KiB / 256 KiB: AVX-512 Q4_1
// 62 / 86 / 92 / 93 (K = 2048), 84 / 89 / 89 / 89 (K = 768); 64 KiB on the
// AVX2 target: K = 2048 Q4_1 52 -> 59-61, Q8_0 63 -> 68.
constexpr int64_t kBlocksChunkBytes = 65536;

// out[r * ldo] = x_r . (one weight row of blocks) for the R (1..8) rows
// x_r (int16 quants xq + r * 32 * blocks, scales xs[r]; for Q4_1's
// minimum, x's f32 block sums, block-major: xsums[b * kBlockRows + r]):
// each block's quants are loaded once and multiplied by every row, so a
// step of 1 + k tokens (speculative verification) or a small decode batch
// reads and decodes the weights once. A row's arithmetic is the same
// whatever R is, so its result does not depend on the batch it was computed
// in. Separate variables, not arrays: Highway's scalable vectors (SVE)
// cannot be array elements.
template <DType kType, int R, bool kVnni>
HWY_INLINE void DotBlocksRows(const int16_t* xq, const float* xs, const float* xsums,
                              const uint8_t* src, int64_t blocks, float* out, int64_t ldo) {
  static_assert(R >= 1 && R <= 8);
  const DQ dq;
  const DS ds;
  const DSF dsf;
  const size_t N = hn::Lanes(dq);
  constexpr size_t kBytes = kBlockBytes<kType>;
  const int64_t stride = 32 * PaddedBlocks<kType>(blocks);  // between rows' quants
  // Where a Q4 block's quants start: after its f16 scale (and Q4_1's minimum).
  constexpr size_t kQuantsAt = kType == DType::kQ4_1 ? 4 : 2;
  const int16_t* q0 = xq;
  const int16_t* q1 = xq + (R > 1 ? 1 * stride : 0);
  const int16_t* q2 = xq + (R > 2 ? 2 * stride : 0);
  const int16_t* q3 = xq + (R > 3 ? 3 * stride : 0);
  const int16_t* q4 = xq + (R > 4 ? 4 * stride : 0);
  const int16_t* q5 = xq + (R > 5 ? 5 * stride : 0);
  const int16_t* q6 = xq + (R > 6 ? 6 * stride : 0);
  const int16_t* q7 = xq + (R > 7 ? 7 * stride : 0);
  // Blocks alone run two at a time: their scaled sums into p (a multiply,
  // then a multiply-add), then p into acc. One accumulator's chain of
  // multiply-adds per block (4 cycles each on a Zen 5 core) was the batch-1
  // loop's bound, not the weight stream; a second set of accumulators
  // instead spilled registers at 5-8 rows of x. Block pairs keep one chain
  // (one link a pair): p and acc for them spilled at 6-8 rows (batch 8 6%
  // slower than a block per vector, and 2-4% slower at batches 1 and 5).
  constexpr bool kSplit = kPairBlocks<kType> == 1;
  auto acc0 = hn::Zero(dsf), acc1 = acc0, acc2 = acc0, acc3 = acc0, acc4 = acc0, acc5 = acc0, acc6 = acc0, acc7 = acc0;
  auto p0 = acc0, p1 = acc0, p2 = acc0, p3 = acc0, p4 = acc0, p5 = acc0, p6 = acc0, p7 = acc0;
  // Q4_1's minimum terms, m * (x's block sum), for all R rows in one vector
  // (lane r: row r), in pairs as above: a scalar multiply-add per block and
  // row cost 10% of a 5-row step.
  const hn::CappedTag<float, kBlockRows> dm;
  auto minv = hn::Zero(dm), pm = minv;
  // On 16-lane targets a pair's minimum terms for 8 rows take one
  // multiply-add: lanes 0-7 the first block's minimum times rows 0-7's sums,
  // lanes 8-15 the second's (x's sums are block-major, so the pair's 16 are
  // adjacent), into one accumulator per unit of the loop's two; the halves
  // are added once, after the blocks. The broadcasts, the multiply and the
  // adds of the 8-lane form cost 3 more vector instructions a pair (SmolLM2
  // Q4_1 decode on an Intel Xeon, family 6 model 207: docs/benchmarks.md,
  // "Q4_1 minimums in one multiply-add").
  constexpr bool kMinPairs = kType == DType::kQ4_1 && kPairBlocks<kType> == 2 &&
                             hn::MaxLanes(DSF()) == 16 && kBlockRows == 8;
  [[maybe_unused]] auto mina = hn::Zero(dsf), minb = mina;
  // Sums of the products of w (elements [i, i + N)) with each row's x there.
  // sum1: the odd products on targets whose widening multiply keeps them
  // apart (RearrangeToOddPlusEven adds them back).
#define TANDEM_MUL_ROWS(w, o)                                                   \
  do {                                                                          \
    s0 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q0 + (o)), s0, t0);  \
    if constexpr (R > 1)                                                       \
      s1 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q1 + (o)), s1, t1); \
    if constexpr (R > 2)                                                       \
      s2 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q2 + (o)), s2, t2); \
    if constexpr (R > 3)                                                       \
      s3 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q3 + (o)), s3, t3); \
    if constexpr (R > 4)                                                       \
      s4 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q4 + (o)), s4, t4); \
    if constexpr (R > 5)                                                       \
      s5 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q5 + (o)), s5, t5); \
    if constexpr (R > 6)                                                       \
      s6 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q6 + (o)), s6, t6); \
    if constexpr (R > 7)                                                       \
      s7 = hn::ReorderWidenMulAccumulate(ds, w, hn::LoadU(dq, q7 + (o)), s7, t7); \
  } while (0)
  // A block's f16 scale (and Q4_1's minimum, the next two bytes: both
  // converted by one instruction where vectors have two lanes; batch-1 Q4_1
  // decode ~5% faster on a Zen 5 core).
  const auto scales = [](const uint8_t* src, float* scale, float* minimum) TANDEM_ALWAYS_INLINE {
    if constexpr (kType == DType::kQ4_1 && hn::MaxLanes(hn::CappedTag<float, 2>()) == 2) {
      const hn::CappedTag<float, 2> d2;
      const auto sm = hn::PromoteTo(
          d2, hn::LoadU(hn::Rebind<hwy::float16_t, decltype(d2)>(),
                        reinterpret_cast<const hwy::float16_t*>(src)));
      *scale = hn::GetLane(sm);
      *minimum = hn::ExtractLane(sm, 1);
    } else {
      *scale = BlockScale(src);
      if constexpr (kType == DType::kQ4_1) *minimum = BlockScale(src + 2);
    }
  };
  // One unit: block b at src (and with pairs, block b + 1 at src1), the
  // first or second of two: the loop below runs units in twos, so no branch
  // tells which.
  const auto block = [&](int64_t b, const uint8_t* src, const uint8_t* src1,
                         auto second) TANDEM_ALWAYS_INLINE {
    const int64_t o = b * 32;
    hwy::Prefetch(src + kBlocksPrefetchBytes);
    auto s0 = hn::Zero(ds), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    auto t0 = s0, t1 = s0, t2 = s0, t3 = s0, t4 = s0, t5 = s0, t6 = s0, t7 = s0;
    // The block's scale as a vector (with pairs, each block's in the half of
    // the lanes its sums are in), shared by the rows: x's scale is one per
    // row and multiplies the sum once, after the blocks. Q4_1: its minimum
    // in every lane of m0 (and the pair's second's in m1).
    hn::Vec<DSF> d;
    hn::Vec<decltype(dm)> m0, m1;
#if TANDEM_BLOCK_PAIRS
    if constexpr (kPairBlocks<kType> == 2) {
      // The two blocks' first four f16 (Q4_1: scale and minimum; Q4_0: the
      // scale and two quant bytes) in one broadcast and one conversion:
      // [d0 m0 d1 m1] in each 128-bit block (the lanes taken one at a time
      // and broadcast cost 12 instructions a pair, this 5).
      uint32_t first, second_block;
      std::memcpy(&first, src, 4);
      std::memcpy(&second_block, src1, 4);
      const hn::Rebind<hwy::float16_t, DSF> dh;
      const auto all = hn::PromoteTo(
          dsf, hn::BitCast(dh, hn::Set(hn::Repartition<uint64_t, decltype(dh)>(),
                                       first | uint64_t{second_block} << 32)));
      // Lane i takes block (i < half ? 0 : 1)'s scale: lane 0 or 2.
      alignas(64) static constexpr int32_t kScales16[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                                            2, 2, 2, 2, 2, 2, 2, 2};
      alignas(32) static constexpr int32_t kScales8[8] = {0, 0, 0, 0, 2, 2, 2, 2};
      d = hn::TableLookupLanes(
          all, hn::SetTableIndices(dsf, hn::MaxLanes(dsf) == 16 ? kScales16 : kScales8));
      if constexpr (kMinPairs) {
        alignas(64) static constexpr int32_t kMins16[16] = {1, 1, 1, 1, 1, 1, 1, 1,
                                                            3, 3, 3, 3, 3, 3, 3, 3};
        const auto m = hn::TableLookupLanes(all, hn::SetTableIndices(dsf, kMins16));
        auto& acc = decltype(second)::value ? minb : mina;
        acc = hn::MulAdd(m, hn::LoadU(dsf, xsums + b * kBlockRows), acc);
      } else if constexpr (kType == DType::kQ4_1) {
        m0 = BroadcastLane<1>(dm, all);
        m1 = BroadcastLane<3>(dm, all);
      }
    } else  // NOLINT(readability/braces): one block
#endif
    {
      float scale, minimum = 0.f;
      scales(src, &scale, &minimum);
      d = hn::Set(dsf, scale);
      m0 = hn::Set(dm, minimum);
    }
    const auto sum = [&](auto s, auto t) { return hn::ConvertTo(dsf, hn::RearrangeToOddPlusEven(s, t)); };
    // Blocks alone: the first of two p = its scaled sums; the second p +=
    // its scaled sums, then acc += p. Pairs: acc += their scaled sums.
    constexpr bool kSecond = decltype(second)::value;
    if constexpr (kType == DType::kQ4_1 && !kMinPairs) {
      // The first unit's terms into pm, the second's added to them, then pm
      // into minv. A pair's two terms: their own chain (one through both
      // units' four bounded the batch-1 loop).
      auto terms = hn::Mul(m0, hn::LoadU(dm, xsums + b * kBlockRows));
      if constexpr (kPairBlocks<kType> == 2) {
        terms = hn::MulAdd(m1, hn::LoadU(dm, xsums + (b + 1) * kBlockRows), terms);
        if constexpr (kSecond) {
          minv = hn::Add(minv, hn::Add(pm, terms));
        } else {
          pm = terms;
        }
      } else if constexpr (kSecond) {
        pm = hn::MulAdd(m0, hn::LoadU(dm, xsums + b * kBlockRows), pm);
        minv = hn::Add(minv, pm);
      } else {
        pm = terms;
      }
    }
#define TANDEM_ACCUMULATE(r)                                                         \
  if constexpr (R > r) {                                                             \
    if constexpr (!kSplit) {                                                         \
      acc##r = hn::MulAdd(sum(s##r, t##r), d, acc##r);                               \
    } else if constexpr (kSecond) {                                                  \
      p##r = hn::MulAdd(sum(s##r, t##r), d, p##r);                                   \
      acc##r = hn::Add(acc##r, p##r);                                                \
    } else {                                                                         \
      p##r = hn::Mul(sum(s##r, t##r), d);                                            \
    }                                                                                \
  }
#if TANDEM_BLOCK_PAIRS  // and rows of x apart
    // The unit's quants: one, two or four vectors (wa, wb at x's offsets oa,
    // ob; AVX2's pairs also wc, wd at o + 32, o + 48).
    hn::Vec<DQ> wa, wb, wc, wd;
    size_t oa = o, ob = o + N;
    constexpr bool kTwo =
        !(kType == DType::kQ8_0 && kPairBlocks<kType> == 1 && hn::MaxLanes(DQ()) == 32);
    constexpr bool kFour = kPairBlocks<kType> == 2 && hn::MaxLanes(DQ()) == 16;
    if constexpr (kFour) {
      // AVX2: both blocks' 16 bytes in one vector, each 128-bit half
      // widened by interleaving with zeros: [block 0's 8 | block 1's 8].
      const hn::Repartition<uint8_t, DQ> d8;
      const hn::Half<decltype(d8)> d8h;
      const auto bytes =
          hn::Combine(d8, hn::LoadU(d8h, src1 + kQuantsAt), hn::LoadU(d8h, src + kQuantsAt));
      const auto lo = hn::And(bytes, hn::Set(d8, 0xF));
      const auto hi = hn::ShiftRight<4>(bytes);
      const auto zero = hn::Zero(d8);
      wa = hn::BitCast(dq, hn::InterleaveLower(d8, lo, zero));  // elements 0-7
      wb = hn::BitCast(dq, hn::InterleaveUpper(d8, lo, zero));  // 8-15
      wc = hn::BitCast(dq, hn::InterleaveLower(d8, hi, zero));  // 16-23
      wd = hn::BitCast(dq, hn::InterleaveUpper(d8, hi, zero));  // 24-31
      if constexpr (kType == DType::kQ4_0) {  // centred at 8
        wc = hn::Sub(wc, hn::Set(dq, 8));
        wd = hn::Sub(wd, hn::Set(dq, 8));
      }
    } else if constexpr (kType == DType::kQ8_0 && kPairBlocks<kType> == 2) {
      // Elements 0-15 of both blocks in one vector, 16-31 in the next.
      const hn::Rebind<int8_t, DQ> d8;
      const hn::Half<decltype(d8)> d8h;
      const int8_t* q0 = reinterpret_cast<const int8_t*>(src + 2);
      const int8_t* q1 = reinterpret_cast<const int8_t*>(src1 + 2);
      wa = hn::PromoteTo(dq, hn::Combine(d8, hn::LoadU(d8h, q1), hn::LoadU(d8h, q0)));
      wb = hn::PromoteTo(dq, hn::Combine(d8, hn::LoadU(d8h, q1 + 16), hn::LoadU(d8h, q0 + 16)));
      ob = o + 32;
    } else if constexpr (kPairBlocks<kType> == 2) {
      // Both blocks' 16 bytes widened into one vector: low nibbles, then
      // high ones.
      const hn::Rebind<uint8_t, DQ> d8;
      const hn::Half<decltype(d8)> d8h;
      const auto bytes =
          hn::PromoteTo(dq, hn::Combine(d8, hn::LoadU(d8h, src1 + kQuantsAt),
                                        hn::LoadU(d8h, src + kQuantsAt)));
      wa = hn::And(bytes, hn::Set(dq, 0xF));
      wb = hn::ShiftRight<4>(bytes);
      ob = o + 32;
    } else if constexpr (kType == DType::kQ8_0) {
      const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
      wa = hn::PromoteTo(dq, hn::LoadU(hn::Rebind<int8_t, DQ>(), q));
      if constexpr (kTwo) wb = hn::PromoteTo(dq, hn::LoadU(hn::Rebind<int8_t, DQ>(), q + N));
    } else {  // a Q4 block alone: 16 lanes
      const auto bytes = hn::PromoteTo(dq, hn::LoadU(hn::Rebind<uint8_t, DQ>(), src + kQuantsAt));
      wa = hn::And(bytes, hn::Set(dq, 0xF));
      wb = hn::ShiftRight<4>(bytes);
    }
    if constexpr (kType == DType::kQ4_0) {  // centred at 8
      wa = hn::Sub(wa, hn::Set(dq, 8));
      wb = hn::Sub(wb, hn::Set(dq, 8));
    }
    // Each row's multiply-adds, then its accumulation, before the next
    // row's: one row's sums live at a time, not R (same integer sums, so
    // the same bits as all rows' products first).
#define TANDEM_ROW(r)                                                                  \
  if constexpr (R > r) {                                                               \
    s##r = MulAddPairs<kVnni>(ds, wa, hn::LoadU(dq, q##r + oa), s##r, t##r);           \
    if constexpr (kTwo) {                                                              \
      s##r = MulAddPairs<kVnni>(ds, wb, hn::LoadU(dq, q##r + ob), s##r, t##r);         \
    }                                                                                  \
    if constexpr (kFour) {                                                             \
      s##r = MulAddPairs<kVnni>(ds, wc, hn::LoadU(dq, q##r + o + 32), s##r, t##r);     \
      s##r = MulAddPairs<kVnni>(ds, wd, hn::LoadU(dq, q##r + o + 48), s##r, t##r);     \
    }                                                                                  \
  }                                                                                    \
  TANDEM_ACCUMULATE(r)
    TANDEM_ROW(0) TANDEM_ROW(1) TANDEM_ROW(2) TANDEM_ROW(3)
    TANDEM_ROW(4) TANDEM_ROW(5) TANDEM_ROW(6) TANDEM_ROW(7)
#undef TANDEM_ROW
#else
    if constexpr (kType == DType::kQ8_0) {
      const int8_t* q = reinterpret_cast<const int8_t*>(src + 2);
      for (size_t i = 0; i < 32; i += N) {
        const auto w = hn::PromoteTo(dq, hn::LoadU(hn::Rebind<int8_t, DQ>(), q + i));
        TANDEM_MUL_ROWS(w, o + i);
      }
    } else {
      const uint8_t* q = src + kQuantsAt;
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
    }
    TANDEM_ACCUMULATE(0) TANDEM_ACCUMULATE(1) TANDEM_ACCUMULATE(2) TANDEM_ACCUMULATE(3)
    TANDEM_ACCUMULATE(4) TANDEM_ACCUMULATE(5) TANDEM_ACCUMULATE(6) TANDEM_ACCUMULATE(7)
#endif
#undef TANDEM_ACCUMULATE
  };
  // An odd count's last block pairs with this one: zero quants and scales.
  static constexpr uint8_t kZeroBlock[kBlockBytes<DType::kQ8_0>] = {};
  constexpr int64_t kUnit = kPairBlocks<kType>;
  int64_t b = 0;
  for (; b + 2 * kUnit <= blocks; b += 2 * kUnit, src += 2 * kUnit * kBytes) {
    block(b, src, src + kBytes, std::false_type());
    block(b + kUnit, src + kUnit * kBytes, src + (kUnit + 1) * kBytes, std::true_type());
  }
  for (; b < blocks; b += kUnit, src += kUnit * kBytes) {  // the last unit or two, alone
    block(b, src, b + 1 < blocks ? src + kBytes : kZeroBlock, std::false_type());
#define TANDEM_FLUSH(r) \
  if constexpr (R > r) acc##r = hn::Add(acc##r, p##r);
    TANDEM_FLUSH(0) TANDEM_FLUSH(1) TANDEM_FLUSH(2) TANDEM_FLUSH(3)
    TANDEM_FLUSH(4) TANDEM_FLUSH(5) TANDEM_FLUSH(6) TANDEM_FLUSH(7)
#undef TANDEM_FLUSH
    minv = hn::Add(minv, pm);
  }
#undef TANDEM_MUL_ROWS
  // Q4_1: lane r, row r's minimum term (the first kBlockRows of 8 used; 8,
  // the rows the macros below name, whatever the target).
  HWY_ALIGN float mins[8] = {};  // zeroed: GCC cannot tell only Q4_1 reads it
#if TANDEM_BLOCK_PAIRS  // kMinPairs' targets (UpperHalf: not on every target)
  if constexpr (kMinPairs) {
    const auto both = hn::Add(mina, minb);
    const hn::Half<DSF> dh;
    hn::Store(hn::Add(hn::LowerHalf(dh, both), hn::UpperHalf(dh, both)), dh, mins);
  } else  // NOLINT(readability/braces)
#endif
  if constexpr (kType == DType::kQ4_1) {
    hn::Store(minv, dm, mins);
  }
#define TANDEM_ROW_OUT(r)                                                        \
  if constexpr (R > r) {                                                         \
    if constexpr (kType == DType::kQ4_1) {                                       \
      out[r * ldo] = hn::GetLane(hn::SumOfLanes(dsf, acc##r)) * xs[r] + mins[r]; \
    } else {                                                                     \
      out[r * ldo] = hn::GetLane(hn::SumOfLanes(dsf, acc##r)) * xs[r];           \
    }                                                                            \
  }
  TANDEM_ROW_OUT(0) TANDEM_ROW_OUT(1) TANDEM_ROW_OUT(2) TANDEM_ROW_OUT(3)
  TANDEM_ROW_OUT(4) TANDEM_ROW_OUT(5) TANDEM_ROW_OUT(6) TANDEM_ROW_OUT(7)
#undef TANDEM_ROW_OUT
}

// Weight rows [j0, j1) of blocks times the n rows of a, kBlockRows at a time.
// scratch: x's int16 quants (n * PaddedBlocks * 16 floats' room), its scale
// per row (n floats), its block sums (n + 8 rows of PaddedBlocks: groups of
// kBlockRows rows, then one row's).
template <DType kType, bool kVnni>
HWY_INLINE void SmallMatmulBlocks(const float* a, int64_t lda, int64_t n, const uint8_t* w,
                                  int64_t k, int64_t j0, int64_t j1, float* c, int64_t ldc,
                                  float* scratch) {
  const int64_t blocks = k / 32;
  const int64_t padded = PaddedBlocks<kType>(blocks);
  const size_t row_bytes = static_cast<size_t>(blocks) * kBlockBytes<kType>;
  int16_t* xq = reinterpret_cast<int16_t*>(scratch);
  float* xs = scratch + n * padded * 16;
  // Q4_1: x's block sums, block-major in groups of kBlockRows rows (zero
  // past row n and past the last block), from a row's sums at `row_sums`.
  float* sums = xs + n;
  const int64_t groups = (n + kBlockRows - 1) / kBlockRows;
  float* row_sums = sums + groups * kBlockRows * padded;
  for (int64_t r = 0; r < n; ++r) {
    QuantizeRowI16<kType>(a + r * lda, blocks, xq + r * padded * 32, xs + r);
  }
  if constexpr (kType == DType::kQ4_1) {
    std::fill(sums, row_sums, 0.f);
    for (int64_t r = 0; r < n; ++r) {
      BlockSums(a + r * lda, blocks, row_sums);
      float* group = sums + (r / kBlockRows) * kBlockRows * padded;
      for (int64_t b = 0; b < blocks; ++b) group[b * kBlockRows + r % kBlockRows] = row_sums[b];
    }
  }
  // Weight rows [j0, j1) times R rows of x from row r: the row count chosen
  // once, outside the loop over weight rows (a choice per weight row, with
  // every count's loop inlined in one function, cost batch-1 decode 4% on
  // the AVX2 target).
  const auto rows = [&](int64_t r, int64_t ja, int64_t jb, auto count) HWY_NOINLINE {
    constexpr int kRows = decltype(count)::value;
    const int16_t* q = xq + r * padded * 32;
    const float* m = sums + r * padded;  // r's group (r: a multiple of kBlockRows)
    for (int64_t j = ja; j < jb; ++j) {
      DotBlocksRows<kType, kRows, kVnni>(q, xs + r, m, w + j * row_bytes, blocks,
                                         c + r * ldc + j, ldc);
    }
  };
  // `rows` is not inlined: its one copy of each row count's loop serves both
  // calls of `dispatch` below (inlined twice, the file took clang twice as
  // long to compile).
  using I = std::integral_constant<int, 1>;  // for the counts a target has not
  const auto dispatch = [&](int64_t r, int64_t ja, int64_t jb) TANDEM_ALWAYS_INLINE {
    switch (std::min<int64_t>(kBlockRows, n - r)) {
      case 8: return rows(r, ja, jb, std::conditional_t<kBlockRows == 8, std::integral_constant<int, 8>, I>());
      case 7: return rows(r, ja, jb, std::conditional_t<kBlockRows == 8, std::integral_constant<int, 7>, I>());
      case 6: return rows(r, ja, jb, std::conditional_t<kBlockRows == 8, std::integral_constant<int, 6>, I>());
      case 5: return rows(r, ja, jb, std::conditional_t<kBlockRows == 8, std::integral_constant<int, 5>, I>());
      case 4: return rows(r, ja, jb, std::integral_constant<int, 4>());
      case 3: return rows(r, ja, jb, std::integral_constant<int, 3>());
      case 2: return rows(r, ja, jb, std::integral_constant<int, 2>());
      default: return rows(r, ja, jb, I());
    }
  };
  if (n <= kBlockRows) return dispatch(0, j0, j1);
  // More rows than a pass takes: kBlocksChunkBytes of weight rows at a time
  // (they stay in L2), each group of kBlockRows rows of x over all of them,
  // so that a group's quants stay in L1 (8 rows of K = 2048: 32 KiB). Each
  // weight row once for all groups, as before, streamed the quants of every
  // group past L1 for each weight row: 16 rows of x by one expert of
  // Qwen3-30B-A3B (K = 2048) ran at half the rate of 8 rows.
  const int64_t chunk = std::max<int64_t>(1, kBlocksChunkBytes / static_cast<int64_t>(row_bytes));
  for (int64_t jc = j0; jc < j1; jc += chunk) {
    const int64_t je = std::min(j1, jc + chunk);
    for (int64_t r = 0; r < n; r += kBlockRows) dispatch(r, jc, je);
  }
}

// f32 and bf16 weights (bf16: the top half of an f32, widened in registers
// exactly).
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

// The first `count` (< Lanes) weights, the other lanes zero.
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

// Register tiles are R rows by C vectors of accumulators, R <= kTileRows,
// C <= 4. x86 below AVX-512 has 16 vector registers: 2 x 4 accumulators, 4
// weight vectors and one of x fit; AVX-512, NEON and SVE have 32: 4 x 4.
#if HWY_ARCH_X86 && HWY_TARGET >= HWY_AVX2
constexpr int kTileRows = 2;
#else
constexpr int kTileRows = 4;
#endif

#if HWY_TARGET != HWY_SCALAR
// Halves v until 4 lanes are left (adding the halves), and stores those.
template <class D>
HWY_INLINE void StoreFolded(D d, hn::Vec<D> v, float* out) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    StoreFolded(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out);
  } else {
    hn::StoreU(v, d, out);
  }
}
#endif

// out[i] = the sum of v_i's lanes for i < count (<= 4): on targets of
// 128-bit blocks, a transposing tree (two rounds of interleaves and adds,
// then the blocks folded) instead of four reductions of a dependent chain
// each. Lane i's sum is the same tree whatever the other vectors hold, so a
// weight row's result does not depend on the tile it was computed in.
HWY_INLINE void StoreSums4(hn::Vec<DV> v0, hn::Vec<DV> v1, hn::Vec<DV> v2, hn::Vec<DV> v3,
                           float* out, int count) {
  const DV d;
#if HWY_HAVE_SCALABLE || HWY_TARGET == HWY_SCALAR
  out[0] = hn::GetLane(hn::SumOfLanes(d, v0));
  if (count > 1) out[1] = hn::GetLane(hn::SumOfLanes(d, v1));
  if (count > 2) out[2] = hn::GetLane(hn::SumOfLanes(d, v2));
  if (count > 3) out[3] = hn::GetLane(hn::SumOfLanes(d, v3));
#else
  // Per block: [a0 + a2, b0 + b2, a1 + a3, b1 + b3], then as 64-bit pairs
  // [a, b, c, d].
  const hn::Repartition<uint64_t, DV> du;
  const auto t0 = hn::BitCast(du, hn::Add(hn::InterleaveLower(d, v0, v1),
                                          hn::InterleaveUpper(d, v0, v1)));
  const auto t1 = hn::BitCast(du, hn::Add(hn::InterleaveLower(d, v2, v3),
                                          hn::InterleaveUpper(d, v2, v3)));
  const auto u = hn::Add(hn::BitCast(d, hn::InterleaveLower(du, t0, t1)),
                         hn::BitCast(d, hn::InterleaveUpper(du, t0, t1)));
  if (count == 4) return StoreFolded(d, u, out);
  alignas(16) float sums[4];
  StoreFolded(d, u, sums);
  for (int i = 0; i < count; ++i) out[i] = sums[i];
#endif
}

// The 16 accumulators a<r><c> of an R x C tile (R, C <= 4), zero: separate
// variables, not an array, because Highway's scalable vectors (SVE) cannot be
// array elements; the unused ones cost nothing.
#define TANDEM_TILE_ACCUMULATORS(d)                                                           \
  auto a00 = hn::Zero(d), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00, \
       a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, \
       a33 = a00

// One k-step of an R x C tile: C weight vectors (rows K apart, from element
// k) times R vectors of x (rows ldx apart), into a<r><c>.
#define TANDEM_TILE_ROW(r, XP)                                           \
  do {                                                                   \
    const auto xv = hn::LoadU(d, (XP));                                  \
    a##r##0 = hn::MulAdd(xv, w0, a##r##0);                               \
    if constexpr (C > 1) a##r##1 = hn::MulAdd(xv, w1, a##r##1);          \
    if constexpr (C > 2) a##r##2 = hn::MulAdd(xv, w2, a##r##2);          \
    if constexpr (C > 3) a##r##3 = hn::MulAdd(xv, w3, a##r##3);          \
  } while (0)
#define TANDEM_TILE_STEP(XP, LDX, WP, KW, KK)                            \
  do {                                                                   \
    const auto w0 = LoadWeights(d, (WP) + (KK));                         \
    const auto w1 = C > 1 ? LoadWeights(d, (WP) + (KW) + (KK)) : w0;     \
    const auto w2 = C > 2 ? LoadWeights(d, (WP) + 2 * (KW) + (KK)) : w0; \
    const auto w3 = C > 3 ? LoadWeights(d, (WP) + 3 * (KW) + (KK)) : w0; \
    TANDEM_TILE_ROW(0, (XP) + (KK));                                     \
    if constexpr (R > 1) TANDEM_TILE_ROW(1, (XP) + (LDX) + (KK));        \
    if constexpr (R > 2) TANDEM_TILE_ROW(2, (XP) + 2 * (LDX) + (KK));    \
    if constexpr (R > 3) TANDEM_TILE_ROW(3, (XP) + 3 * (LDX) + (KK));    \
  } while (0)

// out[r * ldo + c] = x_r . w_c for R rows of x and C weight rows (W: f32 or
// bf16 bits), accumulated in registers: each weight vector is loaded once
// per k-step for all R rows, each x vector once for all C weight rows. With
// `next` (the following C weight rows), prefetches one cache line of each
// per line consumed, so they arrive while this tile computes.
template <int R, int C, typename W>
HWY_INLINE void Tile(const float* x, int64_t ldx, const W* w, int64_t K, float* out, int64_t ldo,
                     const W* next) {
  static_assert(R >= 1 && R <= 4 && C >= 1 && C <= 4);
  const DV d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  TANDEM_TILE_ACCUMULATORS(d);
  constexpr int64_t kLine = 64 / sizeof(W);  // weights per cache line
  int64_t k = 0;
  for (; k + N <= K; k += N) {
    if (next != nullptr && k % kLine == 0) {
      hwy::Prefetch(next + k);
      if constexpr (C > 1) hwy::Prefetch(next + K + k);
      if constexpr (C > 2) hwy::Prefetch(next + 2 * K + k);
      if constexpr (C > 3) hwy::Prefetch(next + 3 * K + k);
    }
    TANDEM_TILE_STEP(x, ldx, w, K, k);
  }
  if (k < K) {
    // The last K - k elements, zero-padded to a vector, through the same
    // step (as many products as a full one; the padding adds zeros).
    constexpr size_t kMax = HWY_MAX_BYTES / sizeof(float);
    alignas(64) float xt[4 * kMax] = {};
    alignas(64) W wt[4 * kMax] = {};
    const size_t left = static_cast<size_t>(K - k);
    for (int r = 0; r < R; ++r) std::memcpy(xt + r * N, x + r * ldx + k, left * sizeof(float));
    for (int c = 0; c < C; ++c) std::memcpy(wt + c * N, w + c * K + k, left * sizeof(W));
    TANDEM_TILE_STEP(xt, N, wt, N, 0);
  }
  StoreSums4(a00, a01, a02, a03, out, C);
  if constexpr (R > 1) StoreSums4(a10, a11, a12, a13, out + ldo, C);
  if constexpr (R > 2) StoreSums4(a20, a21, a22, a23, out + 2 * ldo, C);
  if constexpr (R > 3) StoreSums4(a30, a31, a32, a33, out + 3 * ldo, C);
}
#undef TANDEM_TILE_STEP

// All n rows of x against C weight rows: kTileRows at a time, then fewer.
// The first group prefetches `next`.
template <int C, typename W>
HWY_INLINE void Columns(const float* x, int64_t ldx, int64_t n, const W* w, int64_t K,
                        float* out, int64_t ldo, const W* next) {
  int64_t i = 0;
  for (; i + kTileRows <= n; i += kTileRows) {
    Tile<kTileRows, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo, i == 0 ? next : nullptr);
  }
  if constexpr (kTileRows > 2) {
    for (; i + 2 <= n; i += 2) {
      Tile<2, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo, i == 0 ? next : nullptr);
    }
  }
  for (; i < n; ++i) Tile<1, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo, i == 0 ? next : nullptr);
}

// out[i, j] = x_i . w_j for i < n, j in [j0, j1), tile group by tile group
// (ForEachTileGroup); each group of 4 weight rows prefetches the next.
// Up to a tile's rows of x (4 on AVX-512, 2 on AVX2) against f32 weights on
// targets of 8 lanes or more: the weight rows one at a time, a single
// sequential stream through the matrix (its rows are contiguous), instead of
// four rows' streams side by side. SmolLM2 f32 decode on a 2-vCPU AMD EPYC
// (family 26 model 2, Zen 5; avx2, avx512f), medians of 5 interleaved runs:
// batch 1 16.3 -> 14.5 ms at 1 thread (1.18x -> 1.03x the weight-read
// probe), 9.53 -> 8.92 ms at 2; batches 2 and 4 17.1 -> 14.7 and 18.9 -> 15.9
// ms at 1; the AVX2 target batch 1 16.9 -> 16.0. Each row prefetches the
// next (without: 2-6% slower at 1 and 2 threads). Two weight rows side by side were 1.2x slower than one; more rows of x than
// a tile holds (a row's tile repeated, each a chain of multiply-adds) were
// slower than the 4 x 4 tiles (batch 5 21.7 -> 29.9 ms). The same products in
// the same order as a tile's column (one accumulator per row, then the same
// lane sum), so the same bits. bf16 weights keep the tiles: a row's chain of
// multiply-adds then moves 32 bytes of weights per multiply-add latency, no
// faster than four rows side by side (batch 1 8.1 -> 8.5-8.6 ms); so do
// 4-lane targets (SSE4, NEON), where an f32 row's chain would move 16.
template <typename W>
HWY_INLINE void MatmulTiles(const float* x, int64_t ldx, int64_t n, const W* w, int64_t K,
                            int64_t j0, int64_t j1, float* out, int64_t ldo) {
  if (n <= kTileRows && sizeof(W) == 4 && hn::Lanes(DV()) >= 8) {
    for (int64_t j = j0; j < j1; ++j) {
      const W* next = j + 1 < j1 ? w + (j + 1) * K : nullptr;
      Columns<1>(x, ldx, n, w + j * K, K, out + j, ldo, next);
    }
    return;
  }
  ForEachTileGroup(n, j0, j1, [&](int64_t i0, int64_t rows, int64_t j, int c) {
    const float* xb = x + i0 * ldx;
    float* ob = out + i0 * ldo + j;
    if (c == 1) return Columns<1>(xb, ldx, rows, w + j * K, K, ob, ldo, static_cast<const W*>(nullptr));
    const W* next = j + 8 <= j1 ? w + (j + 4) * K : nullptr;
    Columns<4>(xb, ldx, rows, w + j * K, K, ob, ldo, next);
  });
}

void MatmulF32Impl(const float* x, int64_t ldx, int64_t n, const float* w, int64_t K, int64_t j0,
                   int64_t j1, float* out, int64_t ldo) {
  MatmulTiles(x, ldx, n, w, K, j0, j1, out, ldo);
}

void MatmulBf16Impl(const float* x, int64_t ldx, int64_t n, const uint16_t* w, int64_t K,
                    int64_t j0, int64_t j1, float* out, int64_t ldo) {
  MatmulTiles(x, ldx, n, w, K, j0, j1, out, ldo);
}

// Where BroadcastTile finds row k of b: `ld` elements apart, or (decode
// attention, reading the cache in place) at base + off[k]; f32 or bf16 bits.
template <typename W>
struct StridedRows {
  const W* b;
  int64_t ld;
  const W* operator()(int64_t k) const { return b + k * ld; }
};
template <typename W>
struct OffsetRows {
  const W* base;
  const int64_t* off;
  const W* operator()(int64_t k) const { return base + off[k]; }
};

#define TANDEM_BCAST_ROW(r)                                              \
  do {                                                                   \
    const auto av = hn::Set(d, a[(r) * lda + k]);                        \
    a##r##0 = hn::MulAdd(av, b0, a##r##0);                               \
    if constexpr (C > 1) a##r##1 = hn::MulAdd(av, b1, a##r##1);          \
    if constexpr (C > 2) a##r##2 = hn::MulAdd(av, b2, a##r##2);          \
    if constexpr (C > 3) a##r##3 = hn::MulAdd(av, b3, a##r##3);          \
  } while (0)
#define TANDEM_BCAST_STORE(r, c)                                         \
  do {                                                                   \
    auto v = hn::Mul(a##r##c, sv);                                       \
    float* o = out + (r) * ldo + (c) * N;                                \
    if (c == C - 1 && last < static_cast<size_t>(N)) {                   \
      const auto m = hn::FirstN(d, last);                                \
      if (add) v = hn::Add(v, TailLoad(m, d, o));                        \
      TailStore(v, m, d, o);                                             \
    } else {                                                             \
      if (add) v = hn::Add(v, hn::LoadU(d, o));                          \
      hn::StoreU(v, d, o);                                               \
    }                                                                    \
  } while (0)
#define TANDEM_BCAST_STORE_ROW(r)                                        \
  do {                                                                   \
    TANDEM_BCAST_STORE(r, 0);                                            \
    if constexpr (C > 1) TANDEM_BCAST_STORE(r, 1);                       \
    if constexpr (C > 2) TANDEM_BCAST_STORE(r, 2);                       \
    if constexpr (C > 3) TANDEM_BCAST_STORE(r, 3);                       \
  } while (0)

// out[r, :C vectors] = scale * sum_k a[r, k] * b_k[col, + C vectors) for
// r < R, k < inner (a rows `lda` apart, b_k = rows(k) + col): each b vector
// is loaded once per k and each a[r, k] broadcast into C FMAs (the outer
// product form: nothing to reduce at the end). The last vector holds `last`
// lanes (<= Lanes; loads and stores of it partial). `add`: out += instead.
template <int R, int C, typename Rows>
HWY_INLINE void BroadcastTile(const float* a, int64_t lda, int64_t inner, Rows rows, int64_t col,
                              size_t last, float scale, bool add, float* out, int64_t ldo) {
  static_assert(R >= 1 && R <= 4 && C >= 1 && C <= 4);
  const DV d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  TANDEM_TILE_ACCUMULATORS(d);
  const bool partial = last < static_cast<size_t>(N);
  const auto load = [&](const auto* p, int c) {
    return c == C - 1 && partial ? LoadWeightsN(d, p + c * N, last) : LoadWeights(d, p + c * N);
  };
  for (int64_t k = 0; k < inner; ++k) {
    const auto* b = rows(k) + col;
    const auto b0 = load(b, 0);
    const auto b1 = C > 1 ? load(b, 1) : b0;
    const auto b2 = C > 2 ? load(b, 2) : b0;
    const auto b3 = C > 3 ? load(b, 3) : b0;
    TANDEM_BCAST_ROW(0);
    if constexpr (R > 1) TANDEM_BCAST_ROW(1);
    if constexpr (R > 2) TANDEM_BCAST_ROW(2);
    if constexpr (R > 3) TANDEM_BCAST_ROW(3);
  }
  const auto sv = hn::Set(d, scale);
  TANDEM_BCAST_STORE_ROW(0);
  if constexpr (R > 1) TANDEM_BCAST_STORE_ROW(1);
  if constexpr (R > 2) TANDEM_BCAST_STORE_ROW(2);
  if constexpr (R > 3) TANDEM_BCAST_STORE_ROW(3);
}
#undef TANDEM_BCAST_ROW
#undef TANDEM_BCAST_STORE
#undef TANDEM_BCAST_STORE_ROW
#undef TANDEM_TILE_ROW
#undef TANDEM_TILE_ACCUMULATORS

// One column group (C vectors from `col`, the last of `last` lanes) over all
// rows: kTileRows at a time, then one by one.
template <int C, typename Rows>
HWY_INLINE void BroadcastColumns(const float* a, int64_t lda, int64_t nrows, int64_t inner,
                                 Rows rows, int64_t col, size_t last, float scale, bool add,
                                 float* out, int64_t ldo) {
  int64_t r = 0;
  for (; r + kTileRows <= nrows; r += kTileRows) {
    BroadcastTile<kTileRows, C>(a + r * lda, lda, inner, rows, col, last, scale, add,
                                out + r * ldo + col, ldo);
  }
  for (; r < nrows; ++r) {
    BroadcastTile<1, C>(a + r * lda, lda, inner, rows, col, last, scale, add, out + r * ldo + col,
                        ldo);
  }
}

// out[r, :ncols] = scale * sum_k a[r, k] * b_k[:ncols] for r < nrows (out +=
// that with `add`), in column groups of 4 vectors, then single vectors, then
// a partial one.
template <typename Rows>
HWY_INLINE void BroadcastProduct(const float* a, int64_t lda, int64_t nrows, int64_t inner,
                                 Rows rows, int64_t ncols, float scale, float* out, int64_t ldo,
                                 bool add = false) {
  const DV d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t col = 0;
  for (; col + 4 * N <= ncols; col += 4 * N) {
    BroadcastColumns<4>(a, lda, nrows, inner, rows, col, N, scale, add, out, ldo);
  }
  for (; col + N <= ncols; col += N) {
    BroadcastColumns<1>(a, lda, nrows, inner, rows, col, N, scale, add, out, ldo);
  }
  if (col < ncols) {
    BroadcastColumns<1>(a, lda, nrows, inner, rows, col, static_cast<size_t>(ncols - col), scale,
                        add, out, ldo);
  }
}

// Attention's first product with K transposed (keys along the columns): the
// column groups outer, so hd x 4 vectors of keys stay in L1 while every
// query row passes.
void AttentionScoresImpl(const float* q, int64_t ldq, int64_t rows, const float* kt, int64_t ldkt,
                         int64_t ctx, int hd, float scale, float* s, int64_t lds) {
  BroadcastProduct(q, ldq, rows, hd, StridedRows<float>{kt, ldkt}, ctx, scale, s, lds);
}

void AttentionPvImpl(const float* p, int64_t ldp, int64_t rows, const float* v, int64_t ctx,
                     int hd, float* out, int64_t ldo) {
  BroadcastProduct(p, ldp, rows, ctx, StridedRows<float>{v, hd}, hd, 1.f, out, ldo);
}

void AddProductBf16Impl(const float* a, int64_t lda, int64_t nrows, int64_t inner,
                        const uint16_t* b, int64_t ldb, int64_t ncols, float* out, int64_t ldo) {
  BroadcastProduct(a, lda, nrows, inner, StridedRows<uint16_t>{b, ldb}, ncols, 1.f, out, ldo,
                   /*add=*/true);
}

// s[j] = scale * (q . key j) for j < ctx, key j's row at k + off[j]: four
// keys at a time, their products summed by StoreSums4 (one key alone takes
// the same tree, so every score is the same bits).
template <typename W>
HWY_INLINE void DecodeScores(const float* q, int hd, const W* k, const int64_t* off, int64_t ctx,
                             float scale, float* s) {
  const DV d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t full = hd - hd % N;
  const size_t left = static_cast<size_t>(hd - full);
  int64_t j = 0;
  for (; j < ctx; j += 4) {
    const int keys = static_cast<int>(std::min<int64_t>(4, ctx - j));
    const W* k0 = k + off[j];
    const W* k1 = keys > 1 ? k + off[j + 1] : k0;
    const W* k2 = keys > 2 ? k + off[j + 2] : k0;
    const W* k3 = keys > 3 ? k + off[j + 3] : k0;
    auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = 0; i < full; i += N) {
      const auto qv = hn::LoadU(d, q + i);
      s0 = hn::MulAdd(qv, LoadWeights(d, k0 + i), s0);
      s1 = hn::MulAdd(qv, LoadWeights(d, k1 + i), s1);
      s2 = hn::MulAdd(qv, LoadWeights(d, k2 + i), s2);
      s3 = hn::MulAdd(qv, LoadWeights(d, k3 + i), s3);
    }
    if (left > 0) {
      const auto qv = TailLoad(hn::FirstN(d, left), d, q + full);
      s0 = hn::MulAdd(qv, LoadWeightsN(d, k0 + full, left), s0);
      s1 = hn::MulAdd(qv, LoadWeightsN(d, k1 + full, left), s1);
      s2 = hn::MulAdd(qv, LoadWeightsN(d, k2 + full, left), s2);
      s3 = hn::MulAdd(qv, LoadWeightsN(d, k3 + full, left), s3);
    }
    StoreSums4(s0, s1, s2, s3, s + j, keys);
    for (int i = 0; i < keys; ++i) s[j + i] *= scale;
  }
}

// One token's query heads of one KV group (rows heads, q and out rows hd
// apart) over ctx keys read in place from the cache.
template <typename W>
HWY_INLINE void AttentionDecodeRows(const float* q, int rows, int hd, const W* k, const W* v,
                                    const int64_t* off, int64_t ctx, float scale, float* s,
                                    float* out) {
  for (int r = 0; r < rows; ++r) {
    DecodeScores(q + int64_t{r} * hd, hd, k, off, ctx, scale, s + r * ctx);
    SoftmaxImpl(s + r * ctx, ctx);
  }
  BroadcastProduct(s, ctx, rows, ctx, OffsetRows<W>{v, off}, hd, 1.f, out, hd);
}

void AttentionDecodeF32Impl(const float* q, int rows, int hd, const float* k, const float* v,
                            const int64_t* off, int64_t ctx, float scale, float* s, float* out) {
  AttentionDecodeRows(q, rows, hd, k, v, off, ctx, scale, s, out);
}

void AttentionDecodeBf16Impl(const float* q, int rows, int hd, const uint16_t* k,
                             const uint16_t* v, const int64_t* off, int64_t ctx, float scale,
                             float* s, float* out) {
  AttentionDecodeRows(q, rows, hd, k, v, off, ctx, scale, s, out);
}

// f32 to bf16, rounding to nearest even (tensor.cc's ToBf16, the same bits:
// NaNs stay quiet NaNs).
void ToBf16Impl(const float* x, uint16_t* out, int64_t n) {
  const DV d;
  const hn::RebindToUnsigned<DV> du;
  const hn::Rebind<uint16_t, DV> d16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto round = [&](hn::Vec<DV> v) {
    const auto u = hn::BitCast(du, v);
    const auto odd = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    const auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(du, 0x7fffu)), odd));
    const auto nan = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
    // Every lane is below 2^16: the signed-to-unsigned saturating demotion
    // keeps it.
    const hn::RebindToSigned<DV> di;
    return hn::DemoteTo(
        d16, hn::BitCast(di, hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), nan, rounded)));
  };
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(round(hn::LoadU(d, x + i)), d16, out + i);
  if (i < n) {
    const size_t left = static_cast<size_t>(n - i);
    TailStore(round(TailLoad(hn::FirstN(d, left), d, x + i)), hn::FirstN(d16, left), d16, out + i);
  }
}

float ExpImpl(float x) { return hn::GetLane(hn::Exp(DV(), hn::Set(DV(), x))); }

// Rows of x up to which SmallMatmulBlocks runs: above, on x86 from AVX2 up,
// InterleavedBlocks; elsewhere SmallMatmulBlocks takes every count it is
// given (up to kSmallMatmulMaxRows from MatmulNow, which widens weights for
// sgemm above). Before InterleavedBlocks, groups of 4 weight rows widened to
// f32 for the tiles took 17-32 rows on AVX-512: faster than the integer
// path there (SmolLM2 Q4_1 batch 24 24.6 -> 26.9 ms, batch 32 30.9 -> 36.1
// all integer), which still wins at 9-16 rows (batch 12 14.4 -> 12.1 ms,
// batch 16 17.1 -> 16.2). The interleaved products then beat the widened
// rows at 24 and 32 rows (2026-11-29, a 2-vCPU Zen 5, `tandem bench step
// --prefill-tokens=16 --batch-sizes=24,32 --threads=2`, three interleaved
// runs): SmolLM2 Q4_1 22.6-23.0 / 28.3-28.5 ms -> 20.6-20.9 / 26.2-26.5;
// four Llama-3.2-1B layers in Q4_K_M 43.0-45.0 / 55.4-57.8 -> 25.5-25.6 /
// 32.3-32.5.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int64_t kBlocksIntegerRows = 16;
#else
constexpr int64_t kBlocksIntegerRows = 32;
#endif

int64_t BlocksIntegerRowsImpl() { return kBlocksIntegerRows; }

#undef TANDEM_INTERLEAVED_BLOCKS  // this file is compiled once per target
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define TANDEM_INTERLEAVED_BLOCKS 1
// Products of more than kBlocksIntegerRows rows (decode batches of 17-32,
// prefill) over block weights on AVX-512: each int32 lane is one weight row. 16
// weight rows at a time are widened to int16 and transposed in pairs of
// elements (InterleaveRows), so that a vector holds elements 2p and 2p + 1 of
// each of the 16 rows, and x's two int16 quants at 2p, 2p + 1 (the same quants,
// one scale per row, as SmallMatmulBlocks) are broadcast to every lane: one
// multiply-add (vpdpwssd with x from memory, broadcast by the instruction)
// makes 32 products, all kept, and a block's sums of 16 rows are converted and
// scaled by their 16 scales in one instruction each, for every row of x. The
// block-at-a-time path sums a block of one weight row across lanes and so
// converts and scales each block per row of x and per weight row: half its
// instructions.
//
// Bytes of one group of 16 weight rows' interleaved block: 16 vectors of
// int16 pairs, then the 16 rows' scales and (Q4_1) minimums as f32.
constexpr int64_t kInterleavedBlockBytes = 16 * 64 + 2 * 64;

// The 16 rows `rows` (int32 lanes: pairs of int16) transposed in place:
// rows[p] lane c = the input's rows[c] lane p.
HWY_INLINE void Transpose16(__m512i (&r)[16]) {
  __m512i t[16], u[16];  // unrolled: every array in registers
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + k]: 128-bit lane L = rows 4g..4g+3's element 4L + k.
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m512i v = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
    const __m512i w = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
    const __m512i w2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
    r[k] = _mm512_shuffle_i32x4(v, v2, 0x88);
    r[8 + k] = _mm512_shuffle_i32x4(v, v2, 0xDD);
    r[4 + k] = _mm512_shuffle_i32x4(w, w2, 0x88);
    r[12 + k] = _mm512_shuffle_i32x4(w, w2, 0xDD);
  }
}

// Weight rows [j, j + rows) (rows <= 16; the rest zero) of `blocks` blocks
// each, interleaved into `out` (blocks * kInterleavedBlockBytes).
template <DType kType>
HWY_INLINE void InterleaveRows(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t blocks,
                               uint8_t* out) {
  constexpr size_t kBytes = kBlockBytes<kType>;
  for (int64_t b = 0; b < blocks; ++b, out += kInterleavedBlockBytes) {
    __m512i r[16];
    alignas(64) uint16_t scale[16] = {}, minimum[16] = {};
#pragma GCC unroll 16
    for (int64_t c = 0; c < 16; ++c) {
      if (c >= rows) {
        r[c] = _mm512_setzero_si512();
        continue;
      }
      const uint8_t* src = w + c * row_bytes + b * kBytes;
      // Each row's stream 8 blocks ahead: 16 streams at once, which the
      // hardware prefetchers did not follow (a 32-row decode step of four
      // Llama-3.2-1B layers in Q4_K_M read from memory: 56 -> 32 ms).
      hwy::Prefetch(src + 8 * kBytes);
      std::memcpy(&scale[c], src, 2);
      if constexpr (kType == DType::kQ8_0) {
        r[c] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 2)));
      } else {
        constexpr size_t kQuantsAt = kType == DType::kQ4_1 ? 4 : 2;
        if constexpr (kType == DType::kQ4_1) std::memcpy(&minimum[c], src + 2, 2);
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + kQuantsAt));
        const __m128i lo = _mm_and_si128(q, _mm_set1_epi8(0xF));
        const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0xF));
        r[c] = _mm512_cvtepu8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
        if constexpr (kType == DType::kQ4_0) r[c] = _mm512_sub_epi16(r[c], _mm512_set1_epi16(8));
      }
    }
    Transpose16(r);
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) _mm512_storeu_si512(out + p * 64, r[p]);
    _mm512_storeu_ps(out + 16 * 64,
                     _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scale))));
    _mm512_storeu_ps(out + 17 * 64,
                     _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(minimum))));
  }
}

// acc + the sums of adjacent int16 products of w and x's pair at `x`,
// broadcast to every lane.
HWY_INLINE __m512i MulAddBroadcastPair(__m512i acc, __m512i w, const int16_t* x) {
#if HWY_TARGET == HWY_AVX3_DL
  asm("vpdpwssd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x)));
  return acc;
#else
  int32_t pair;
  std::memcpy(&pair, x, 4);
  return _mm512_add_epi32(acc, _mm512_madd_epi16(w, _mm512_set1_epi32(pair)));
#endif
}

// out[r * ldo + c] for r < R, c < cols (<= 16): R rows of x (int16 quants
// `ldq` apart, scales xs[r], f32 block sums xsum + r * blocks for Q4_1's
// minimums) times one group of 16 interleaved weight rows.
template <DType kType, int R>
HWY_INLINE void InterleavedTile(const int16_t* xq, int64_t ldq, const float* xs, const float* xsum,
                                const uint8_t* group, int64_t blocks, float* out, int64_t ldo,
                                int64_t cols) {
  // The loops over rows unrolled, so that the sums stay in registers.
  __m512 acc[R], mins[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = mins[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b, group += kInterleavedBlockBytes) {
    __m512i sum[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) sum[r] = _mm512_setzero_si512();
    const int16_t* x = xq + b * 32;
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) {
      const __m512i w = _mm512_loadu_si512(group + p * 64);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) sum[r] = MulAddBroadcastPair(sum[r], w, x + r * ldq + 2 * p);
    }
    const __m512 d = _mm512_loadu_ps(reinterpret_cast<const float*>(group + 16 * 64));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), d, acc[r]);
    if constexpr (kType == DType::kQ4_1) {
      const __m512 m = _mm512_loadu_ps(reinterpret_cast<const float*>(group + 17 * 64));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        mins[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[r * blocks + b]), mins[r]);
      }
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    __m512 o = _mm512_mul_ps(acc[r], _mm512_set1_ps(xs[r]));
    if constexpr (kType == DType::kQ4_1) o = _mm512_add_ps(o, mins[r]);
    _mm512_mask_storeu_ps(out + r * ldo, mask, o);
  }
}

// Rows of x per InterleavedTile: R int32 sums, R f32 sums and (Q4_1) R
// minimum terms live across a block, with the weights and scales, in the
// 32 vector registers.
constexpr int kInterleavedRows = 8;
constexpr int64_t kGroupRows = 16;
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
#define TANDEM_INTERLEAVED_BLOCKS 1
// The same products on AVX2 (AVX2_VNNI too: vpmaddwd and vpaddd give
// vpdpwssd's sums exactly here), 8 weight rows a group: a vector of 8 int32
// lanes, one weight row each, and a multiply-add of 16 products (vpmaddwd,
// then vpaddd) with x's int16 pair broadcast from memory (vbroadcastss);
// x's quants with a scale per block of 32 (QuantizeBlocksI16).
// vpmaddwd issues twice a cycle as the FMA does (Zen 3), with 16 products
// to the FMA's 8. Against the weights widened to f32 for OpenBLAS's sgemm,
// one thread of a 2-vCPU Zen 3 (matmul_blocks_benchmark, prefill rows, 64
// and 256 rows by Llama-3.2-1B's q/o, gate/up and down and SmolLM2's gate):
// Q8_0 1.2-1.7x, Q4_1 1.4-1.6x (docs/benchmarks.md).
// A group's interleaved block: 16 vectors of int16 pairs, then 8 scales and
// (Q4_1) 8 minimums as f32.
constexpr int64_t kGroupRows = 8;
constexpr int64_t kInterleavedBlockBytes = 16 * 32 + 2 * 32;

// The 8 x 8 int32 lanes of `r` transposed in place.
HWY_INLINE void Transpose8(__m256i (&r)[8]) {
  __m256i t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + k]: 128-bit lane L = rows 4g..4g+3's element 4L + k.
#pragma GCC unroll 2
  for (int g = 0; g < 2; ++g) {
    u[4 * g + 0] = _mm256_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm256_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm256_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm256_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
    r[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
  }
}

// Weight rows [j, j + rows) (rows <= 8; the rest zero) of `blocks` blocks
// each, interleaved into `out` (blocks * kInterleavedBlockBytes).
template <DType kType>
HWY_INLINE void InterleaveRows(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t blocks,
                               uint8_t* out) {
  constexpr size_t kBytes = kBlockBytes<kType>;
  for (int64_t b = 0; b < blocks; ++b, out += kInterleavedBlockBytes) {
    __m256i lo[8], hi[8];  // a row's elements 0-15 and 16-31 as int16
    alignas(16) uint16_t scale[8] = {}, minimum[8] = {};
#pragma GCC unroll 8
    for (int64_t c = 0; c < 8; ++c) {
      if (c >= rows) {
        lo[c] = hi[c] = _mm256_setzero_si256();
        continue;
      }
      const uint8_t* src = w + c * row_bytes + b * kBytes;
      hwy::Prefetch(src + 8 * kBytes);  // as on AVX-512: 8 streams at once
      std::memcpy(&scale[c], src, 2);
      if constexpr (kType == DType::kQ8_0) {
        lo[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2)));
        hi[c] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 18)));
      } else {
        constexpr size_t kQuantsAt = kType == DType::kQ4_1 ? 4 : 2;
        if constexpr (kType == DType::kQ4_1) std::memcpy(&minimum[c], src + 2, 2);
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + kQuantsAt));
        lo[c] = _mm256_cvtepu8_epi16(_mm_and_si128(q, _mm_set1_epi8(0xF)));
        hi[c] = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0xF)));
        if constexpr (kType == DType::kQ4_0) {
          lo[c] = _mm256_sub_epi16(lo[c], _mm256_set1_epi16(8));
          hi[c] = _mm256_sub_epi16(hi[c], _mm256_set1_epi16(8));
        }
      }
    }
    Transpose8(lo);
    Transpose8(hi);
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + p * 32), lo[p]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (8 + p) * 32), hi[p]);
    }
    _mm256_storeu_ps(reinterpret_cast<float*>(out + 16 * 32),
                     _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(scale))));
    _mm256_storeu_ps(reinterpret_cast<float*>(out + 17 * 32),
                     _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(minimum))));
  }
}

// x's int16 quants for InterleavedTile on AVX2: R rows (`rows`, k apart)
// rewritten so that each block's 16 pairs of the R rows follow one another,
// pair p of row r at pair (b * 16 + p) * R + r of `out`: the tile then reads
// x at fixed offsets from one pointer. (Read from R row pointers, GCC keeps
// an induction variable for each of the 16 * R addresses of a block, and
// spills them: 21 GMAC/s against sgemm's 27 over widened weights.)
template <int R>
HWY_INLINE void TileRows(const int16_t* rows, int64_t k, int16_t* out) {
  const int64_t pairs = k / 2;
  const auto* in = reinterpret_cast<const int32_t*>(rows);
  auto* o = reinterpret_cast<int32_t*>(out);
  for (int64_t q = 0; q < pairs; ++q) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) o[q * R + r] = in[r * pairs + q];
  }
}

// out[r * ldo + c] for r < R, c < cols (<= 8): R rows of x (their quants
// as TileRows wrote them at `xq`, a scale per block of each, block b's of
// row r at xs[b * R + r], f32 block sums xsum + r * blocks for Q4_1's
// minimums) times one group of 8 interleaved weight rows.
template <DType kType, int R>
HWY_INLINE void InterleavedTile(const int16_t* xq, int64_t /*ldq*/, const float* xs,
                                const float* xsum, const uint8_t* group, int64_t blocks,
                                float* out, int64_t ldo, int64_t cols) {
  __m256 acc[R], mins[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = mins[r] = _mm256_setzero_ps();
  const auto* x = reinterpret_cast<const float*>(xq);  // int16 pairs, broadcast as f32 bits
  const float* xb = xs;                                // the block's scales of the R rows
  for (int64_t b = 0; b < blocks; ++b, group += kInterleavedBlockBytes, x += 16 * R, xb += R) {
    __m256i sum[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + p * 32));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m256i pair = _mm256_castps_si256(_mm256_broadcast_ss(x + p * R + r));
        sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(w, pair));
        // Summed in this order, in its register: GCC 12 otherwise
        // reassociates the sums, keeps a block's 16 products of each row
        // and spills them.
        asm("" : "+x"(sum[r]));
      }
    }
    const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(group + 16 * 32));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]),
                               _mm256_mul_ps(d, _mm256_broadcast_ss(xb + r)), acc[r]);
    }
    if constexpr (kType == DType::kQ4_1) {
      const __m256 m = _mm256_loadu_ps(reinterpret_cast<const float*>(group + 17 * 32));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        mins[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xsum[r * blocks + b]), mins[r]);
      }
    }
  }
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(cols)),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    __m256 o = acc[r];
    if constexpr (kType == DType::kQ4_1) o = _mm256_add_ps(o, mins[r]);
    _mm256_maskstore_ps(out + r * ldo, mask, o);
  }
}

// x's int16 quants for InterleavedTile on AVX2, one scale per block of 32
// (block b's at scale[b * stride]): each element off by at most its block's
// largest / 65534, where one scale per row (the AVX-512 tiles', the decode
// kernel's) leaves it off by the row's largest / 65534, which a channel of
// outlying activations makes large. Prefill on AVX2 multiplied exact f32 x
// (sgemm) before; with one scale per row SmolLM2's logits moved 3.7e-3 from
// the widened weights' (RealModelNarrowTest, 37-token prompts; 2.2e-3 by
// the decode kernel's arithmetic), with one per block 4.0e-4 and 4.6e-4,
// for one broadcast and one multiply more a block per row.
HWY_INLINE void QuantizeBlocksI16(const float* x, int64_t blocks, int16_t* q, float* scale,
                                  int64_t stride) {
  const DF df;
  const hn::Rebind<int16_t, DF> dh;
  constexpr size_t N = hn::MaxLanes(DF());
  static_assert(32 % N == 0);
  for (int64_t b = 0; b < blocks; ++b, x += 32, q += 32) {
    auto m = hn::Zero(df);
    for (size_t i = 0; i < 32; i += N) m = hn::Max(m, hn::Abs(hn::LoadU(df, x + i)));
    const float amax = hn::GetLane(hn::MaxOfLanes(df, m));
    scale[b * stride] = amax / 32767.f;
    const auto inv = hn::Set(df, amax > 0.f ? 32767.f / amax : 0.f);
    for (size_t i = 0; i < 32; i += N) {
      hn::StoreU(hn::DemoteTo(dh, hn::NearestInt(hn::Mul(hn::LoadU(df, x + i), inv))), dh, q + i);
    }
  }
}

// Rows of x per InterleavedTile: 4 int32 sums, 4 f32 sums and (Q4_1) 4
// minimum terms, the weights and a broadcast pair in 16 registers.
constexpr int kInterleavedRows = 4;
#else
#define TANDEM_INTERLEAVED_BLOCKS 0
#endif

#if TANDEM_INTERLEAVED_BLOCKS
// out = a . w^T for weight rows [j0, j1) through InterleavedTile. scratch:
// x's int16 quants (on AVX2 in TileRows' order), scales and block sums,
// then one group's interleaved blocks (MatmulBlocksScratchFloats).
template <DType kType>
HWY_INLINE void InterleavedBlocks(const float* a, int64_t lda, int64_t n, const uint8_t* w,
                                  int64_t k, int64_t j0, int64_t j1, float* c, int64_t ldc,
                                  float* scratch) {
  const int64_t blocks = k / 32;
  const size_t row_bytes = static_cast<size_t>(blocks) * kBlockBytes<kType>;
  int16_t* xq = reinterpret_cast<int16_t*>(scratch);
  float* xs = scratch + (n * k + 1) / 2;
  float* xsum = xs + n;
#if HWY_TARGET == HWY_AVX2
  // A scale per block of each row, each tile's in tile order (InterleavedTile).
  float* xsb = xsum + n * blocks;
  uint8_t* group = reinterpret_cast<uint8_t*>(xsb + n * blocks);
  const auto scales = [xsb, blocks](int64_t r) { return xsb + r * blocks; };
#else
  uint8_t* group = reinterpret_cast<uint8_t*>(xsum + n * blocks);
  const auto scales = [xs](int64_t r) { return xs + r; };
#endif
  group += (64 - reinterpret_cast<uintptr_t>(group) % 64) % 64;
  for (int64_t r = 0; r < n; ++r) {
#if HWY_TARGET == HWY_AVX2
    const int64_t r0 = r / kInterleavedRows * kInterleavedRows;
    QuantizeBlocksI16(a + r * lda, blocks, xq + r * k, xsb + r0 * blocks + (r - r0),
                      std::min<int64_t>(kInterleavedRows, n - r0));
#else
    QuantizeRowI16<kType, true>(a + r * lda, blocks, xq + r * k, xs + r);
#endif
    if constexpr (kType == DType::kQ4_1) BlockSums(a + r * lda, blocks, xsum + r * blocks);
  }
#if HWY_TARGET == HWY_AVX2
  // Each tile's rows in TileRows' order, through the group's space (free
  // until the first group is interleaved: blocks * 288 floats, more than a
  // tile's 4 * 32 int16 a block).
  int16_t* tile = reinterpret_cast<int16_t*>(group);
  for (int64_t r = 0; r < n; r += kInterleavedRows) {
    const int64_t rows = std::min<int64_t>(kInterleavedRows, n - r);
    std::memcpy(tile, xq + r * k, sizeof(int16_t) * rows * k);
    switch (rows) {
      case 1: break;  // one row: already in order
      case 2: TileRows<2>(tile, k, xq + r * k); break;
      case 3: TileRows<3>(tile, k, xq + r * k); break;
      default: TileRows<4>(tile, k, xq + r * k); break;
    }
  }
  static_assert(kInterleavedRows == 4);
#endif
  for (int64_t j = j0; j < j1; j += kGroupRows) {
    const int64_t cols = std::min<int64_t>(kGroupRows, j1 - j);
    InterleaveRows<kType>(w + j * row_bytes, row_bytes, cols, blocks, group);
    int64_t r = 0;
    for (; r + kInterleavedRows <= n; r += kInterleavedRows) {
      InterleavedTile<kType, kInterleavedRows>(xq + r * k, k, scales(r), xsum + r * blocks,
                                               group, blocks, c + r * ldc + j, ldc, cols);
    }
    switch (n - r) {
#define TANDEM_TAIL(R)                                                                          \
  case R:                                                                                       \
    if constexpr (R < kInterleavedRows)                                                         \
      InterleavedTile<kType, R>(xq + r * k, k, scales(r), xsum + r * blocks, group, blocks,      \
                              c + r * ldc + j, ldc, cols);                                      \
    break;
      TANDEM_TAIL(1) TANDEM_TAIL(2) TANDEM_TAIL(3) TANDEM_TAIL(4) TANDEM_TAIL(5)
      TANDEM_TAIL(6) TANDEM_TAIL(7)
#undef TANDEM_TAIL
      default:
        break;
    }
  }
}
#endif

template <DType kType>
HWY_INLINE void MatmulBlocksOf(const float* a, int64_t lda, int64_t n, const uint8_t* w, int64_t k,
                               int64_t j0, int64_t j1, float* c, int64_t ldc, float* scratch) {
#if TANDEM_INTERLEAVED_BLOCKS
  if (n > kBlocksIntegerRows) {
    return InterleavedBlocks<kType>(a, lda, n, w, k, j0, j1, c, ldc, scratch);
  }
#endif
#if HWY_TARGET == HWY_AVX2
  if (AvxVnni()) return SmallMatmulBlocks<kType, true>(a, lda, n, w, k, j0, j1, c, ldc, scratch);
#endif
  SmallMatmulBlocks<kType, false>(a, lda, n, w, k, j0, j1, c, ldc, scratch);
}

void MatmulBlocksImpl(DType dtype, const float* a, int64_t lda, int64_t n, const uint8_t* w,
                      int64_t k, int64_t j0, int64_t j1, float* c, int64_t ldc, float* scratch) {
  switch (dtype) {
    case DType::kQ8_0:
      return MatmulBlocksOf<DType::kQ8_0>(a, lda, n, w, k, j0, j1, c, ldc, scratch);
    case DType::kQ4_0:
      return MatmulBlocksOf<DType::kQ4_0>(a, lda, n, w, k, j0, j1, c, ldc, scratch);
    case DType::kQ4_1:
      return MatmulBlocksOf<DType::kQ4_1>(a, lda, n, w, k, j0, j1, c, ldc, scratch);
    default:
      HWY_ABORT("MatmulBlocks: not a block type");
  }
}

bool BlocksAtEveryRowCountImpl() { return TANDEM_INTERLEAVED_BLOCKS != 0; }

const char* TargetImpl() {
#if HWY_TARGET == HWY_AVX2
  if (AvxVnni()) return kAvx2Vnni;
#endif
  return hwy::TargetName(HWY_TARGET);
}

bool TargetHasAvx512Impl() {
#if HWY_ARCH_X86
  return HWY_TARGET <= HWY_AVX3;
#else
  return false;
#endif
}

}  // namespace tandem::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tandem::cpu {

HWY_EXPORT(WidenRowImpl);
HWY_EXPORT(DotF32Impl);
HWY_EXPORT(MatmulF32Impl);
HWY_EXPORT(MatmulBf16Impl);
HWY_EXPORT(MatmulBlocksImpl);
HWY_EXPORT(BlocksIntegerRowsImpl);
HWY_EXPORT(BlocksAtEveryRowCountImpl);
HWY_EXPORT(AttentionScoresImpl);
HWY_EXPORT(AttentionPvImpl);
HWY_EXPORT(AddProductBf16Impl);
HWY_EXPORT(AttentionDecodeF32Impl);
HWY_EXPORT(AttentionDecodeBf16Impl);
HWY_EXPORT(SoftmaxImpl);
HWY_EXPORT(RopeRowImpl);
HWY_EXPORT(AddRowImpl);
HWY_EXPORT(SiluMulImpl);
HWY_EXPORT(RmsNormRowImpl);
HWY_EXPORT(ToBf16Impl);
HWY_EXPORT(ExpImpl);
HWY_EXPORT(TargetImpl);
HWY_EXPORT(TargetHasAvx512Impl);

void WidenRow(DType dtype, const void* src, int64_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(WidenRowImpl)(dtype, src, n, dst);
}

float Dot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotF32Impl)(a, b, n);
}

void MatmulF32(const float* x, int64_t ldx, int64_t n, const float* w, int64_t K, int64_t j0,
               int64_t j1, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(MatmulF32Impl)(x, ldx, n, w, K, j0, j1, out, ldo);
}

void MatmulBf16(const float* x, int64_t ldx, int64_t n, const uint16_t* w, int64_t K, int64_t j0,
                int64_t j1, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(MatmulBf16Impl)(x, ldx, n, w, K, j0, j1, out, ldo);
}

void MatmulBlocks(DType dtype, const float* x, int64_t ldx, int64_t n, const uint8_t* w,
                  int64_t K, int64_t j0, int64_t j1, float* out, int64_t ldo, float* scratch) {
  HWY_DYNAMIC_DISPATCH(MatmulBlocksImpl)(dtype, x, ldx, n, w, K, j0, j1, out, ldo, scratch);
}

int64_t BlocksIntegerMaxRows() { return HWY_DYNAMIC_DISPATCH(BlocksIntegerRowsImpl)(); }

bool BlocksAtEveryRowCount() { return HWY_DYNAMIC_DISPATCH(BlocksAtEveryRowCountImpl)(); }

int64_t MatmulBlocksScratchFloats(int64_t n, int64_t k) {
  // x's int16 quants (two per float; its blocks rounded up to an even
  // count, the block pairs' layout), then its scale per row and its block
  // sums (rows rounded up to groups of up to 8, and one more); then, for
  // InterleavedBlocks, x's scales per block (AVX2) and one group's
  // interleaved blocks (288 floats a block) aligned to 64 bytes.
  const int64_t padded = (k / 32 + 1) / 2 * 2;
  return n * padded * 16 + n + (n + 8) * padded + n * padded + padded * 288 + 16;
}

void AttentionScores(const float* q, int64_t ldq, int64_t rows, const float* kt, int64_t ldkt,
                     int64_t ctx, int hd, float scale, float* s, int64_t lds) {
  HWY_DYNAMIC_DISPATCH(AttentionScoresImpl)(q, ldq, rows, kt, ldkt, ctx, hd, scale, s, lds);
}

void AttentionPv(const float* p, int64_t ldp, int64_t rows, const float* v, int64_t ctx, int hd,
                 float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(AttentionPvImpl)(p, ldp, rows, v, ctx, hd, out, ldo);
}

void AddProductBf16(const float* a, int64_t lda, int64_t nrows, int64_t inner, const uint16_t* b,
                    int64_t ldb, int64_t ncols, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(AddProductBf16Impl)(a, lda, nrows, inner, b, ldb, ncols, out, ldo);
}

void AttentionDecode(const float* q, int rows, int hd, const float* k, const float* v,
                     const int64_t* off, int64_t ctx, float scale, float* s, float* out) {
  HWY_DYNAMIC_DISPATCH(AttentionDecodeF32Impl)(q, rows, hd, k, v, off, ctx, scale, s, out);
}

void AttentionDecode(const float* q, int rows, int hd, const uint16_t* k, const uint16_t* v,
                     const int64_t* off, int64_t ctx, float scale, float* s, float* out) {
  HWY_DYNAMIC_DISPATCH(AttentionDecodeBf16Impl)(q, rows, hd, k, v, off, ctx, scale, s, out);
}

void Softmax(float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxImpl)(x, n); }

void RopeRow(float* x, int heads, int hd, const float* cos, const float* sin) {
  HWY_DYNAMIC_DISPATCH(RopeRowImpl)(x, heads, hd, cos, sin);
}

void AddRow(float* x, const float* b, int64_t n) { HWY_DYNAMIC_DISPATCH(AddRowImpl)(x, b, n); }

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluMulImpl)(gate, up, out, n);
}

void RmsNormRow(const float* base, const float* add, float* sum, const float* w, float eps,
                int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(RmsNormRowImpl)(base, add, sum, w, eps, n, out);
}

void ToBf16(const float* x, uint16_t* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ToBf16Impl)(x, out, n);
}

float ExpForTest(float x) { return HWY_DYNAMIC_DISPATCH(ExpImpl)(x); }

const char* Target() { return HWY_DYNAMIC_DISPATCH(TargetImpl)(); }

namespace {
// The target UseTarget chose (0: the best), re-applied after Highway's list
// of targets is read: that list honours the choice, and is wanted whole.
int64_t chosen_target = 0;

std::vector<int64_t> AllTargets() {
  hwy::SetSupportedTargetsForTest(0);
  std::vector<int64_t> all = hwy::SupportedAndGeneratedTargets();
  hwy::SetSupportedTargetsForTest(chosen_target);
  return all;
}

// CPUID leaf 7, sub-leaf 1, EAX bit 4: AVX-VNNI (read once: CPUID traps to
// the hypervisor in a VM).
bool CpuHasAvxVnni() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && ((eax >> 4) & 1) != 0;
  }();
  return has;
#else
  return false;
#endif
}

// Whether the AVX2 target uses AVX-VNNI: the CPU's by default.
bool& AvxVnniChosen() {
  static bool on = CpuHasAvxVnni();
  return on;
}

bool HasTarget(const std::vector<int64_t>& targets, int64_t target) {
  return std::find(targets.begin(), targets.end(), target) != targets.end();
}
}  // namespace

bool AvxVnni() { return AvxVnniChosen(); }

std::vector<std::string> Targets() {
  std::vector<std::string> names;
  for (int64_t t : AllTargets()) {
    if (t == HWY_AVX2 && CpuHasAvxVnni()) names.push_back(kAvx2Vnni);
    names.push_back(hwy::TargetName(t));
  }
  return names;
}

bool UseTarget(std::string_view name) {
  const absl::string_view want(name.data(), name.size());
  const std::vector<int64_t> all = AllTargets();
  int64_t target = -1;
  bool vnni = false;
  if (name.empty()) {
    target = 0;
    vnni = CpuHasAvxVnni();
  } else if (absl::EqualsIgnoreCase(want, kAvx2Vnni)) {
    if (!CpuHasAvxVnni() || !HasTarget(all, HWY_AVX2)) return false;
    target = HWY_AVX2;
    vnni = true;
  }
  for (int64_t t : all) {
    if (absl::EqualsIgnoreCase(want, hwy::TargetName(t))) target = t;
  }
  if (target < 0) return false;
  chosen_target = target;
  AvxVnniChosen() = vnni;
  hwy::SetSupportedTargetsForTest(target);
  return true;
}

// Through the dispatch table, not hwy::SupportedTargets(): Highway 1.0's
// SupportedTargets() runs CPUID on every call, a trap to the hypervisor in a
// VM, and the CPU ops ask this once per matmul (3% of a speculative
// verification step on a 2-vCPU KVM guest).
bool TargetHasAvx512() { return HWY_DYNAMIC_DISPATCH(TargetHasAvx512Impl)(); }

}  // namespace tandem::cpu
#endif  // HWY_ONCE
