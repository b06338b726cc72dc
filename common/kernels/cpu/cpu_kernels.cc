#include "common/kernels/cpu/cpu_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#define TANDEM_X86 1
#include <immintrin.h>
#else
#define TANDEM_X86 0
#endif

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_ps() as a merge operand
// and then warn about it in every caller (GCC bug 105593): not our code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cmath>

#include "common/backend/tensor.h"
#include "common/base/logging.h"
#include "common/kernels/cpu/hwy_kernels.h"

namespace tandem::cpu {
// The AVX-512 kernels and the entry points that exist only for them: x86
// only (elsewhere HasAvx512() is false, and callers never reach them).
#if TANDEM_X86
namespace {

// The kernels read and write only the ranges they are given, like the BLAS
// they stand in for (which is not instrumented either): ThreadSanitizer skips
// their loads and stores, which would otherwise make a TSan build of the
// engine an order of magnitude slower; the pool's hand-offs around them stay
// checked.
#define TANDEM_AVX512 \
  __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma,f16c"), no_sanitize("thread")))

TANDEM_AVX512 inline __mmask16 TailMask(int64_t left) {
  return static_cast<__mmask16>((1u << left) - 1u);
}

// max/min with every lane selected (the unmasked intrinsics trip the same
// GCC 12 warning).
TANDEM_AVX512 inline __m512 Max(__m512 a, __m512 b) { return _mm512_mask_max_ps(a, 0xFFFF, a, b); }
TANDEM_AVX512 inline __m512 Min(__m512 a, __m512 b) { return _mm512_mask_min_ps(a, 0xFFFF, a, b); }

// 16 weights as f32: float as they are, bf16 (uint16_t bits) widened by a
// shift into the high half, which is exact.
TANDEM_AVX512 inline __m512 Load(const float* p) { return _mm512_loadu_ps(p); }
TANDEM_AVX512 inline __m512 Load(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
TANDEM_AVX512 inline __m512 MaskLoad(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
TANDEM_AVX512 inline __m512 MaskLoad(__mmask16 m, const uint16_t* p) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <bool kMax>
TANDEM_AVX512 inline __m512 Combine(__m512 a, __m512 b) {
  if constexpr (kMax) return Max(a, b);
  return _mm512_add_ps(a, b);
}
template <bool kMax>
TANDEM_AVX512 inline __m128 Combine(__m128 a, __m128 b) {
  if constexpr (kMax) return _mm_max_ps(a, b);
  return _mm_add_ps(a, b);
}

// The sum (or the max) of a vector's 16 lanes, halving it four times.
// (_mm512_reduce_add_ps trips GCC 12's warning; these are the masked forms.)
template <bool kMax>
TANDEM_AVX512 inline float Reduce(__m512 v) {
  __m512 t = Combine<kMax>(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  t = Combine<kMax>(t, _mm512_mask_shuffle_f32x4(t, 0xFFFF, t, t, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 s = _mm512_mask_extractf32x4_ps(_mm_setzero_ps(), 0xF, t, 0);
  s = Combine<kMax>(s, _mm_movehl_ps(s, s));
  s = Combine<kMax>(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
TANDEM_AVX512 inline float ReduceAdd(__m512 v) { return Reduce<false>(v); }
TANDEM_AVX512 inline float ReduceMax(__m512 v) { return Reduce<true>(v); }

// Lane j of the result = the sum of the 16 lanes of a[j], for 16 vectors:
// a transposing tree of 45 shuffles and adds instead of 16 reductions of
// ~8 dependent steps each.
TANDEM_AVX512 inline __m512 Reduce16(const __m512 (&a)[16]) {
  // Pairs: per 128-bit lane [a0+a2, b0+b2, a1+a3, b1+b3].
  __m512 t[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  // Quads: per 128-bit lane L, the sums over L of 4 vectors.
  __m512 u[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // Across the 128-bit lanes: lanes (0 + 1, 2 + 3), then all four.
  const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88),
                                   _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88),
                                   _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
}

// out[r * ldo + c] = the sum of acc[r][c]'s lanes: a 4 x 4 tile through
// Reduce16, other shapes one by one.
template <int R, int C>
TANDEM_AVX512 inline void StoreSums(const __m512 (&acc)[R][C], float* out, int64_t ldo) {
  if constexpr (R == 4 && C == 4) {
    const __m512 sums = Reduce16(reinterpret_cast<const __m512(&)[16]>(acc));
    _mm_storeu_ps(out, _mm512_extractf32x4_ps(sums, 0));
    _mm_storeu_ps(out + ldo, _mm512_extractf32x4_ps(sums, 1));
    _mm_storeu_ps(out + 2 * ldo, _mm512_extractf32x4_ps(sums, 2));
    _mm_storeu_ps(out + 3 * ldo, _mm512_extractf32x4_ps(sums, 3));
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) out[r * ldo + c] = ReduceAdd(acc[r][c]);
  }
}

// An R x C tile: R rows of x against C rows of w (W: float or bf16 bits).
// Each w vector is loaded once per k-step and used by R rows; the
// accumulators stay in registers. With `next` (the next C weight rows), also
// prefetches them into L1, one cache line of each per line consumed: they
// arrive while this tile computes.
template <int R, int C, bool kPrefetch = false, typename W>
TANDEM_AVX512 inline void Tile(const float* x, int64_t ldx, const W* w, int64_t K,
                               float* out, int64_t ldo, const W* next = nullptr) {
  // Fully unrolled (R and C are constants), so that the accumulators live in
  // registers.
  __m512 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    if constexpr (kPrefetch) {
      if (sizeof(W) == 4 || k % 32 == 0) {  // once per 64-byte line
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          _mm_prefetch(reinterpret_cast<const char*>(next + c * K + k), _MM_HINT_T0);
        }
      }
    }
    __m512 wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) wv[c] = Load(w + c * K + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * ldx + k);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (k < K) {
    const __mmask16 m = TailMask(K - k);
    __m512 wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) wv[c] = MaskLoad(m, w + c * K + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + r * ldx + k);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  StoreSums<R, C>(acc, out, ldo);
}

// Rows of x in groups of 4 (then 2, 1) against one group of C weight rows.
// The first group prefetches the next C weight rows (`next`, null at the end).
template <int C, typename W>
TANDEM_AVX512 inline void Columns(const float* x, int64_t ldx, int64_t n, const W* w,
                                  int64_t K, float* out, int64_t ldo, const W* next) {
  int64_t i = 0;
  if (next != nullptr) {
    if (n >= 4) {
      Tile<4, C, true>(x, ldx, w, K, out, ldo, next);
      i = 4;
    } else if (n >= 2) {
      Tile<2, C, true>(x, ldx, w, K, out, ldo, next);
      i = 2;
    } else {
      Tile<1, C, true>(x, ldx, w, K, out, ldo, next);
      i = 1;
    }
  }
  for (; i + 4 <= n; i += 4) Tile<4, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo);
  for (; i + 2 <= n; i += 2) Tile<2, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo);
  for (; i < n; ++i) Tile<1, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo);
}

// The block types, as 32 weights in two f32 vectors (elements 0-15, 16-31).
struct Q8_0Block {
  static constexpr int64_t kBytes = 34;  // f16 d, 32 int8
  TANDEM_AVX512 static inline void Load(const uint8_t* blk, __m512* lo, __m512* hi) {
    uint16_t dh;
    __builtin_memcpy(&dh, blk, 2);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(dh));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
    *lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
    *hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
  }
};
// Q4_0 (kMin false: d * (q - 8)) and Q4_1 (kMin true: d * q + m); byte j
// holds element j in its low nibble and element j + 16 in its high one.
template <bool kMin>
struct Q4Block {
  static constexpr int64_t kBytes = kMin ? 20 : 18;
  TANDEM_AVX512 static inline void Load(const uint8_t* blk, __m512* lo, __m512* hi) {
    uint16_t dh, mh = 0;
    __builtin_memcpy(&dh, blk, 2);
    if constexpr (kMin) __builtin_memcpy(&mh, blk + 2, 2);
    const float df = _cvtsh_ss(dh);
    const __m512 d = _mm512_set1_ps(df);
    const __m512 m = _mm512_set1_ps(kMin ? _cvtsh_ss(mh) : -8.f * df);  // -8d is exact
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (kMin ? 4 : 2)));
    const __m128i nib = _mm_set1_epi8(0x0f);
    const __m128i q_lo = _mm_and_si128(q, nib), q_hi = _mm_and_si128(_mm_srli_epi16(q, 4), nib);
    *lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q_lo)), d, m);
    *hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q_hi)), d, m);
  }
};

