#include "tools/compute_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>
#endif

// GCC 12's AVX-512 intrinsics pass _mm512_undefined_ps() as a merge operand
// and then warn about it in every caller (GCC bug 105593): not our code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tandem {
namespace {

// The inputs come from volatile memory, so the compiler cannot fold the
// multiply-adds into additions of a constant.
volatile float kOneF32 = 1.0f;
volatile int32_t kOnesI8 = 0x01010101;      // four int8 (or uint8) ones
volatile int32_t kOnesBf16 = 0x3F803F80;  // two bf16 ones
// The accumulators' starting values (all zero), each read on its own: the
// compiler cannot tell the twelve chains are the same and merge them.
volatile float kStartF32[12] = {};
volatile int32_t kStartI32[12] = {};

// One kernel: NAME runs `iterations` rounds of twelve independent chains
// (accumulators of type ACC, the k-th starting at INIT(k)), STEP(a) one
// multiply-add of `x` (X, of type XTYPE) into a; it returns the sum of the
// accumulators' lanes (SUM of each). A macro rather than a template: each
// kernel needs its own target attribute for its intrinsics to inline.
#define TANDEM_PROBE_KERNEL(ATTR, NAME, XTYPE, X, ACC, INIT, STEP, SUM)                 \
  ATTR double NAME(int64_t iterations) {                                              \
    const XTYPE x = X;                                                                \
    ACC a0 = INIT(0), a1 = INIT(1), a2 = INIT(2), a3 = INIT(3), a4 = INIT(4),         \
        a5 = INIT(5), a6 = INIT(6), a7 = INIT(7), a8 = INIT(8), a9 = INIT(9),         \
        a10 = INIT(10), a11 = INIT(11);                                               \
    for (int64_t i = 0; i < iterations; ++i) {                                        \
      STEP(a0);                                                                       \
      STEP(a1);                                                                       \
      STEP(a2);                                                                       \
      STEP(a3);                                                                       \
      STEP(a4);                                                                       \
      STEP(a5);                                                                       \
      STEP(a6);                                                                       \
      STEP(a7);                                                                       \
      STEP(a8);                                                                       \
      STEP(a9);                                                                       \
      STEP(a10);                                                                      \
      STEP(a11);                                                                      \
    }                                                                                 \
    return double(SUM(a0)) + SUM(a1) + SUM(a2) + SUM(a3) + SUM(a4) + SUM(a5) +        \
           SUM(a6) + SUM(a7) + SUM(a8) + SUM(a9) + SUM(a10) + SUM(a11);               \
  }

#if defined(__x86_64__)

#define TANDEM_AVX2 __attribute__((target("avx2,fma")))
#define TANDEM_AVX512 __attribute__((target("avx512f")))
#define TANDEM_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define TANDEM_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define TANDEM_AVX_VNNI __attribute__((target("avx2,avxvnni")))

// The sum of a vector's lanes, exact for the probe's small integers.
template <typename V, typename T, int N>
T SumStored(const V& v) {
  T lanes[N];
  std::memcpy(lanes, &v, sizeof(lanes));
  T s = 0;
  for (T x : lanes) s += x;
  return s;
}
#define SUM_F256(a) (SumStored<__m256, float, 8>(a))
#define SUM_I256(a) (SumStored<__m256i, int32_t, 8>(a))
#define SUM_F512(a) (SumStored<__m512, float, 16>(a))
#define SUM_I512(a) (SumStored<__m512i, int32_t, 16>(a))
#define INIT_F256(k) _mm256_set1_ps(kStartF32[k])
#define INIT_I256(k) _mm256_set1_epi32(kStartI32[k])
#define INIT_F512(k) _mm512_set1_ps(kStartF32[k])
#define INIT_I512(k) _mm512_set1_epi32(kStartI32[k])
#define STEP_FMA256(a) a = _mm256_fmadd_ps(x, x, a)
#define STEP_FMA512(a) a = _mm512_fmadd_ps(x, x, a)
#define STEP_BF16_512(a) a = _mm512_dpbf16_ps(a, x, x)
#define STEP_VNNI512(a) a = _mm512_dpbusd_epi32(a, x, x)
#define STEP_AVX_VNNI(a) a = _mm256_dpbusd_avx_epi32(a, x, x)

TANDEM_PROBE_KERNEL(TANDEM_AVX2, FmaAvx2, __m256, _mm256_set1_ps(kOneF32), __m256, INIT_F256,
                    STEP_FMA256, SUM_F256)
TANDEM_PROBE_KERNEL(TANDEM_AVX512, FmaAvx512, __m512, _mm512_set1_ps(kOneF32), __m512, INIT_F512,
                    STEP_FMA512, SUM_F512)
TANDEM_PROBE_KERNEL(TANDEM_AVX512_BF16, DotBf16Avx512, __m512bh,
                    (__m512bh)_mm512_set1_epi32(kOnesBf16), __m512, INIT_F512, STEP_BF16_512,
                    SUM_F512)
TANDEM_PROBE_KERNEL(TANDEM_AVX512_VNNI, DotInt8Avx512, __m512i, _mm512_set1_epi32(kOnesI8),
                    __m512i, INIT_I512, STEP_VNNI512, SUM_I512)
TANDEM_PROBE_KERNEL(TANDEM_AVX_VNNI, DotInt8AvxVnni, __m256i, _mm256_set1_epi32(kOnesI8),
                    __m256i, INIT_I256, STEP_AVX_VNNI, SUM_I256)

// AVX-VNNI (CPUID leaf 7, subleaf 1, EAX bit 4): clang 14's
// __builtin_cpu_supports has no name for it.
bool HasAvxVnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __builtin_cpu_supports("avx2") && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
}

