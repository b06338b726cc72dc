#include "common/kernels/cpu/cpu_kernels.h"

#include <immintrin.h>

namespace tandem::cpu {
namespace {

#define TANDEM_AVX512 __attribute__((target("avx512f,avx512dq,fma")))

TANDEM_AVX512 inline __mmask16 TailMask(int64_t left) {
  return static_cast<__mmask16>((1u << left) - 1u);
}

// The sum of a vector's 16 lanes. (GCC 12's _mm512_reduce_add_ps trips its
// own -Wuninitialized on an intrinsic's undefined operand, so the masked
// forms with explicit operands.)
TANDEM_AVX512 inline float ReduceAdd(__m512 v) {
  __m512 t = _mm512_add_ps(v, _mm512_mask_shuffle_f32x4(v, 0xFFFF, v, v, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm512_add_ps(t, _mm512_mask_shuffle_f32x4(t, 0xFFFF, t, t, _MM_SHUFFLE(2, 3, 0, 1)));
  __m128 s = _mm512_mask_extractf32x4_ps(_mm_setzero_ps(), 0xF, t, 0);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// An R x C tile: R rows of x against C rows of w. Each w vector is loaded
// once per k-step and used by R rows; the accumulators stay in registers.
template <int R, int C>
TANDEM_AVX512 inline void Tile(const float* x, int64_t ldx, const float* w, int64_t K,
                               float* out, int64_t ldo) {
  // Fully unrolled (R and C are constants), so that the accumulators live in
  // registers.
  __m512 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_ps(w + c * K + k);
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
    for (int c = 0; c < C; ++c) wv[c] = _mm512_maskz_loadu_ps(m, w + c * K + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + r * ldx + k);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) out[r * ldo + c] = ReduceAdd(acc[r][c]);
}

// Rows of x in groups of 4 (then 2, 1) against one group of C weight rows.
template <int C>
TANDEM_AVX512 inline void Columns(const float* x, int64_t ldx, int64_t n, const float* w,
                                  int64_t K, float* out, int64_t ldo) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) Tile<4, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo);
  for (; i + 2 <= n; i += 2) Tile<2, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo);
  for (; i < n; ++i) Tile<1, C>(x + i * ldx, ldx, w, K, out + i * ldo, ldo);
}

}  // namespace

bool HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return has;
}

TANDEM_AVX512 void SmallMatmul(const float* x, int64_t ldx, int64_t n, const float* w, int64_t K,
                               int64_t j_begin, int64_t j_end, float* out, int64_t ldo) {
  // 4 weight rows at a time: the same x rows are reused from L1 while the
  // weights stream from memory once.
  int64_t j = j_begin;
  for (; j + 4 <= j_end; j += 4) Columns<4>(x, ldx, n, w + j * K, K, out + j, ldo);
  for (; j < j_end; ++j) Columns<1>(x, ldx, n, w + j * K, K, out + j, ldo);
}

namespace {

TANDEM_AVX512 float DotAvx512(const float* a, const float* b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc1);
  }
  return ReduceAdd(_mm512_add_ps(acc0, acc1));
}

TANDEM_AVX512 void AxpyAvx512(float alpha, const float* x, float* y, int64_t n) {
  const __m512 a = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(a, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(
        y + i, m, _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

}  // namespace

float Dot(const float* a, const float* b, int64_t n) {
  if (HasAvx512()) return DotAvx512(a, b, n);
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void Axpy(float alpha, const float* x, float* y, int64_t n) {
  if (HasAvx512()) return AxpyAvx512(alpha, x, y, n);
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

}  // namespace tandem::cpu
