// The one x86 specialization beside the portable kernels (cpu_kernels.h
// says where it pays): bf16 dot products with AVX512-BF16's vdpbf16ps.
// Highway 1.0.3 has no target with AVX512-BF16, so it is written with the
// intrinsics, under a target attribute, and chosen at run time.
#include "common/kernels/cpu/cpu_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>

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

// x's rows [0, n) rounded to bf16 (ToBf16: nearest even), `ldb` elements
// apart with zeros from K up to ldb (a multiple of 32).
inline void RowsToBf16(const float* x, int64_t ldx, int64_t n, int64_t K, uint16_t* xb,
                       int64_t ldb) {
  for (int64_t i = 0; i < n; ++i) {
    ToBf16(x + i * ldx, xb + i * ldb, K);
    std::fill(xb + i * ldb + K, xb + (i + 1) * ldb, uint16_t{0});
  }
}

// An R x C tile of x rows (already bf16, `ldb` apart, zero past K) against
// bf16 weight rows with vdpbf16ps: 32 products per instruction into f32
// accumulators, reduced at the end.
template <int R, int C>
TANDEM_AVX512_BF16 inline void TileDpBf16(const uint16_t* x, int64_t ldb, const uint16_t* w,
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
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x + r * ldb + k));
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
TANDEM_AVX512_BF16 void RowsDpBf16(const uint16_t* x, int64_t ldb, int64_t n, const uint16_t* w,
                                   int64_t K, float* out, int64_t ldo) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) TileDpBf16<4, C>(x + i * ldb, ldb, w, K, out + i * ldo, ldo);
  for (; i < n; ++i) TileDpBf16<1, C>(x + i * ldb, ldb, w, K, out + i * ldo, ldo);
}

}  // namespace

bool HasAvx512Bf16() {
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bf16");
  return cpu && TargetHasAvx512();
}

namespace {

// Seconds per instruction of 12 independent chains of vdpbf16ps (dp) or of
// vfmadd231ps, the fastest of 5 runs of 20,000 rounds. The chains are
// variables, not an array, and the empty asm names them all once a round:
// an array of them was stored every instruction, and the stores, not the
// FMAs, set the rate.
template <bool kDp>
TANDEM_AVX512_BF16 __attribute__((noinline)) double SecondsPerInstruction() {
  constexpr int kRounds = 20000;
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // 1.0
  const __m512 f = _mm512_set1_ps(1e-9f);
  double best = 1e9;
  for (int run = 0; run < 5; ++run) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kRounds; ++i) {
#define TANDEM_PROBE_OP(a) a = kDp ? _mm512_dpbf16_ps(a, b, b) : _mm512_fmadd_ps(f, f, a);
      TANDEM_PROBE_OP(a0) TANDEM_PROBE_OP(a1) TANDEM_PROBE_OP(a2) TANDEM_PROBE_OP(a3)
      TANDEM_PROBE_OP(a4) TANDEM_PROBE_OP(a5) TANDEM_PROBE_OP(a6) TANDEM_PROBE_OP(a7)
      TANDEM_PROBE_OP(a8) TANDEM_PROBE_OP(a9) TANDEM_PROBE_OP(a10) TANDEM_PROBE_OP(a11)
#undef TANDEM_PROBE_OP
      asm volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6),
                   "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));
    }
    const std::chrono::duration<double> t = std::chrono::steady_clock::now() - t0;
    best = std::min(best, t.count() / (double{kRounds} * 12));
  }
  return best;
}

}  // namespace

double DpBf16Speedup() {
  static const double speedup = HasAvx512Bf16() ? 2 * SecondsPerInstruction<false>() /
                                                      SecondsPerInstruction<true>()
                                                : 0;
  return speedup;
}

bool PreferDpBf16() { return DpBf16Speedup() > 1; }

int64_t MatmulDpBf16ScratchElems(int64_t K) { return kDpBf16RowBlock * ((K + 31) / 32 * 32); }

void MatmulDpBf16(const float* x, int64_t ldx, int64_t n, const uint16_t* w, int64_t K,
                  int64_t j0, int64_t j1, float* out, int64_t ldo, uint16_t* scratch) {
  // Each block of rows of x rounded to bf16 once, into `scratch`, then
  // multiplied by every tile of weight columns: rounding inside the tiles
  // cost a conversion and a second load for every four vdpbf16ps, and a
  // 512-token bf16 prefill on an Intel Xeon (family 6 model 207) took
  // 2.53-2.60 s that way against 1.75-1.80 s this way at one thread
  // (docs/benchmarks.md, "bf16 prefill on Intel"). The same bits: the same
  // rounding, zeros past K where the tiles masked.
  const int64_t ldb = (K + 31) / 32 * 32;
  for (int64_t i0 = 0; i0 < n; i0 += kDpBf16RowBlock) {
    const int64_t rows = std::min(kDpBf16RowBlock, n - i0);
    RowsToBf16(x + i0 * ldx, ldx, rows, K, scratch, ldb);
    ForEachTileGroup(rows, j0, j1, [&](int64_t, int64_t r, int64_t j, int c) {
      float* ob = out + i0 * ldo + j;
      if (c == 4) return RowsDpBf16<4>(scratch, ldb, r, w + j * K, K, ob, ldo);
      RowsDpBf16<1>(scratch, ldb, r, w + j * K, K, ob, ldo);
    });
  }
}

#else  // !__x86_64__

bool HasAvx512Bf16() { return false; }
double DpBf16Speedup() { return 0; }
bool PreferDpBf16() { return false; }

int64_t MatmulDpBf16ScratchElems(int64_t K) { return kDpBf16RowBlock * ((K + 31) / 32 * 32); }

void MatmulDpBf16(const float*, int64_t, int64_t, const uint16_t*, int64_t, int64_t, int64_t,
                  float*, int64_t, uint16_t*) {
  TANDEM_CHECK(false) << "MatmulDpBf16 is an x86 kernel: callers check HasAvx512Bf16(), which "
                         "is false on this architecture";
}

#endif

}  // namespace tandem::cpu
