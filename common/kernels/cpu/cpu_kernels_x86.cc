// The one x86 specialization beside the portable kernels (cpu_kernels.h
// says where it pays): bf16 dot products with AVX512-BF16's vdpbf16ps.
// Highway 1.0.3 has no target with AVX512-BF16, so it is written with the
// intrinsics, under a target attribute, and chosen at run time.
#include "common/kernels/cpu/cpu_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/base/logging.h"

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_ps() as a merge operand
// and then warn about it in every caller (GCC bug 105593): not our code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tandem::cpu {

#if defined(__x86_64__)
namespace {

// Uninstrumented by ThreadSanitizer, like hwy_kernels.cc: the kernel reads
// and writes only the ranges it is given.
#define TANDEM_AVX512_BF16                                                          \
  __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx512bf16,fma,f16c"), \
                 no_sanitize("thread")))

// 32 f32 of x (masked to `m` lanes of 32) as 32 bf16, rounded to nearest even.
TANDEM_AVX512_BF16 inline __m512bh XToBf16(const float* p, __mmask32 m) {
  const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m), p);
  const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(m >> 16), p + 16);
  return _mm512_cvtne2ps_pbh(hi, lo);
}

// The sum of a vector's 16 lanes (the masked forms: the unmasked reduction
// trips GCC 12's warning).
TANDEM_AVX512_BF16 inline float ReduceAdd(__m512 v) {
  __m512 t = _mm512_add_ps(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm512_add_ps(t, _mm512_mask_shuffle_f32x4(t, 0xFFFF, t, t, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 s = _mm512_mask_extractf32x4_ps(_mm_setzero_ps(), 0xF, t, 0);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ps(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane j of the result = the sum of the 16 lanes of a[j], for 16 vectors:
// a transposing tree of 45 shuffles and adds instead of 16 reductions of
// ~8 dependent steps each (with 16 ReduceAdd a 512-token bf16 prefill took
// 300 against 265 ms at two threads).
TANDEM_AVX512_BF16 inline __m512 Reduce16(const __m512 (&a)[16]) {
  __m512 t[8];  // per 128-bit lane [a0+a2, b0+b2, a1+a3, b1+b3]
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  __m512 u[4];  // per 128-bit lane L, the sums over L of 4 vectors
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88),
                                   _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88),
                                   _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xDD));
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

template <int C>
TANDEM_AVX512_BF16 void RowsDpBf16(const float* x, int64_t ldx, int64_t n, const uint16_t* w,
                                   int64_t K, float* out, int64_t ldo) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) TileDpBf16<4, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo);
  for (; i < n; ++i) TileDpBf16<1, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo);
}

}  // namespace

bool HasAvx512Bf16() {
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bf16");
  return cpu && TargetHasAvx512();
}

void MatmulDpBf16(const float* x, int64_t ldx, int64_t n, const uint16_t* w, int64_t K,
                  int64_t j0, int64_t j1, float* out, int64_t ldo) {
  ForEachTileGroup(n, j0, j1, [&](int64_t i0, int64_t rows, int64_t j, int c) {
    const float* xb = x + i0 * ldx;
    float* ob = out + i0 * ldo + j;
    if (c == 4) return RowsDpBf16<4>(xb, ldx, rows, w + j * K, K, ob, ldo);
    RowsDpBf16<1>(xb, ldx, rows, w + j * K, K, ob, ldo);
  });
}

#else  // !__x86_64__

bool HasAvx512Bf16() { return false; }

void MatmulDpBf16(const float*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, int64_t,
                  float*, int64_t) {
  TANDEM_CHECK(false) << "MatmulDpBf16 is an x86 kernel: callers check HasAvx512Bf16(), which "
                         "is false on this architecture";
}

#endif

}  // namespace tandem::cpu