// R rows of x against one row of blocks: each block's 32 weights become two
// f32 vectors, used by all R rows; two accumulators per row keep the FMA
// chains apart. With `next`, prefetches the next weight row's block as this
// one is used.
template <typename B, int R, bool kPrefetch = false>
TANDEM_AVX512 inline void TileBlocks(const float* x, int64_t ldx, const uint8_t* w, int64_t K,
                                     float* out, int64_t ldo, const uint8_t* next = nullptr) {
  __m512 acc0[R], acc1[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  const int64_t blocks = K / 32;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * B::kBytes;
    if constexpr (kPrefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(next + b * B::kBytes), _MM_HINT_T0);
    }
    __m512 w0, w1;
    B::Load(blk, &w0, &w1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * ldx + b * 32;
      acc0[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xr), w0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xr + 16), w1, acc1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) out[r * ldo] = ReduceAdd(_mm512_add_ps(acc0[r], acc1[r]));
}

// Rows of blocks (K / 32 per row) to f32.
template <typename B>
TANDEM_AVX512 inline void WidenBlocks(const uint8_t* w, int64_t K, int64_t rows, float* out) {
  for (int64_t b = 0; b < rows * (K / 32); ++b) {
    __m512 lo, hi;
    B::Load(w + b * B::kBytes, &lo, &hi);
    _mm512_storeu_ps(out + b * 32, lo);
    _mm512_storeu_ps(out + b * 32 + 16, hi);
  }
}