#elif defined(__aarch64__)

#define SUM_F128(a) vaddvq_f32(a)
#define SUM_I128(a) vaddvq_s32(a)
#define INIT_F128(k) vdupq_n_f32(kStartF32[k])
#define INIT_I128(k) vdupq_n_s32(kStartI32[k])
#define STEP_FMLA(a) a = vfmaq_f32(a, x, x)
#define STEP_SDOT(a) a = vdotq_s32(a, x, x)

TANDEM_PROBE_KERNEL(, FmaNeon, float32x4_t, vdupq_n_f32(kOneF32), float32x4_t, INIT_F128, STEP_FMLA,
                    SUM_F128)
TANDEM_PROBE_KERNEL(__attribute__((target("arch=armv8.2-a+dotprod"))), DotInt8Sdot, int8x16_t,
                    vreinterpretq_s8_s32(vdupq_n_s32(kOnesI8)), int32x4_t, INIT_I128, STEP_SDOT,
                    SUM_I128)

#endif


}  // namespace

std::vector<ProbeKernel> SupportedProbeKernels() {
  std::vector<ProbeKernel> k;
  // Operations per round: 12 instructions x products per instruction x 2.
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) {
    k.push_back({"f32 FMA", "vfmadd231ps zmm (AVX-512)", 12 * 16 * 2, &FmaAvx512});
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    k.push_back({"f32 FMA", "vfmadd231ps ymm (AVX2)", 12 * 8 * 2, &FmaAvx2});
  }
  if (avx512 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bf16")) {
    k.push_back({"bf16 dot", "vdpbf16ps zmm (AVX512-BF16)", 12 * 32 * 2, &DotBf16Avx512});
  }
  if (avx512 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni")) {
    k.push_back({"int8 dot", "vpdpbusd zmm (AVX512-VNNI)", 12 * 64 * 2, &DotInt8Avx512});
  } else if (HasAvxVnni()) {
    k.push_back({"int8 dot", "vpdpbusd ymm (AVX-VNNI)", 12 * 32 * 2, &DotInt8AvxVnni});
  }
#elif defined(__aarch64__)
  k.push_back({"f32 FMA", "fmla v.4s (NEON)", 12 * 4 * 2, &FmaNeon});
  if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) {
    k.push_back({"int8 dot", "sdot v.4s (Armv8.2 dot product)", 12 * 16 * 2, &DotInt8Sdot});
  }
#endif
  return k;
}

std::vector<ComputePeak> MeasureComputePeaks(int threads, double seconds) {
  using Clock = std::chrono::steady_clock;
  threads = std::max(threads, 1);
  std::vector<ComputePeak> peaks;
  for (const ProbeKernel& kernel : SupportedProbeKernels()) {
    // Rounds per thread sized from a short calibration run.
    int64_t rounds = 1 << 16;
    for (;;) {
      const Clock::time_point t0 = Clock::now();
      kernel.run(rounds);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s > 0.01 || rounds > (int64_t{1} << 34)) {
        rounds = std::max<int64_t>(1, static_cast<int64_t>(rounds * (seconds / 3) / std::max(s, 1e-9)));
        break;
      }
      rounds *= 4;
    }
    double best = 0;
    for (int run = 0; run < 3; ++run) {
      // Timed from before the threads start to after they end: starting a
      // thread costs microseconds against a run of ~seconds / 3.
      // One thread runs on the caller's.
      std::vector<std::thread> pool;
      std::vector<double> sums(threads);
      const Clock::time_point t0 = Clock::now();
      for (int t = 1; t < threads; ++t) {
        pool.emplace_back([&, t] { sums[t] = kernel.run(rounds); });
      }
      sums[0] = kernel.run(rounds);
      for (std::thread& t : pool) t.join();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      best = std::max(best, kernel.ops_per_iteration * double(rounds) * threads / s / 1e9);
    }
    peaks.push_back({kernel.form, kernel.instruction, best});
  }
  return peaks;
}

}  // namespace tandem
