// The CPU backend's kernels. One portable source (hwy_kernels.cc, Google
// Highway): each kernel is compiled for every target Highway has for the
// architecture (x86: SSE4, AVX2, AVX-512 and its Ice Lake variant; Arm: NEON,
// SVE, SVE2; a scalar target everywhere) and the best one the running CPU
// supports is chosen at the first call. Every kernel works on every target.
// One measured specialization sits beside them (cpu_kernels_x86.cc):
// AVX512-BF16's vdpbf16ps for prefill over bf16 weights.
//
// Why not OpenBLAS for the matmuls: sgemm packs the whole weight matrix
// before multiplying, which for a decode step of 1-32 rows costs more than
// the multiply itself (62% of a batch-1 decode profile); a row-streaming
// kernel reads each weight once per step for every row of the batch; and
// attention's products of one head (64-128 floats) are too short for any
// BLAS call. Prefill figures against sgemm: docs/backends.md.
#ifndef TANDEM_COMMON_KERNELS_CPU_CPU_KERNELS_H_
#define TANDEM_COMMON_KERNELS_CPU_CPU_KERNELS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/backend/tensor.h"

namespace tandem::cpu {

// The Highway target the kernels run on, e.g. "AVX3" (AVX-512) or "AVX2"
// (start-up log); the targets this CPU can run, best first. On x86 CPUs with
// AVX-VNNI, "AVX2_VNNI" (kAvx2Vnni) precedes "AVX2": Highway's AVX2 target
// with its integer block dots in AVX-VNNI's multiply-add (AvxVnni()), the best
// on such a CPU without AVX-512 (Intel's cores from Alder Lake on).
const char* Target();
std::vector<std::string> Targets();
inline constexpr char kAvx2Vnni[] = "AVX2_VNNI";
// Whether the AVX2 target's block dots use AVX-VNNI: on a CPU that has it,
// unless UseTarget chose another target (plain "AVX2" included).
bool AvxVnni();
// Runs the kernels on the named target from now on (one of Targets(), any
// case; "" restores the best): for benchmarks and tests of a target other
// than the CPU's best (TANDEM_CPU_TARGET). False (nothing changed) for a
// name this CPU cannot run. Not thread-safe: call it before kernels run.
bool UseTarget(std::string_view name);

// The largest row count MatmulBlocks serves on targets without interleaved
// block products (above it weights are widened and multiplied as f32 by
// sgemm); on x86 from AVX2 up (BlocksAtEveryRowCount()) it serves any row
// count.
constexpr int64_t kSmallMatmulMaxRows = 32;

// out[i, j] = dot(x[i, :K], w[j, :K]) for i < n, j in [j0, j1); x rows `ldx`
// apart, out rows `ldo` apart. Register tiles of rows of x by 4 weight rows,
// in blocks of 64 rows of x: each weight row is read once per block (once
// per decode step). A row's result is the same bits whatever n is (a
// verification step of 1 + k tokens gives plain decoding's logits).
void MatmulF32(const float* x, int64_t ldx, int64_t n, const float* w, int64_t K, int64_t j0,
               int64_t j1, float* out, int64_t ldo);
// As MatmulF32 with bf16 weights (the high 16 bits of an f32, widened in
// registers, exactly, as they stream: half the f32 bytes).
void MatmulBf16(const float* x, int64_t ldx, int64_t n, const uint16_t* w, int64_t K, int64_t j0,
                int64_t j1, float* out, int64_t ldo);

// As MatmulF32 with weights of a block type (Q8_0, Q4_0, Q4_1: rows of K / 32
// blocks), n <= kSmallMatmulMaxRows below AVX-512: each block multiplied in
// registers, as integers, by x's rows rounded to int16 with one scale per
// row (relative error 2^-16 of the row's largest element), 8 rows of x per
// pass over the blocks on x86 from AVX2 up, 4 elsewhere.
// Up to BlocksIntegerMaxRows() rows (16 on AVX-512 targets, 32 elsewhere: the
// faster way on each, measured) a row's result is the same bits whatever n is
// (speculative verification steps give plain decoding's logits); above, on
// AVX-512 targets 16 weight rows at a time (8 on AVX2) are interleaved so
// that each vector lane sums one weight row, by the same int16 x (on AVX2
// with one scale per block of 32 instead: 2^-16 of the block's largest
// element; a row's result again the same bits whatever n is above
// BlocksIntegerMaxRows()).
// `scratch`: MatmulBlocksScratchFloats(n, K) floats.
void MatmulBlocks(DType dtype, const float* x, int64_t ldx, int64_t n, const uint8_t* w,
                  int64_t K, int64_t j0, int64_t j1, float* out, int64_t ldo, float* scratch);
int64_t MatmulBlocksScratchFloats(int64_t n, int64_t k);
int64_t BlocksIntegerMaxRows();
// Whether MatmulBlocks takes any row count on this target (the interleaved
// products: x86 from AVX2 up); elsewhere at most kSmallMatmulMaxRows.
bool BlocksAtEveryRowCount();

// dst[0, n) = src's first n elements as f32. `dtype`: f32, bf16, Q8_0, Q4_0
// or Q4_1 (n a multiple of 32 for the block types). Equal to ConvertToF32.
void WidenRow(DType dtype, const void* src, int64_t n, float* dst);

// sum over i < n of a[i] * b[i] (f32 accumulation in lanes, then summed).
float Dot(const float* a, const float* b, int64_t n);

// out = bf16(x), rounding to nearest even: ConvertFromF32's bits.
void ToBf16(const float* x, uint16_t* out, int64_t n);

// Attention's first product: s[r, j] = scale * dot(q[r, :hd], k[j, :hd]) for
// r < rows, j < ctx, with K given transposed (kt[d * ldkt + j]: a vector of
// keys per dimension, so each q[r, d] is broadcast against them and no dot
// product needs a reduction; q rows `ldq` apart, s rows `lds` apart). Against
// OpenBLAS's sgemm on the untransposed rows (it packs both sides of every
// K = hd product) a 4096-token SmolLM2 prefill at two threads took 4.41
// against 5.07 s.
void AttentionScores(const float* q, int64_t ldq, int64_t rows, const float* kt, int64_t ldkt,
                     int64_t ctx, int hd, float scale, float* s, int64_t lds);

// Attention's second product: out[r, :hd] = sum_j p[r, j] * v[j, :hd] for
// r < rows, j < ctx (p rows `ldp` apart, v contiguous rows of hd, out rows
// `ldo` apart), in outer-product tiles.
void AttentionPv(const float* p, int64_t ldp, int64_t rows, const float* v, int64_t ctx, int hd,
                 float* out, int64_t ldo);

// out[r, :ncols] += sum_k a[r, k] * b[k, :ncols] for r < nrows, k < inner,
// with bf16 b (rows `ldb` apart; a rows `lda` apart, out rows `ldo`): in
// AttentionPv's outer-product tiles. LoRA's second product, (x A^T) B^T with
// B kept transposed.
void AddProductBf16(const float* a, int64_t lda, int64_t nrows, int64_t inner, const uint16_t* b,
                    int64_t ldb, int64_t ncols, float* out, int64_t ldo);

// Attention of one query token's heads of one KV group (rows heads, q and
// out rows hd apart) over ctx keys read in place from the cache: key j's K
// and V rows start at k + off[j] and v + off[j] (f32 or bf16 bits). `s`:
// scratch of rows * ctx floats. Nothing is gathered: for decode the copy
// cost as much as the products.
void AttentionDecode(const float* q, int rows, int hd, const float* k, const float* v,
                     const int64_t* off, int64_t ctx, float scale, float* s, float* out);
void AttentionDecode(const float* q, int rows, int hd, const uint16_t* k, const uint16_t* v,
                     const int64_t* off, int64_t ctx, float scale, float* s, float* out);

// RMSNorm of one row: out = y / rms(y) * w, y = base[:n], or with `add`
// y = base + add, also stored into `sum` (which may be base: vLLM's
// fused_add_rms_norm).
void RmsNormRow(const float* base, const float* add, float* sum, const float* w, float eps,
                int64_t n, float* out);

// RoPE of one token's row of `heads` heads (hd floats apart, hd even): for
// f < hd / 2, (x[f], x[f + hd / 2]) rotated by the angle whose cosine and
// sine are cos[f] and sin[f].
void RopeRow(float* x, int heads, int hd, const float* cos, const float* sin);
// x[:n] += b[:n] (a bias).
void AddRow(float* x, const float* b, int64_t n);

// x[:n] = softmax(x[:n]), in place.
void Softmax(float* x, int64_t n);
// out[i] = silu(gate[i]) * up[i] for i < n.
void SiluMul(const float* gate, const float* up, float* out, int64_t n);

// exp(x) as the kernels compute it (Highway's, within 1 ulp of expf),
// exposed for tests.
float ExpForTest(float x);

// The AVX512-BF16 specialization (cpu_kernels_x86.cc): whether it runs here
// (x86 with AVX512-BF16, the kernels on an AVX-512 target), and
// out[i, j] = dot(bf16(x[i, :K]), w[j, :K]) with vdpbf16ps: x rounded to
// bf16 as it is loaded, f32 accumulation, twice the products per
// instruction of the f32 FMA tiles. For prefill-sized n with bf16 weights
// (--dtype=bf16), where the multiply, not the weight stream, is the cost
// (SmolLM2 512-token prefill: 1217 / 632 ms widening for sgemm, 640 / 340 ms
// this way, at 1 / 2 threads, on a Zen 5). Decode keeps MatmulBf16: a decode
// step waits on the weight stream, and rounding x would change its logits.
// HasAvx512Bf16: the CPU has the instruction and the kernels run on an
// AVX-512 target.
bool HasAvx512Bf16();
// How many times the f32 FMA's products per second vdpbf16ps makes on this
// core (its 32 products per instruction against the FMA's 16), measured
// once (about 1 ms): 0 without AVX512-BF16. Not every core that has it runs
// it at the FMA's rate: on an Intel Xeon (family 6 model 207) one issues
// every 2 cycles against 2 FMAs a cycle (0.49x), and a 512-token bf16
// prefill took 1.76 s at one thread this way against 1.30-1.50 s with
// MatmulBf16's f32 FMAs (docs/benchmarks.md, "bf16 prefill on Intel").
double DpBf16Speedup();
// Prefill over bf16 weights by MatmulDpBf16: where DpBf16Speedup() > 1.
bool PreferDpBf16();
// scratch: MatmulDpBf16ScratchElems(K) elements (x's rows rounded to bf16,
// kDpBf16RowBlock at a time).
inline constexpr int64_t kDpBf16RowBlock = 64;
int64_t MatmulDpBf16ScratchElems(int64_t K);
void MatmulDpBf16(const float* x, int64_t ldx, int64_t n, const uint16_t* w, int64_t K,
                  int64_t j0, int64_t j1, float* out, int64_t ldo, uint16_t* scratch);

// Whether the kernels run on an AVX-512 target (for HasAvx512Bf16).
bool TargetHasAvx512();

// The blocking of the matmul kernels: fn(i0, rows, j, c) for blocks of 64
// rows of x [i0, i0 + rows), within each the weight rows [j0, j1) 4 at a time
// (c = 4, weight rows j..j+3) then one by one (c = 1): a block of x stays in
// L2 while the weight rows pass (a decode batch is one block: each weight row
// is read once per step).
template <typename Fn>
inline void ForEachTileGroup(int64_t n, int64_t j0, int64_t j1, Fn fn) {
  constexpr int64_t kRowBlock = 64;
  for (int64_t i0 = 0; i0 < n; i0 += kRowBlock) {
    const int64_t rows = n - i0 < kRowBlock ? n - i0 : kRowBlock;
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4) fn(i0, rows, j, 4);
    for (; j < j1; ++j) fn(i0, rows, j, 1);
  }
}

}  // namespace tandem::cpu

#endif  // TANDEM_COMMON_KERNELS_CPU_CPU_KERNELS_H_