template <typename B>
TANDEM_AVX512 void SmallMatmulRowsOfBlocks(const float* x, int64_t ldx, int64_t n,
                                           const uint8_t* w, int64_t K, int64_t j_begin,
                                           int64_t j_end, float* out, int64_t ldo, float* scratch,
                                           int64_t scratch_floats) {
  const int64_t row_bytes = K / 32 * B::kBytes;
  if (n > 8 && scratch != nullptr && 4 * K <= scratch_floats) {
    // More than two groups of rows: widening in registers would redo each
    // block for every group of 4; widen 4 weight rows once into the
    // thread's scratch (cache-resident) and run the f32 tiles over them
    // instead (SmolLM2 q8_0 batch-32 decode at one thread: 182 -> 93 ms; at
    // batch 8 the register path is still faster, 26 against 35 ms).
    int64_t j = j_begin;
    for (; j + 4 <= j_end; j += 4) {
      WidenBlocks<B>(w + j * row_bytes, K, 4, scratch);
      Columns<4, float>(x, ldx, n, scratch, K, out + j, ldo, nullptr);
    }
    for (; j < j_end; ++j) {
      WidenBlocks<B>(w + j * row_bytes, K, 1, scratch);
      Columns<1, float>(x, ldx, n, scratch, K, out + j, ldo, nullptr);
    }
    return;
  }
  for (int64_t j = j_begin; j < j_end; ++j) {
    const uint8_t* wj = w + j * row_bytes;
    const uint8_t* next = j + 1 < j_end ? wj + row_bytes : nullptr;
    int64_t i = 0;
    if (next != nullptr) {  // the first group of rows prefetches the next weight row
      if (n >= 4) {
        TileBlocks<B, 4, true>(x, ldx, wj, K, out + j, ldo, next);
        i = 4;
      } else if (n >= 2) {
        TileBlocks<B, 2, true>(x, ldx, wj, K, out + j, ldo, next);
        i = 2;
      } else {
        TileBlocks<B, 1, true>(x, ldx, wj, K, out + j, ldo, next);
        i = 1;
      }
    }
    for (; i + 4 <= n; i += 4) TileBlocks<B, 4>(x + i * ldx, ldx, wj, K, out + i * ldo + j, ldo);
    for (; i + 2 <= n; i += 2) TileBlocks<B, 2>(x + i * ldx, ldx, wj, K, out + i * ldo + j, ldo);
    for (; i < n; ++i) TileBlocks<B, 1>(x + i * ldx, ldx, wj, K, out + i * ldo + j, ldo);
  }
}

}  // namespace

