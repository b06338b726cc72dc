// Portable CPU kernels written once against Google Highway's vector API and
// compiled for every target Highway has for the architecture (x86: SSE4,
// AVX2, AVX-512 and its Zen 4 / Ice Lake variants; Arm: NEON, SVE, SVE2; a
// scalar target everywhere); the best one the running CPU supports is chosen
// at the first call (HWY_DYNAMIC_DISPATCH).
//
// They serve CPUs without AVX-512, where cpu_kernels.cc's intrinsics do not
// run: the weight rows of narrow types (bf16, Q8_0, Q4_0, Q4_1) are widened
// with vector loads instead of one element at a time, and small batches
// (decode) multiply each widened row while it is in L1.
#ifndef TANDEM_COMMON_KERNELS_CPU_HWY_KERNELS_H_
#define TANDEM_COMMON_KERNELS_CPU_HWY_KERNELS_H_

#include <cstdint>

#include "common/backend/tensor.h"

namespace tandem::cpu {

// dst[0, n) = src's first n elements as f32. `dtype`: f32, bf16, Q8_0, Q4_0
// or Q4_1 (n a multiple of 32 for the block types). Equal to ConvertToF32.
void WidenRow(DType dtype, const void* src, int64_t n, float* dst);

// sum over i < n of a[i] * b[i] (f32 accumulation in lanes, then summed).
float DotF32(const float* a, const float* b, int64_t n);

// c[r * ldc + j] = a[r * lda, + k) . w_j for r < n and j in [j0, j1), where
// w_j is weight row j (k elements of `dtype`, rows DTypeBytes(dtype, k)
// apart). Q8_0, Q4_0 and Q4_1 rows are multiplied block by block in
// registers, as integers, by a's rows rounded to int16 per 32-element block
// (relative error 2^-16 of a block's largest element), up to four rows of a
// at once; bf16 and f32 rows are widened in registers and multiplied in f32
// FMAs, also by up to four rows of a at once. A row's result is the same bits
// whatever n is.
// `row`: SmallMatmulScratchFloats(n, k) floats of scratch.
void SmallMatmulWiden(DType dtype, const float* a, int64_t lda, int64_t n, const uint8_t* w,
                      int64_t k, int64_t j0, int64_t j1, float* c, int64_t ldc, float* row);

int64_t SmallMatmulScratchFloats(int64_t n, int64_t k);

// The row-wise ops of cpu_kernels.h (Softmax, SiluMul, RmsNormRow: same
// contracts) on the Highway target; exp is Highway's (within 1 ulp).
void SoftmaxPortable(float* x, int64_t n);
void SiluMulPortable(const float* gate, const float* up, float* out, int64_t n);
void RmsNormRowPortable(const float* base, const float* add, float* sum, const float* w,
                        float eps, int64_t n, float* out);

// The Highway target the kernels run on, e.g. "AVX2" (start-up log).
const char* PortableTarget();

}  // namespace tandem::cpu

#endif  // TANDEM_COMMON_KERNELS_CPU_HWY_KERNELS_H_
