// Hand-written CPU kernels for the shapes OpenBLAS handles badly, chosen at
// run time by what the CPU supports (AVX-512F here; elsewhere the callers keep
// OpenBLAS and the portable loops).
//
// Why not OpenBLAS for these: sgemm packs the whole weight matrix before
// multiplying, which for a decode step of 1-32 rows costs more than the
// multiply itself (62% of a batch-1 decode profile); a row-streaming kernel
// reads each weight once per step for every row of the batch. Attention dot
// products of one head (64-128 floats) are too short for any BLAS call.
#ifndef TANDEM_COMMON_KERNELS_CPU_CPU_KERNELS_H_
#define TANDEM_COMMON_KERNELS_CPU_CPU_KERNELS_H_

#include <cstdint>

#include "common/backend/tensor.h"

namespace tandem::cpu {

// Whether the AVX-512 kernels below may run on this CPU (F, DQ, BW, VL), and
// whether it also converts to bf16 in hardware (AVX512-BF16).
bool HasAvx512();
bool HasAvx512Bf16();

// The largest row count SmallMatmul is used for (above it, sgemm's packing
// pays for itself).
constexpr int64_t kSmallMatmulMaxRows = 32;

// out[i, j] = dot(x[i, :K], w[j, :K]) for i < n, j in [j_begin, j_end);
// x rows `ldx` apart, out rows `ldo` apart. AVX-512 only.
void SmallMatmul(const float* x, int64_t ldx, int64_t n, const float* w, int64_t K,
                 int64_t j_begin, int64_t j_end, float* out, int64_t ldo);

// As SmallMatmul, with bf16 weights (the high 16 bits of an f32; widened in
// registers, exactly, as they stream: half the f32 bytes). AVX-512 only.
// Not AVX512-BF16's dot product: that would round x to bf16 too, and a
// decode step waits on the weight stream, not on the FMAs.
void SmallMatmulBf16(const float* x, int64_t ldx, int64_t n, const uint16_t* w, int64_t K,
                     int64_t j_begin, int64_t j_end, float* out, int64_t ldo);

// out[i, j] = dot(bf16(x[i, :K]), w[j, :K]) with AVX512-BF16's vdpbf16ps
// (HasAvx512Bf16() only): x rounded to bf16 as it is loaded, f32
// accumulation; twice the products per instruction of the f32 FMA kernels.
// For prefill-sized n with bf16 weights (--dtype=bf16), where the multiply,
// not the weight stream, is the cost.
// As SmallMatmul, for prefill-sized n: the same 4 x 4 register tiles over
// blocks of 64 rows of x. Against OpenBLAS 0.3.21's sgemm as this project's
// machines run it (OPENBLAS_CORETYPE=Haswell: AVX2 kernels) a 512-token
// SmolLM2 prefill took 705 against 1060 ms at one thread and 386 against
// 557 ms at two: no packing, and AVX-512. AVX-512 only.
void LargeMatmul(const float* x, int64_t ldx, int64_t n, const float* w, int64_t K,
                 int64_t j_begin, int64_t j_end, float* out, int64_t ldo);
void MatmulDpBf16(const float* x, int64_t ldx, int64_t n, const uint16_t* w, int64_t K,
                  int64_t j_begin, int64_t j_end, float* out, int64_t ldo);

// As SmallMatmul, with weights of a block type (DType::kQ8_0, kQ4_0 or
// kQ4_1: rows of K / 32 blocks, K a multiple of 32), widened in registers as
// they stream: a decode step reads a quarter (q8_0) or a sixth (q4) of the
// f32 bytes. For more than 8 rows of x, 4 weight rows at a time are widened
// once into `scratch` (at least 4 * K floats, else the register path is
// kept) and multiplied as f32. AVX-512 only.
void SmallMatmulBlocks(DType type, const float* x, int64_t ldx, int64_t n, const uint8_t* w,
                       int64_t K, int64_t j_begin, int64_t j_end, float* out, int64_t ldo,
                       float* scratch = nullptr, int64_t scratch_floats = 0);

// dot(a, b) over n elements (AVX-512 when available, else scalar).
float Dot(const float* a, const float* b, int64_t n);
// out = bf16(x), rounding to nearest even (AVX512-BF16 where the CPU has
// it, else ConvertFromF32's loop; the same bits either way).
void ToBf16(const float* x, uint16_t* out, int64_t n);

// Attention's first product: s[r, j] = scale * dot(q[r, :hd], k[j, :hd]) for
// r < rows, j < ctx, with K given transposed (kt[d * ldkt + j]: 16 keys per
// vector, so each q[r, d] is broadcast against them and no dot product
// needs a reduction; q rows `ldq` apart, s rows `lds` apart). Any hd. False
// (nothing written) without AVX-512. Against OpenBLAS's sgemm on the
// untransposed rows (it packs both sides of every K = hd product) a
// 4096-token SmolLM2 prefill at two threads took 4.41 against 5.07 s, its
// attention 48% of the ops' time against 53%.
bool AttentionScores(const float* q, int64_t ldq, int64_t rows, const float* kt, int64_t ldkt,
                     int64_t ctx, int hd, float scale, float* s, int64_t lds);

// Attention's second product: out[r, :hd] = sum_j p[r, j] * v[j, :hd] for
// r < rows, j < ctx (p rows `ldp` apart, v contiguous rows of hd, out rows
// `ldo` apart), in AVX-512 outer-product tiles. False (nothing written)
// where it has no kernel: no AVX-512, or hd other than 64 and 128.
bool AttentionPv(const float* p, int64_t ldp, int64_t rows, const float* v, int64_t ctx, int hd,
                 float* out, int64_t ldo);

// Attention of one query token's heads of one KV group (rows heads, q and
// out rows hd apart) over ctx keys read in place from the cache: key j's K
// and V rows start at k + off[j] and v + off[j] (f32 or bf16 bits). `s`:
// scratch of rows * ctx floats. Nothing is gathered: for decode the copy
// cost as much as the products. False (nothing written) without AVX-512 or
// for hd other than 64 and 128.
bool AttentionDecode(const float* q, int rows, int hd, const float* k, const float* v,
                     const int64_t* off, int64_t ctx, float scale, float* s, float* out);
bool AttentionDecode(const float* q, int rows, int hd, const uint16_t* k, const uint16_t* v,
                     const int64_t* off, int64_t ctx, float scale, float* s, float* out);

// RMSNorm of one row: out = y / rms(y) * w, y = base[:n], or with `add`
// y = base + add, also stored into `sum` (which may be base: vLLM's
// fused_add_rms_norm).
void RmsNormRow(const float* base, const float* add, float* sum, const float* w, float eps,
                int64_t n, float* out);

// x[:n] = softmax(x[:n]), in place.
void Softmax(float* x, int64_t n);
// out[i] = silu(gate[i]) * up[i] for i < n.
void SiluMul(const float* gate, const float* up, float* out, int64_t n);

// exp(x) as the AVX-512 kernels compute it (a degree-6 polynomial on
// [-ln2/2, ln2/2] and an exact power of two: within 2 ulp of expf), exposed
// for tests; the scalar fallback is std::exp.
float ExpForTest(float x);

}  // namespace tandem::cpu

#endif  // TANDEM_COMMON_KERNELS_CPU_CPU_KERNELS_H_