void SmallMatmulBlocks(DType type, const float* x, int64_t ldx, int64_t n, const uint8_t* w,
                       int64_t K, int64_t j_begin, int64_t j_end, float* out, int64_t ldo,
                       float* scratch, int64_t scratch_floats) {
  switch (type) {
    case DType::kQ8_0:
      return SmallMatmulRowsOfBlocks<Q8_0Block>(x, ldx, n, w, K, j_begin, j_end, out, ldo,
                                                scratch, scratch_floats);
    case DType::kQ4_0:
      return SmallMatmulRowsOfBlocks<Q4Block<false>>(x, ldx, n, w, K, j_begin, j_end, out, ldo,
                                                     scratch, scratch_floats);
    case DType::kQ4_1:
      return SmallMatmulRowsOfBlocks<Q4Block<true>>(x, ldx, n, w, K, j_begin, j_end, out, ldo,
                                                    scratch, scratch_floats);
    default:
      TANDEM_CHECK(false) << "not a block type: " << DTypeName(type);
  }
}

namespace {

// Blocks of 64 rows of x stay in L2 while a slice's weight rows pass, 4 at a
// time (then 1) from L1 across the block's rows, through Kernel::Rows<C>.
// (Plain C++: the kernels carry the target attributes.)
template <typename Kernel, typename W>
void OverRowBlocks(const float* x, int64_t ldx, int64_t n, const W* w, int64_t K,
                   int64_t j_begin, int64_t j_end, float* out, int64_t ldo) {
  constexpr int64_t kRowBlock = 64;
  for (int64_t i0 = 0; i0 < n; i0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, n - i0);
    const float* xb = x + i0 * ldx;
    float* ob = out + i0 * ldo;
    int64_t j = j_begin;
    for (; j + 4 <= j_end; j += 4) Kernel::template Rows<4>(xb, ldx, rows, w + j * K, K, ob + j, ldo);
    for (; j < j_end; ++j) Kernel::template Rows<1>(xb, ldx, rows, w + j * K, K, ob + j, ldo);
  }
}

struct F32Tiles {
  template <int C>
  TANDEM_AVX512 static void Rows(const float* x, int64_t ldx, int64_t n, const float* w, int64_t K,
                                 float* out, int64_t ldo) {
    Columns<C, float>(x, ldx, n, w, K, out, ldo, nullptr);
  }
};

}  // namespace

void LargeMatmul(const float* x, int64_t ldx, int64_t n, const float* w, int64_t K,
                 int64_t j_begin, int64_t j_end, float* out, int64_t ldo) {
  OverRowBlocks<F32Tiles>(x, ldx, n, w, K, j_begin, j_end, out, ldo);
}

namespace {

#define TANDEM_AVX512_BF16                                                          \
  __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,fma,f16c"), \
                 no_sanitize("thread")))

// 32 f32 of x (masked to `m` lanes of 32) as 32 bf16, rounded to nearest even.
TANDEM_AVX512_BF16 inline __m512bh XToBf16(const float* p, __mmask32 m) {
  const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m), p);
  const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m >> 16), p + 16);
  return _mm512_cvtne2ps_pbh(hi, lo);
}

// An R x C tile of x rows (f32, rounded to bf16 as they are loaded) against
// bf16 weight rows with vdpbf16ps: 32 products per instruction into f32
// accumulators, reduced at the end.
template <int R, int C>
TANDEM_AVX512_BF16 inline void TileDpBf16(const float* x, int64_t ldx, const uint16_t* w,
                                          int64_t K, float* out, int64_t ldo) {
  __m512 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    const __mmask32 m = K - k >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << (K - k)) - 1u);
    __m512bh wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      wv[c] = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, w + c * K + k));
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = XToBf16(x + r * ldx + k, m);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  StoreSums<R, C>(acc, out, ldo);
}

struct DpBf16Tiles {
  template <int C>
  TANDEM_AVX512_BF16 static void Rows(const float* x, int64_t ldx, int64_t n, const uint16_t* w,
                                      int64_t K, float* out, int64_t ldo) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) TileDpBf16<4, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo);
    for (; i < n; ++i) TileDpBf16<1, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo);
  }
};

}  // namespace

void MatmulDpBf16(const float* x, int64_t ldx, int64_t n, const uint16_t* w, int64_t K,
                  int64_t j_begin, int64_t j_end, float* out, int64_t ldo) {
  OverRowBlocks<DpBf16Tiles>(x, ldx, n, w, K, j_begin, j_end, out, ldo);
}

namespace {

// Where BroadcastTile finds row k of b: `ld` floats apart, or (for decode
// attention, reading the cache in place) at base + off[k], f32 or bf16 bits.
struct StridedRows {
  const float* b;
  int64_t ld;
  const float* operator()(int64_t k) const { return b + k * ld; }
};
template <typename W>
struct OffsetRows {
  const W* base;
  const int64_t* off;
  const W* operator()(int64_t k) const { return base + off[k]; }
};

// out[r, :16 C] = scale * sum_k a[r, k] * b[k, :16 C] for r < R, k < inner
// (a rows `lda` apart, b's rows where `rows` says): for each k, b's row is
// loaded once and each a[r, k] broadcast into R x C FMAs (outer-product
// form: no reduction at the end). With kTail the last vector of each row
// holds the lanes of `last` only (loads and stores masked).
template <int R, int C, bool kTail = false, typename Rows>
TANDEM_AVX512 inline void BroadcastTile(const float* a, int64_t lda, int64_t inner, Rows rows,
                                        float scale, float* out, int64_t ldo,
                                        __mmask16 last = 0xFFFF) {
  __m512 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < inner; ++k) {
    const auto* b = rows(k);
    __m512 bv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      bv[c] = kTail && c == C - 1 ? MaskLoad(last, b + c * 16) : Load(b + c * 16);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 ab = _mm512_set1_ps(a[r * lda + k]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(ab, bv[c], acc[r][c]);
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const __m512 v = _mm512_mul_ps(acc[r][c], s);
      if (kTail && c == C - 1) {
        _mm512_mask_storeu_ps(out + r * ldo + c * 16, last, v);
      } else {
        _mm512_storeu_ps(out + r * ldo + c * 16, v);
      }
    }
}

// BroadcastTile over all rows: R at a time, then one by one.
template <int R, int C, bool kTail = false, typename Rows>
TANDEM_AVX512 inline void BroadcastRows(const float* a, int64_t lda, int64_t rows, int64_t inner,
                                        Rows b, float scale, float* out, int64_t ldo,
                                        __mmask16 last = 0xFFFF) {
  int64_t r = 0;
  for (; r + R <= rows; r += R) {
    BroadcastTile<R, C, kTail>(a + r * lda, lda, inner, b, scale, out + r * ldo, ldo, last);
  }
  for (; r < rows; ++r) {
    BroadcastTile<1, C, kTail>(a + r * lda, lda, inner, b, scale, out + r * ldo, ldo, last);
  }
}

TANDEM_AVX512 void ScoresAvx512(const float* q, int64_t ldq, int64_t rows, const float* kt,
                                int64_t ldkt, int64_t ctx, int hd, float scale, float* s,
                                int64_t lds) {
  // Columns of 64 keys outer: that slice of kt (hd x 64 floats) stays in L1
  // while every row passes.
  int64_t j = 0;
  for (; j + 64 <= ctx; j += 64) {
    BroadcastRows<4, 4>(q, ldq, rows, hd, StridedRows{kt + j, ldkt}, scale, s + j, lds);
  }
  for (; j + 16 <= ctx; j += 16) {
    BroadcastRows<4, 1>(q, ldq, rows, hd, StridedRows{kt + j, ldkt}, scale, s + j, lds);
  }
  if (j < ctx) {
    BroadcastRows<4, 1, true>(q, ldq, rows, hd, StridedRows{kt + j, ldkt}, scale, s + j, lds,
                              TailMask(ctx - j));
  }
}

}  // namespace

bool AttentionScores(const float* q, int64_t ldq, int64_t rows, const float* kt, int64_t ldkt,
                     int64_t ctx, int hd, float scale, float* s, int64_t lds) {
  if (!HasAvx512()) return false;
  ScoresAvx512(q, ldq, rows, kt, ldkt, ctx, hd, scale, s, lds);
  return true;
}

bool AttentionPv(const float* p, int64_t ldp, int64_t rows, const float* v, int64_t ctx, int hd,
                 float* out, int64_t ldo) {
  if (!HasAvx512()) return false;
  const StridedRows rows_of_v{v, hd};
  if (hd == 64) return BroadcastRows<4, 4>(p, ldp, rows, ctx, rows_of_v, 1.f, out, ldo), true;
  if (hd == 128) return BroadcastRows<2, 8>(p, ldp, rows, ctx, rows_of_v, 1.f, out, ldo), true;
  return false;
}

namespace {

// 4 weight rows at a time: the same x rows are reused from L1 while the
// weights stream from memory once.
template <typename W>
TANDEM_AVX512 void SmallMatmulRows(const float* x, int64_t ldx, int64_t n, const W* w, int64_t K,
                                   int64_t j_begin, int64_t j_end, float* out, int64_t ldo) {
  int64_t j = j_begin;
  for (; j + 4 <= j_end; j += 4) {
    const W* next = j + 8 <= j_end ? w + (j + 4) * K : nullptr;
    Columns<4, W>(x, ldx, n, w + j * K, K, out + j, ldo, next);
  }
  for (; j < j_end; ++j) Columns<1, W>(x, ldx, n, w + j * K, K, out + j, ldo, nullptr);
}

}  // namespace

void SmallMatmul(const float* x, int64_t ldx, int64_t n, const float* w, int64_t K,
                 int64_t j_begin, int64_t j_end, float* out, int64_t ldo) {
  SmallMatmulRows<float>(x, ldx, n, w, K, j_begin, j_end, out, ldo);
}

void SmallMatmulBf16(const float* x, int64_t ldx, int64_t n, const uint16_t* w, int64_t K,
                     int64_t j_begin, int64_t j_end, float* out, int64_t ldo) {
  SmallMatmulRows<uint16_t>(x, ldx, n, w, K, j_begin, j_end, out, ldo);
}

namespace {

TANDEM_AVX512 float DotAvx512(const float* a, const float* b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), Load(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), Load(b + i + 16), acc1);
  }
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), Load(b + i), acc0);
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), MaskLoad(m, b + i), acc1);
  }
  return ReduceAdd(_mm512_add_ps(acc0, acc1));
}

// f32 to bf16, rounding to nearest even, 16 at a time with AVX512-BF16's
// vcvtneps2bf16 (the same rounding as the portable loop for every non-NaN).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"), no_sanitize("thread")))
void ToBf16Avx512(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), reinterpret_cast<const __m256i&>(h));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i));
    _mm256_mask_storeu_epi16(out + i, m, reinterpret_cast<const __m256i&>(h));
  }
}

// exp of 16 lanes: x = n ln2 + r with |r| <= ln2/2, exp(r) by Cephes' expf
// polynomial, times 2^n by scalef (which also flushes large negative x to 0).
TANDEM_AVX512 inline __m512 Exp(__m512 x) {
  // Below -110 the result is 0 (scalef underflows); above 89, infinity.
  x = Min(Max(x, _mm512_set1_ps(-110.0f)), _mm512_set1_ps(89.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(y, n);
}

TANDEM_AVX512 void SoftmaxAvx512(float* x, int64_t n) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) mx = Max(mx, _mm512_loadu_ps(x + i));
  float max_score = ReduceMax(mx);
  for (int64_t j = i; j < n; ++j) max_score = std::max(max_score, x[j]);
  const __m512 m = _mm512_set1_ps(max_score);
  __m512 sum = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = Exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
    _mm512_storeu_ps(x + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    const __m512 e = Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m));
    _mm512_mask_storeu_ps(x + i, k, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
  }
  const __m512 inv = _mm512_set1_ps(1.f / ReduceAdd(sum));
  for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv));
  }
}

TANDEM_AVX512 void SiluMulAvx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, Exp(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
  }
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(k, gate + i);
    const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, Exp(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(k, up + i)));
  }
}

TANDEM_AVX512 void RmsNormRowAvx512(const float* base, const float* add, float* sum,
                                    const float* w, float eps, int64_t n, float* out) {
  __m512 ss = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16{0xFFFF} : TailMask(n - i);
    __m512 y = _mm512_maskz_loadu_ps(m, base + i);
    if (add != nullptr) {
      y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, add + i));
      _mm512_mask_storeu_ps(sum + i, m, y);
    }
    ss = _mm512_fmadd_ps(y, y, ss);
  }
  const float* y = add != nullptr ? sum : base;
  const __m512 inv = _mm512_set1_ps(1.f / std::sqrt(ReduceAdd(ss) / static_cast<float>(n) + eps));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16{0xFFFF} : TailMask(n - i);
    _mm512_mask_storeu_ps(out + i, m,
                          _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), inv),
                                        _mm512_maskz_loadu_ps(m, w + i)));
  }
}

TANDEM_AVX512 float ExpAvx512(float x) {
  float out[16];
  _mm512_storeu_ps(out, Exp(_mm512_set1_ps(x)));
  return out[0];
}

}  // namespace

#else  // !TANDEM_X86

namespace {
[[noreturn]] void NotX86(const char* kernel) {
  TANDEM_CHECK(false) << kernel << " is an AVX-512 kernel: callers check HasAvx512(), which is "
                        "false on this architecture";
  __builtin_unreachable();
}
}  // namespace

void SmallMatmulBlocks(DType, const float*, int64_t, int64_t, const uint8_t*, int64_t, int64_t,
                       int64_t, float*, int64_t, float*, int64_t) {
  NotX86("SmallMatmulBlocks");
}
void LargeMatmul(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, float*,
                 int64_t) {
  NotX86("LargeMatmul");
}
void MatmulDpBf16(const float*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, int64_t,
                  float*, int64_t) {
  NotX86("MatmulDpBf16");
}
void SmallMatmul(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, float*,
                 int64_t) {
  NotX86("SmallMatmul");
}
void SmallMatmulBf16(const float*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, int64_t,
                     float*, int64_t) {
  NotX86("SmallMatmulBf16");
}
bool AttentionScores(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int, float,
                     float*, int64_t) {
  return false;
}
bool AttentionPv(const float*, int64_t, int64_t, const float*, int64_t, int, float*, int64_t) {
  return false;
}

#endif  // TANDEM_X86

bool HasAvx512() {
#if TANDEM_X86
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return has;
#else
  return false;
#endif
}

bool HasAvx512Bf16() {
#if TANDEM_X86
  static const bool has = HasAvx512() && __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

void Softmax(float* x, int64_t n) {
#if TANDEM_X86
  if (n > 0 && HasAvx512()) return SoftmaxAvx512(x, n);
#endif
  SoftmaxPortable(x, n);
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
#if TANDEM_X86
  if (HasAvx512()) return SiluMulAvx512(gate, up, out, n);
#endif
  SiluMulPortable(gate, up, out, n);
}

void RmsNormRow(const float* base, const float* add, float* sum, const float* w, float eps,
                int64_t n, float* out) {
#if TANDEM_X86
  if (HasAvx512()) return RmsNormRowAvx512(base, add, sum, w, eps, n, out);
#endif
  RmsNormRowPortable(base, add, sum, w, eps, n, out);
}

float ExpForTest(float x) {
#if TANDEM_X86
  if (HasAvx512()) return ExpAvx512(x);
#endif
  return std::exp(x);
}

float Dot(const float* a, const float* b, int64_t n) {
#if TANDEM_X86
  if (HasAvx512()) return DotAvx512(a, b, n);
#endif
  return DotF32(a, b, n);
}

namespace {
#if TANDEM_X86

// The lanes of q * kr over D vectors, not yet summed.
template <int D, typename W>
TANDEM_AVX512 inline __m512 DotLanes(const __m512 (&q)[D], const W* kr) {
  __m512 a = _mm512_mul_ps(q[0], Load(kr));
#pragma GCC unroll 8
  for (int d = 1; d < D; ++d) a = _mm512_fmadd_ps(q[d], Load(kr + d * 16), a);
  return a;
}

// s[j] = scale * dot(q, k + off[j]) over D vectors, 16 keys at a time.
template <int D, typename W>
TANDEM_AVX512 void DecodeScores(const float* q, const W* k, const int64_t* off, int64_t ctx,
                                float scale, float* s) {
  __m512 qv[D];
#pragma GCC unroll 8
  for (int d = 0; d < D; ++d) qv[d] = _mm512_loadu_ps(q + d * 16);
  const __m512 sc = _mm512_set1_ps(scale);
  int64_t j = 0;
  for (; j + 16 <= ctx; j += 16) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = DotLanes<D>(qv, k + off[j + i]);
    _mm512_storeu_ps(s + j, _mm512_mul_ps(Reduce16(acc), sc));
  }
  for (; j < ctx; ++j) s[j] = ReduceAdd(DotLanes<D>(qv, k + off[j])) * scale;
}

template <int D, typename W>
TANDEM_AVX512 void DecodeGroup(const float* q, int rows, const W* k, const W* v,
                               const int64_t* off, int64_t ctx, float scale, float* s,
                               float* out) {
  constexpr int64_t hd = D * 16;
  for (int r = 0; r < rows; ++r) {
    DecodeScores<D>(q + r * hd, k, off, ctx, scale, s + r * ctx);
    SoftmaxAvx512(s + r * ctx, ctx);
  }
  // V rows are read once per pair of heads (the accumulators of two heads
  // of 128 dims fill the registers).
  BroadcastRows<2, D>(s, ctx, rows, ctx, OffsetRows<W>{v, off}, 1.f, out, hd);
}

#endif  // TANDEM_X86

template <typename W>
bool AttentionDecodeImpl(const float* q, int rows, int hd, const W* k, const W* v,
                         const int64_t* off, int64_t ctx, float scale, float* s, float* out) {
#if TANDEM_X86
  if (!HasAvx512()) return false;
  if (hd == 64) return DecodeGroup<4>(q, rows, k, v, off, ctx, scale, s, out), true;
  if (hd == 128) return DecodeGroup<8>(q, rows, k, v, off, ctx, scale, s, out), true;
#endif
  return false;
}

}  // namespace

bool AttentionDecode(const float* q, int rows, int hd, const float* k, const float* v,
                     const int64_t* off, int64_t ctx, float scale, float* s, float* out) {
  return AttentionDecodeImpl(q, rows, hd, k, v, off, ctx, scale, s, out);
}

bool AttentionDecode(const float* q, int rows, int hd, const uint16_t* k, const uint16_t* v,
                     const int64_t* off, int64_t ctx, float scale, float* s, float* out) {
  return AttentionDecodeImpl(q, rows, hd, k, v, off, ctx, scale, s, out);
}

void ToBf16(const float* x, uint16_t* out, int64_t n) {
#if TANDEM_X86
  if (HasAvx512Bf16()) return ToBf16Avx512(x, out, n);
#endif
  ConvertFromF32(x, DType::kBF16, out, n);
}

}  // namespace tandem::cpu
