// CUDA kernels of the model's ops. See kernels.h for the contracts.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/kernels/cuda/kernels.h"

namespace tandem {
namespace cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kAttnThreads = 128;  // 4 warps
constexpr int kAttnWarps = kAttnThreads / 32;

__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromF(float x);
template <>
__device__ __forceinline__ float FromF<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half FromF<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024). Call once
// per kernel (it reuses one shared array).
__device__ float BlockSum(float v) {
  __shared__ float warp_sums[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int num_warps = blockDim.x >> 5;
    float w = lane < num_warps ? warp_sums[lane] : 0.f;
    w = WarpSum(w);
    if (lane == 0) total = w;
  }
  __syncthreads();
  return total;
}

int Blocks(int64_t work, int threads) { return static_cast<int>((work + threads - 1) / threads); }

// Calls f(T{}) with the storage type.
template <typename F>
cudaError_t Dispatch(Storage s, F f) {
  switch (s) {
    case Storage::kF32: f(float{}); break;
    case Storage::kF16: f(__half{}); break;
    case Storage::kBF16: f(__nv_bfloat16{}); break;
  }
  return cudaGetLastError();
}

// Programmatic dependent launch (sm_90 and later; PrepareKernels sets
// pdl_enabled). A decode step is ~10 small kernels per layer, each a few
// microseconds, so the gap between one kernel's end and the next one's start
// is a large part of the step. Launched this way, a kernel may be scheduled
// while the grid before it finishes; it first waits for that grid to complete
// (griddepcontrol.wait: its writes are then visible), so ordering is that of
// a plain launch and only the launch latency overlaps. Measured on an H100
// (docs/benchmarks.md): smollm2-135m decode at batch 1 0.99 -> 0.91 ms,
// prefill unchanged. Triggering the next launch early (launch_dependents at
// each kernel's start) made prefill slower (512 tokens 2.88 -> 3.11 ms: the
// next kernel's waiting blocks held SM slots), so kernels never trigger it.
bool pdl_enabled = false;

__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, shared, stream>>>(args...), as a programmatic
// dependent launch where the device supports it. Errors surface through
// cudaGetLastError() like a plain launch's.
template <typename... Params, typename... Args>
void Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = pdl_enabled ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, static_cast<Params>(std::forward<Args>(args))...);
}

// --- elementwise / row ops ---------------------------------------------------

// The elements of one 16-byte vector, widened to f32.
template <typename T>
__device__ __forceinline__ void Widen(const uint4& raw, float* out) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 16 / static_cast<int>(sizeof(T)); ++i) out[i] = ToF(e[i]);
}

// 16 bytes of T rounded from f32.
template <typename T>
__device__ __forceinline__ uint4 Narrow(const float* in) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < 16 / static_cast<int>(sizeof(T)); ++i) e[i] = FromF<T>(in[i]);
  return raw;
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }


// out[i, :] = src[row, :] with row = indices[i], clamped to [0, rows) when
// rows > 0. V is the unit copied: uint4 (16 bytes) where the rows allow it,
// else the element type. __restrict__ lets each thread's loads all be in
// flight before its stores (a row of a few KB is then one round trip).
template <typename V>
__global__ void GatherKernel(const V* __restrict__ src, const int32_t* __restrict__ indices,
                             int64_t rows, int64_t width, V* __restrict__ out) {
  PdlWait();
  const int64_t i = blockIdx.x;
  int64_t row = indices[i];
  if (rows > 0) row = row < 0 ? 0 : (row >= rows ? rows - 1 : row);
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) out[i * width + j] = src[row * width + j];
}

template <typename T>
void LaunchGather(const void* src, const int32_t* indices, int64_t rows, int64_t width, void* out,
                  int64_t n, cudaStream_t stream) {
  constexpr int64_t kPerVec = 16 / sizeof(T);
  if (width % kPerVec == 0 && Aligned16(src) && Aligned16(out)) {
    Launch(GatherKernel<uint4>, static_cast<unsigned>(n), kThreads, 0, stream,
           static_cast<const uint4*>(src), indices, rows, width / kPerVec,
           static_cast<uint4*>(out));
  } else {
    Launch(GatherKernel<T>, static_cast<unsigned>(n), kThreads, 0, stream,
           static_cast<const T*>(src), indices, rows, width, static_cast<T*>(out));
  }
}

template <typename T, bool kAdd>
__global__ void RmsNormKernel(const T* x, T* residual, const T* weight, float eps, int64_t hidden,
                              T* out) {
  PdlWait();
  const int64_t base = blockIdx.x * hidden;
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    float v = ToF(x[base + j]);
    if (kAdd) {
      const T r = FromF<T>(v + ToF(residual[base + j]));
      residual[base + j] = r;
      v = ToF(r);
    }
    sum += v * v;
  }
  const float inv = rsqrtf(BlockSum(sum) / static_cast<float>(hidden) + eps);
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    const float v = kAdd ? ToF(residual[base + j]) : ToF(x[base + j]);
    out[base + j] = FromF<T>(v * inv * ToF(weight[j]));
  }
}

// RmsNormKernel for rows of whole 16-byte vectors, at most
// kThreads * kNormVecs of them: each thread keeps its vectors in registers
// from the sum to the scaling, so x and the residual are read once and every
// load of a row is in flight at once (the scalar loop above waits on each
// element's load in turn when x and residual may alias).
constexpr int kNormVecs = 4;

template <typename T, bool kAdd>
__global__ void RmsNormVecKernel(const T* __restrict__ x, T* __restrict__ residual,
                                 const T* __restrict__ weight, float eps, int64_t hidden,
                                 T* __restrict__ out) {
  PdlWait();
  constexpr int kVec = 16 / sizeof(T);
  const int64_t vecs = hidden / kVec;
  const int64_t base = blockIdx.x * vecs;
  const uint4* xv = reinterpret_cast<const uint4*>(x) + base;
  uint4* rv = reinterpret_cast<uint4*>(residual) + base;
  float v[kNormVecs][kVec];
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kNormVecs; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i >= vecs) break;
    Widen<T>(xv[i], v[c]);
    if (kAdd) {
      float r[kVec];
      Widen<T>(rv[i], r);
#pragma unroll
      for (int e = 0; e < kVec; ++e) r[e] += v[c][e];
      const uint4 rounded = Narrow<T>(r);
      rv[i] = rounded;
      Widen<T>(rounded, v[c]);
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) sum += v[c][e] * v[c][e];
  }
  const float inv = rsqrtf(BlockSum(sum) / static_cast<float>(hidden) + eps);
  const uint4* wv = reinterpret_cast<const uint4*>(weight);
  uint4* ov = reinterpret_cast<uint4*>(out) + base;
#pragma unroll
  for (int c = 0; c < kNormVecs; ++c) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
    if (i >= vecs) break;
    float w[kVec];
    Widen<T>(wv[i], w);
#pragma unroll
    for (int e = 0; e < kVec; ++e) w[e] *= v[c][e] * inv;
    ov[i] = Narrow<T>(w);
  }
}

// One block per row: the row's cos/sin are computed once per frequency
// (sincosf, full precision: positions reach 1e5 rad), then each thread
// rotates up to kRopePairs pairs, loading them all before it stores any.
constexpr int kRopePairs = 8;

template <typename T>
__global__ void RopeKernel(const int32_t* positions, T* qkv, int64_t row_stride,
                           const float* inv_freq, int heads, int head_dim) {
  PdlWait();
  __shared__ float cs[kMaxHeadDim / 2], sn[kMaxHeadDim / 2];
  const int64_t i = blockIdx.x;
  const int half = head_dim / 2;
  const float p = static_cast<float>(positions[i]);
  for (int f = threadIdx.x; f < half; f += blockDim.x) sincosf(p * inv_freq[f], &sn[f], &cs[f]);
  __syncthreads();
  T* row = qkv + i * row_stride;
  const int pairs = heads * half;
  for (int first = 0; first < pairs; first += kRopePairs * blockDim.x) {
    float a[kRopePairs], b[kRopePairs];
#pragma unroll
    for (int c = 0; c < kRopePairs; ++c) {
      const int idx = first + c * blockDim.x + threadIdx.x;
      if (idx < pairs) {
        const T* x = row + (idx / half) * head_dim + idx % half;
        a[c] = ToF(x[0]);
        b[c] = ToF(x[half]);
      }
    }
#pragma unroll
    for (int c = 0; c < kRopePairs; ++c) {
      const int idx = first + c * blockDim.x + threadIdx.x;
      if (idx < pairs) {
        const int f = idx % half;
        T* x = row + (idx / half) * head_dim + f;
        x[0] = FromF<T>(a[c] * cs[f] - b[c] * sn[f]);
        x[half] = FromF<T>(b[c] * cs[f] + a[c] * sn[f]);
      }
    }
  }
}

template <typename T>
__global__ void AddBiasKernel(T* x, const T* bias, int64_t width, int64_t total) {
  PdlWait();
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= total) return;
  x[k] = FromF<T>(ToF(x[k]) + ToF(bias[k % width]));
}

// One warp per (row, head): blockIdx.x = row, blockIdx.y = head.
template <typename T>
__global__ void HeadRmsNormKernel(T* qkv, int64_t row_stride, const T* q_weight,
                                  const T* k_weight, int q_heads, int head_dim, float eps) {
  PdlWait();
  const int h = blockIdx.y;
  T* x = qkv + blockIdx.x * row_stride + static_cast<int64_t>(h) * head_dim;
  const T* w = h < q_heads ? q_weight : k_weight;
  float sum = 0.f;
  for (int j = threadIdx.x; j < head_dim; j += 32) {
    const float v = ToF(x[j]);
    sum += v * v;
  }
  const float inv = rsqrtf(WarpSum(sum) / static_cast<float>(head_dim) + eps);
  for (int j = threadIdx.x; j < head_dim; j += 32) x[j] = FromF<T>(ToF(x[j]) * inv * ToF(w[j]));
}

template <typename T>
__global__ void SiluMulKernel(const T* gate_up, int64_t inter, T* out, int64_t total) {
  PdlWait();
  const int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (k >= total) return;
  const int64_t i = k / inter, j = k % inter;
  const float g = ToF(gate_up[i * 2 * inter + j]);
  const float u = ToF(gate_up[i * 2 * inter + inter + j]);
  out[k] = FromF<T>(g / (1.f + expf(-g)) * u);
}

// --- small-batch matmul -------------------------------------------------------

constexpr int kGemvThreads = 256;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvRowsPerGroup = 2;  // weight rows a thread group streams side by side

// Each group of `group_warps` warps owns kGemvRowsPerGroup consecutive weight
// rows; its threads take the rows' 16-byte vectors in turn (consecutive
// threads, consecutive vectors: coalesced), multiply each against the same
// vector of every row of x (read through L1: x is small and shared by all
// blocks), and the group's partial sums meet in shared memory. The weights
// are loaded with the streaming hint: they are read once per step.
//
// With kSiluPairs, w holds gate rows then up rows (n in all) and a group
// streams gate row j with up row j + n/2: its epilogue writes SiluMul's
// silu(gate) * up to out[:, j] (n/2 wide) from the two sums rounded to T, as
// Matmul then SiluMul would, so gate_up never goes through memory.
template <typename T, typename TOut, int M, bool kSiluPairs>
__global__ void __launch_bounds__(kGemvThreads)
    GemvKernel(const T* __restrict__ x, const T* __restrict__ w, TOut* __restrict__ out, int m,
               int64_t n, int64_t k, int group_warps) {
  PdlWait();
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kRows = kGemvRowsPerGroup;
  __shared__ float partial[kGemvWarps][kRows * M];
  const int64_t vecs = k / kVec;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int groups = kGemvWarps / group_warps;
  const int group = warp / group_warps;
  const int group_threads = group_warps * 32;
  static_assert(!kSiluPairs || kRows == 2, "a group streams one gate row and one up row");
  const int64_t half = n / 2;
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * groups + group;  // kSiluPairs
  const int64_t row0 = pair * kRows;
  const uint4* wv = reinterpret_cast<const uint4*>(w);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[kRows][M];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.f;
  }
#pragma unroll 2
  for (int64_t v = (warp % group_warps) * 32 + lane; v < vecs; v += group_threads) {
    float wf[kRows][kVec];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = kSiluPairs ? pair + r * half : row0 + r;
      const bool valid = kSiluPairs ? pair < half : row < n;
      const uint4 raw = valid ? __ldcs(wv + row * vecs + v) : make_uint4(0, 0, 0, 0);
      Widen<T>(raw, wf[r]);
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (i >= m) break;
      float xf[kVec];
      Widen<T>(__ldg(xv + i * vecs + v), xf);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[r][i] = fmaf(wf[r][e], xf[e], acc[r][i]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const float sum = WarpSum(acc[r][i]);
      if (lane == 0) partial[warp][r * M + i] = sum;
    }
  }
  __syncthreads();
  if constexpr (kSiluPairs) {
    if (static_cast<int>(threadIdx.x) < groups * M) {
      const int g = threadIdx.x / M, i = threadIdx.x % M;
      float gate = 0.f, up = 0.f;
      for (int j = 0; j < group_warps; ++j) {
        gate += partial[g * group_warps + j][i];
        up += partial[g * group_warps + j][M + i];
      }
      const int64_t col = static_cast<int64_t>(blockIdx.x) * groups + g;
      if (col < half && i < m) {
        const float gr = ToF(FromF<T>(gate)), ur = ToF(FromF<T>(up));
        out[i * half + col] = FromF<TOut>(gr / (1.f + expf(-gr)) * ur);
      }
    }
    return;
  }
  constexpr int kPer = kRows * M;
  if (static_cast<int>(threadIdx.x) < groups * kPer) {
    const int g = threadIdx.x / kPer, idx = threadIdx.x % kPer;
    const int r = idx / M, i = idx % M;
    float sum = 0.f;
    for (int j = 0; j < group_warps; ++j) sum += partial[g * group_warps + j][idx];
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * groups + g) * kRows + r;
    if (row < n && i < m) out[i * n + row] = FromF<TOut>(sum);
  }
}

int MultiprocessorCount() {
  static const int count = [] {
    int device = 0, n = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      return 1;
    }
    return n > 0 ? n : 1;
  }();
  return count;
}

template <typename T, typename TOut, int M, bool kSiluPairs>
void LaunchGemv(const void* x, const void* w, void* out, int64_t m, int64_t n, int64_t k,
                cudaStream_t stream) {
  const int64_t vecs = k / (16 / sizeof(T));
  // Warps per row group: about four vectors per thread, then more warps per
  // row (fewer rows per block) while the grid would leave SMs idle.
  int group_warps = 1;
  while (group_warps < kGemvWarps && vecs >= 2 * 32 * 4 * group_warps) group_warps *= 2;
  auto blocks = [&](int gw) {
    const int64_t rows = static_cast<int64_t>(kGemvWarps / gw) * kGemvRowsPerGroup;
    return (n + rows - 1) / rows;
  };
  while (group_warps < kGemvWarps && blocks(group_warps) < 2 * MultiprocessorCount() &&
         vecs >= 64 * group_warps) {
    group_warps *= 2;
  }
  Launch(GemvKernel<T, TOut, M, kSiluPairs>, static_cast<unsigned>(blocks(group_warps)), kGemvThreads, 0,
         stream, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<TOut*>(out),
         static_cast<int>(m), n, k, group_warps);
}

template <typename T, typename TOut, bool kSiluPairs = false>
void LaunchGemvRows(const void* x, const void* w, void* out, int64_t m, int64_t n, int64_t k,
                    cudaStream_t stream) {
  static_assert(kMaxGemvRows == 4, "one instantiation per row count up to kMaxGemvRows");
  if (m <= 1) return LaunchGemv<T, TOut, 1, kSiluPairs>(x, w, out, m, n, k, stream);
  if (m <= 2) return LaunchGemv<T, TOut, 2, kSiluPairs>(x, w, out, m, n, k, stream);
  LaunchGemv<T, TOut, 4, kSiluPairs>(x, w, out, m, n, k, stream);
}

// --- paged attention -----------------------------------------------------------

// V: uint4 when the rows are whole 16-byte vectors (see WriteKvCache), else
// the element type; `kv_row` and `row` count units of V.
template <typename V>
__global__ void WriteKvKernel(const V* __restrict__ qkv, V* __restrict__ k_cache,
                              V* __restrict__ v_cache, const int32_t* __restrict__ slot_mapping,
                              int64_t row, int64_t k_offset, int64_t kv_row) {
  PdlWait();
  const int64_t i = blockIdx.x;
  const int32_t slot = slot_mapping[i];
  if (slot < 0) return;
  const V* k = qkv + i * row + k_offset;
  const V* v = k + kv_row;
  for (int64_t j = threadIdx.x; j < kv_row; j += blockDim.x) {
    k_cache[slot * kv_row + j] = k[j];
    v_cache[slot * kv_row + j] = v[j];
  }
}

// Keys scored per pass of the attention kernels: one per thread.
constexpr int kKeyTile = kAttnThreads;
// Dims of the output one thread accumulates at most (head_dim <= 256).
constexpr int kMaxDimsPerThread = (kMaxHeadDim + kAttnThreads - 1) / kAttnThreads;

// Reduces `v` over the block with `op` through `scratch` (kAttnWarps floats);
// every thread gets the result. Safe to call repeatedly.
template <typename Op>
__device__ float BlockReduce(float v, float* scratch, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // the previous call's readers are done with scratch
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kAttnWarps; ++w) r = op(r, scratch[w]);
  return r;
}

// Running softmax state of one block over keys, and the weighted value sum
// of the dims this thread owns.
struct BlockSoftmax {
  float m = -FLT_MAX;
  float l = 0.f;
  float acc[kMaxDimsPerThread] = {};
};

// q . k over head_dim elements; 16-byte loads where the row allows (rows of
// a 16-bit cache with head_dim % 8 == 0, of an f32 cache with % 4 == 0).
template <typename T>
__device__ __forceinline__ float RowDot(const float* q, const T* k, int hd) {
  float dot = 0.f;
  constexpr int kPerVec = 16 / sizeof(T);
  if (hd % kPerVec == 0) {
    const uint4* kv = reinterpret_cast<const uint4*>(k);
    for (int v = 0; v < hd / kPerVec; ++v) {
      const uint4 raw = kv[v];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < kPerVec; ++i) dot += q[v * kPerVec + i] * ToF(e[i]);
    }
    return dot;
  }
  for (int d = 0; d < hd; ++d) dot += q[d] * ToF(k[d]);
  return dot;
}

// Attends one (scaled) query `q` in shared memory over keys [begin, end) of a
// request. Keys are taken kKeyTile at a time: each thread finds one key's
// cache slot (kept in shared memory) and scores it against a whole row of K,
// so the loads of a tile are independent and in flight together; the block
// turns the scores into probabilities with an online softmax; then the
// threads sum p * V with consecutive threads on consecutive dims (coalesced)
// and `groups` key subsets side by side. (A warp per key, reducing each dot
// product across lanes, left every warp waiting on one load after another:
// ~100 us per layer for 256 keys on an H100.)
template <typename T>
__device__ __forceinline__ void AttendRange(const PagedAttentionArgs& a, const float* q,
                                            const int32_t* table, int kv_head, int begin,
                                            int end, BlockSoftmax& st) {
  __shared__ float p[kKeyTile];
  __shared__ int64_t slots[kKeyTile];
  __shared__ float scratch[kAttnWarps];
  const int hd = a.head_dim;
  const int lanes = hd < kAttnThreads ? hd : kAttnThreads;  // threads per key group
  const int groups = kAttnThreads / lanes;
  const int lane = threadIdx.x % lanes, group = threadIdx.x / lanes;
  const int64_t kv_row = static_cast<int64_t>(a.num_kv_heads) * hd;
  const T* kc = static_cast<const T*>(a.k_cache) + static_cast<int64_t>(kv_head) * hd;
  const T* vc = static_cast<const T*>(a.v_cache) + static_cast<int64_t>(kv_head) * hd;
  for (int tile = begin; tile < end; tile += kKeyTile) {
    const int n = min(kKeyTile, end - tile);
    float score = -FLT_MAX;
    if (static_cast<int>(threadIdx.x) < n) {
      const int j = tile + threadIdx.x;
      const int64_t slot =
          static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
      slots[threadIdx.x] = slot;
      score = RowDot(q, kc + slot * kv_row, hd);
    }
    const float tile_max = BlockReduce(score, scratch, [](float x, float y) { return fmaxf(x, y); });
    const float m_new = fmaxf(st.m, tile_max);
    const float prob = static_cast<int>(threadIdx.x) < n ? __expf(score - m_new) : 0.f;
    p[threadIdx.x] = prob;
    const float tile_sum = BlockReduce(prob, scratch, [](float x, float y) { return x + y; });
    const float correction = __expf(st.m - m_new);
    st.l = st.l * correction + tile_sum;
    st.m = m_new;
    if (group < groups) {
#pragma unroll
      for (int c = 0; c < kMaxDimsPerThread; ++c) st.acc[c] *= correction;
#pragma unroll 16
      for (int j = group; j < n; j += groups) {
        const T* v = vc + slots[j] * kv_row;
        const float pj = p[j];
#pragma unroll
        for (int c = 0; c < kMaxDimsPerThread; ++c) {
          const int d = lane + c * lanes;
          if (d < hd) st.acc[c] += pj * ToF(v[d]);
        }
      }
    }
    __syncthreads();  // p and slots are rewritten by the next tile
  }
}

// Sums the key groups' partial values into acc_out (shared, head_dim
// floats); valid in all threads after the call.
__device__ void MergeGroups(const BlockSoftmax& st, int head_dim, float* acc_out) {
  __shared__ float partial[kAttnThreads * kMaxDimsPerThread];
  const int lanes = head_dim < kAttnThreads ? head_dim : kAttnThreads;
  const int groups = kAttnThreads / lanes;
  const int lane = threadIdx.x % lanes, group = threadIdx.x / lanes;
  if (group < groups) {
#pragma unroll
    for (int c = 0; c < kMaxDimsPerThread; ++c) {
      const int d = lane + c * lanes;
      if (d < head_dim) partial[group * head_dim + d] = st.acc[c];
    }
  }
  __syncthreads();
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.f;
    for (int g = 0; g < groups; ++g) sum += partial[g * head_dim + d];
    acc_out[d] = sum;
  }
  __syncthreads();
}

// The request of token t: the last r with query_start_loc[r] <= t.
__device__ __forceinline__ int RequestOf(const PagedAttentionArgs& a, int num_reqs, int64_t t) {
  int lo = 0, hi = num_reqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.query_start_loc[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// The first key a query that sees keys [0, ctx) attends to: with a sliding
// window, the window's first.
__device__ __forceinline__ int FirstKey(const PagedAttentionArgs& a, int ctx) {
  return a.sliding_window > 0 ? max(0, ctx - a.sliding_window) : 0;
}

// One query token of head h, alone: the block scores tiles of keys (see
// AttendRange). Writes zeros for padded rows.
template <typename T>
__device__ void AttendOneQuery(const PagedAttentionArgs& a, int h, int64_t t, int num_reqs) {
  __shared__ float q[kMaxHeadDim];
  __shared__ float merged[kMaxHeadDim];
  const int hd = a.head_dim;
  T* o = static_cast<T*>(a.out) + t * a.num_heads * hd + static_cast<int64_t>(h) * hd;
  if (t >= a.query_start_loc[num_reqs]) {
    for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = FromF<T>(0.f);
    return;
  }
  const int r = RequestOf(a, num_reqs, t);
  const int q_begin = a.query_start_loc[r];
  const int q_len = a.query_start_loc[r + 1] - q_begin;
  const int ctx = a.seq_lens[r] - q_len + static_cast<int>(t - q_begin) + 1;  // causal
  const int64_t row = (static_cast<int64_t>(a.num_heads) + 2 * a.num_kv_heads) * hd;
  const T* qs = static_cast<const T*>(a.qkv) + t * row + static_cast<int64_t>(h) * hd;
  __syncthreads();  // q and merged may still be read by the previous query
  for (int d = threadIdx.x; d < hd; d += blockDim.x) q[d] = ToF(qs[d]) * a.scale;
  __syncthreads();
  BlockSoftmax st;
  const int kv_head = h / (a.num_heads / a.num_kv_heads);
  AttendRange<T>(a, q, a.block_tables + static_cast<int64_t>(r) * a.table_width, kv_head,
                 FirstKey(a, ctx), ctx, st);
  MergeGroups(st, hd, merged);
  const float inv = 1.f / st.l;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = FromF<T>(merged[d] * inv);
}

// Query tiles of the mixed kernel: kQueryTile consecutive tokens of one
// request share each tile of kTileKeys keys, loaded once into shared memory
// (a prompt's queries otherwise read every key once each). head_dim up to
// kMaxTiledHeadDim; other shapes and tiles that straddle two requests take
// the one-query path.
constexpr int kQueryTile = 16;
constexpr int kTileKeys = 32;
constexpr int kMaxTiledHeadDim = 128;
constexpr int kThreadsPerQuery = kAttnThreads / kQueryTile;  // 8: lanes of one warp

template <typename T>
__device__ void AttendQueryTile(const PagedAttentionArgs& a, int h, int64_t t0, int r,
                                int count) {
  __shared__ float qs[kQueryTile][kMaxTiledHeadDim];
  __shared__ float ks[kTileKeys][kMaxTiledHeadDim + 1];  // +1: no bank conflicts by row
  __shared__ float vs[kTileKeys][kMaxTiledHeadDim];
  __shared__ float ps[kQueryTile][kTileKeys];
  __shared__ int64_t slots[kTileKeys];
  const int hd = a.head_dim;
  const int qi = threadIdx.x / kThreadsPerQuery, sub = threadIdx.x % kThreadsPerQuery;
  const int q_begin = a.query_start_loc[r];
  const int q_len = a.query_start_loc[r + 1] - q_begin;
  const int ctx0 = a.seq_lens[r] - q_len + static_cast<int>(t0 - q_begin) + 1;
  const int my_ctx = ctx0 + qi;  // keys this query sees (past `count`: unused)
  const int my_first = FirstKey(a, my_ctx);
  const int max_ctx = ctx0 + count - 1;
  const int64_t row = (static_cast<int64_t>(a.num_heads) + 2 * a.num_kv_heads) * hd;
  for (int idx = threadIdx.x; idx < kQueryTile * hd; idx += blockDim.x) {
    const int i = idx / hd, d = idx % hd;
    qs[i][d] = i < count ? ToF(static_cast<const T*>(a.qkv)[(t0 + i) * row +
                                                            static_cast<int64_t>(h) * hd + d]) *
                               a.scale
                         : 0.f;
  }
  const int kv_head = h / (a.num_heads / a.num_kv_heads);
  const int64_t kv_row = static_cast<int64_t>(a.num_kv_heads) * hd;
  const T* kc = static_cast<const T*>(a.k_cache) + static_cast<int64_t>(kv_head) * hd;
  const T* vc = static_cast<const T*>(a.v_cache) + static_cast<int64_t>(kv_head) * hd;
  const int32_t* table = a.block_tables + static_cast<int64_t>(r) * a.table_width;
  constexpr int kDims = kMaxTiledHeadDim / kThreadsPerQuery;  // dims per thread, at most
  float acc[kDims] = {};
  float m = -FLT_MAX, l = 0.f;
  for (int tile = FirstKey(a, ctx0); tile < max_ctx; tile += kTileKeys) {
    const int n = min(kTileKeys, max_ctx - tile);
    __syncthreads();  // the previous tile's ks, vs and ps are done with
    if (static_cast<int>(threadIdx.x) < n) {
      const int j = tile + threadIdx.x;
      slots[threadIdx.x] =
          static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < n * hd; idx += blockDim.x) {
      const int j = idx / hd, d = idx % hd;
      ks[j][d] = ToF(kc[slots[j] * kv_row + d]);
      vs[j][d] = ToF(vc[slots[j] * kv_row + d]);
    }
    __syncthreads();
    // Scores: this thread takes keys sub, sub + 8, ... of the tile for query qi.
    float sc[kTileKeys / kThreadsPerQuery];
    float tile_max = -FLT_MAX;
#pragma unroll
    for (int c = 0; c < kTileKeys / kThreadsPerQuery; ++c) {
      const int j = sub + c * kThreadsPerQuery;
      float dot = -FLT_MAX;
      if (j < n && tile + j < my_ctx && tile + j >= my_first) {
        dot = 0.f;
        for (int d = 0; d < hd; ++d) dot += qs[qi][d] * ks[j][d];
      }
      sc[c] = dot;
      tile_max = fmaxf(tile_max, dot);
    }
    for (int off = kThreadsPerQuery / 2; off > 0; off >>= 1) {
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
    }
    const float m_new = fmaxf(m, tile_max);
    float sum = 0.f;
#pragma unroll
    for (int c = 0; c < kTileKeys / kThreadsPerQuery; ++c) {
      const float pv = sc[c] == -FLT_MAX ? 0.f : __expf(sc[c] - m_new);
      ps[qi][sub + c * kThreadsPerQuery] = pv;
      sum += pv;
    }
    for (int off = kThreadsPerQuery / 2; off > 0; off >>= 1) {
      sum += __shfl_xor_sync(0xffffffffu, sum, off);
    }
    const float correction = m == -FLT_MAX ? 0.f : __expf(m - m_new);
    l = l * correction + sum;
    m = m_new;
    __syncwarp();  // ps of this query is written by lanes of this warp
#pragma unroll
    for (int c = 0; c < kDims; ++c) acc[c] *= correction;
    for (int j = 0; j < n; ++j) {
      const float pj = ps[qi][j];
#pragma unroll
      for (int c = 0; c < kDims; ++c) {
        const int d = sub + c * kThreadsPerQuery;
        if (d < hd) acc[c] += pj * vs[j][d];
      }
    }
  }
  if (qi >= count) return;
  T* o = static_cast<T*>(a.out) + (t0 + qi) * a.num_heads * hd + static_cast<int64_t>(h) * hd;
  const float inv = 1.f / l;
#pragma unroll
  for (int c = 0; c < kDims; ++c) {
    const int d = sub + c * kThreadsPerQuery;
    if (d < hd) o[d] = FromF<T>(acc[c] * inv);
  }
}

// One kQueryTile-row tile of a mixed batch: a query tile when its rows are
// one request's, else one query at a time.
template <typename T>
__device__ void AttendMixedTile(const PagedAttentionArgs& a, int h, int64_t t0, int num_reqs) {
  const int64_t t_end = min(a.n, t0 + kQueryTile);
  const int64_t real = a.query_start_loc[num_reqs];
  if (a.head_dim <= kMaxTiledHeadDim && t_end <= real) {
    const int r = RequestOf(a, num_reqs, t0);
    if (RequestOf(a, num_reqs, t_end - 1) == r) {
      AttendQueryTile<T>(a, h, t0, r, static_cast<int>(t_end - t0));
      return;
    }
  }
  for (int64_t t = t0; t < t_end; ++t) AttendOneQuery<T>(a, h, t, num_reqs);
}

template <typename T>
__global__ void MixedAttentionKernel(PagedAttentionArgs a) {
  PdlWait();
  AttendMixedTile<T>(a, blockIdx.x, static_cast<int64_t>(blockIdx.y) * kQueryTile, a.num_reqs[0]);
}

// --- prefill attention on tensor cores ---------------------------------------
//
// FlashAttention-2 over the paged cache for 16-bit storage and head_dim 64 or
// 128: a block takes kFlashRows query rows of one request and one head, each
// of its 4 warps 16 of them; key tiles of kFlashKeys are gathered from the
// cache into shared memory (V transposed), S = Q K^T and O += P V run as
// mma.sync m16n8k16 (f32 accumulation), and the online softmax works on the
// accumulator registers, whose layout the PTX ISA fixes: thread `lane` holds
// rows lane/4 and lane/4 + 8, columns 2 (lane % 4) and +1 of each 8-column
// tile. Tiles that straddle two requests or padding take the CUDA-core path.
constexpr int kFlashRows = 64;
constexpr int kFlashKeys = 64;
constexpr int kFlashPad = 8;  // elements added to each shared row: no bank conflicts

// D = A B + D for one m16n8k16 tile; TYPE names the 16-bit operand type.
#define TANDEM_MMA16816(TYPE, c, a, b)                                                       \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE                         \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                 \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))

template <typename T>
__device__ __forceinline__ void Mma16816(float* c, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>) {
    TANDEM_MMA16816("f16", c, a, b);
  } else {
    TANDEM_MMA16816("bf16", c, a, b);
  }
#endif
}

template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
  T pair[2] = {FromF<T>(lo), FromF<T>(hi)};
  return *reinterpret_cast<uint32_t*>(pair);
}

__device__ __forceinline__ uint32_t Load32(const void* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

template <int kHd>
constexpr size_t FlashSharedBytes() {
  // K [keys][hd + pad] and V transposed [hd][keys + pad], 2-byte elements.
  return (static_cast<size_t>(kFlashKeys) * (kHd + kFlashPad) +
          static_cast<size_t>(kHd) * (kFlashKeys + kFlashPad)) * 2;
}

template <typename T, int kHd>
__device__ void FlashTile(const PagedAttentionArgs& a, int h, int64_t t0, int r, int count,
                          T* ks, T* vt) {
  constexpr int kKs = kHd + kFlashPad;          // K row stride in shared memory
  constexpr int kVs = kFlashKeys + kFlashPad;   // V^T row stride
  constexpr int kDimSteps = kHd / 16;           // k-steps of S = Q K^T
  constexpr int kKeyTiles = kFlashKeys / 8;     // 8-column tiles of S
  constexpr int kDimTiles = kHd / 8;            // 8-column tiles of O
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int q_begin = a.query_start_loc[r];
  const int q_len = a.query_start_loc[r + 1] - q_begin;
  const int ctx0 = a.seq_lens[r] - q_len + static_cast<int>(t0 - q_begin) + 1;
  const int max_ctx = ctx0 + count - 1;
  // This thread's two rows (tile-relative) and the keys each sees.
  const int row_a = warp * 16 + g, row_b = row_a + 8;
  const int ctx_a = ctx0 + min(row_a, count - 1), ctx_b = ctx0 + min(row_b, count - 1);
  const int first_a = FirstKey(a, ctx_a), first_b = FirstKey(a, ctx_b);
  const int64_t row_stride = (static_cast<int64_t>(a.num_heads) + 2 * a.num_kv_heads) * kHd;
  const T* qkv = static_cast<const T*>(a.qkv);
  // Q as the A operand of each k-step, straight from global memory.
  uint32_t qf[kDimSteps][4];
  {
    const T* qa = qkv + (t0 + min(row_a, count - 1)) * row_stride + static_cast<int64_t>(h) * kHd;
    const T* qb = qkv + (t0 + min(row_b, count - 1)) * row_stride + static_cast<int64_t>(h) * kHd;
#pragma unroll
    for (int s = 0; s < kDimSteps; ++s) {
      qf[s][0] = Load32(qa + s * 16 + 2 * tq);
      qf[s][1] = Load32(qb + s * 16 + 2 * tq);
      qf[s][2] = Load32(qa + s * 16 + 8 + 2 * tq);
      qf[s][3] = Load32(qb + s * 16 + 8 + 2 * tq);
    }
  }
  float o[kDimTiles][4];
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
  const int kv_head = h / (a.num_heads / a.num_kv_heads);
  const int64_t kv_row = static_cast<int64_t>(a.num_kv_heads) * kHd;
  const T* kc = static_cast<const T*>(a.k_cache) + static_cast<int64_t>(kv_head) * kHd;
  const T* vc = static_cast<const T*>(a.v_cache) + static_cast<int64_t>(kv_head) * kHd;
  const int32_t* table = a.block_tables + static_cast<int64_t>(r) * a.table_width;
  constexpr int kVecs = kHd / 8;  // 16-byte vectors per key row
  // From the first row's first key: no row sees one before it.
  for (int tile = FirstKey(a, ctx0); tile < max_ctx; tile += kFlashKeys) {
    __syncthreads();  // the previous tile's K and V are no longer read
    for (int idx = threadIdx.x; idx < kFlashKeys * kVecs; idx += blockDim.x) {
      const int j = idx / kVecs, c = idx % kVecs;
      uint4 kraw = make_uint4(0, 0, 0, 0), vraw = make_uint4(0, 0, 0, 0);
      if (tile + j < max_ctx) {
        const int key = tile + j;
        const int64_t slot =
            static_cast<int64_t>(table[key / a.block_size]) * a.block_size + key % a.block_size;
        kraw = *reinterpret_cast<const uint4*>(kc + slot * kv_row + c * 8);
        vraw = *reinterpret_cast<const uint4*>(vc + slot * kv_row + c * 8);
      }
      *reinterpret_cast<uint4*>(ks + j * kKs + c * 8) = kraw;
      const T* ve = reinterpret_cast<const T*>(&vraw);
#pragma unroll
      for (int e = 0; e < 8; ++e) vt[(c * 8 + e) * kVs + j] = ve[e];
    }
    __syncthreads();
    // S = Q K^T for this warp's 16 rows and the tile's keys.
    float sc[kKeyTiles][4];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
      const T* krow = ks + (n * 8 + g) * kKs;
#pragma unroll
      for (int s = 0; s < kDimSteps; ++s) {
        const uint32_t b[2] = {Load32(krow + s * 16 + 2 * tq), Load32(krow + s * 16 + 8 + 2 * tq)};
        Mma16816<T>(sc[n], qf[s], b);
      }
    }
    // Scale, mask (causal and past the context), and the online softmax.
    float tmax_a = -INFINITY, tmax_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = tile + n * 8 + 2 * tq + e;
        sc[n][e] = key < ctx_a && key >= first_a ? sc[n][e] * a.scale : -INFINITY;
        sc[n][2 + e] = key < ctx_b && key >= first_b ? sc[n][2 + e] * a.scale : -INFINITY;
        tmax_a = fmaxf(tmax_a, sc[n][e]);
        tmax_b = fmaxf(tmax_b, sc[n][2 + e]);
      }
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      tmax_a = fmaxf(tmax_a, __shfl_xor_sync(0xffffffffu, tmax_a, off));
      tmax_b = fmaxf(tmax_b, __shfl_xor_sync(0xffffffffu, tmax_b, off));
    }
    const float mn_a = fmaxf(m_a, tmax_a), mn_b = fmaxf(m_b, tmax_b);
    // A row whose keys all lie in earlier tiles keeps its state; one whose
    // window starts in a later tile has none yet (m -INFINITY, l 0).
    const float corr_a = m_a == -INFINITY ? 0.f : __expf(m_a - mn_a);
    const float corr_b = m_b == -INFINITY ? 0.f : __expf(m_b - mn_b);
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        sc[n][e] = sc[n][e] == -INFINITY ? 0.f : __expf(sc[n][e] - mn_a);
        sc[n][2 + e] = sc[n][2 + e] == -INFINITY ? 0.f : __expf(sc[n][2 + e] - mn_b);
        sum_a += sc[n][e];
        sum_b += sc[n][2 + e];
      }
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      sum_a += __shfl_xor_sync(0xffffffffu, sum_a, off);
      sum_b += __shfl_xor_sync(0xffffffffu, sum_b, off);
    }
    l_a = l_a * corr_a + sum_a;
    l_b = l_b * corr_b + sum_b;
    m_a = mn_a;
    m_b = mn_b;
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      o[i][0] *= corr_a;
      o[i][1] *= corr_a;
      o[i][2] *= corr_b;
      o[i][3] *= corr_b;
    }
    // O += P V: P's accumulator layout is the A operand's, two key tiles per
    // k-step of 16 keys.
#pragma unroll
    for (int s = 0; s < kFlashKeys / 16; ++s) {
      const uint32_t pa[4] = {Pack2<T>(sc[2 * s][0], sc[2 * s][1]),
                              Pack2<T>(sc[2 * s][2], sc[2 * s][3]),
                              Pack2<T>(sc[2 * s + 1][0], sc[2 * s + 1][1]),
                              Pack2<T>(sc[2 * s + 1][2], sc[2 * s + 1][3])};
#pragma unroll
      for (int i = 0; i < kDimTiles; ++i) {
        const T* vrow = vt + (i * 8 + g) * kVs + s * 16;
        const uint32_t b[2] = {Load32(vrow + 2 * tq), Load32(vrow + 8 + 2 * tq)};
        Mma16816<T>(o[i], pa, b);
      }
    }
  }
  const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
  T* out = static_cast<T*>(a.out);
  const int64_t out_row = static_cast<int64_t>(a.num_heads) * kHd;
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i) {
    const int d = i * 8 + 2 * tq;
    if (row_a < count) {
      *reinterpret_cast<uint32_t*>(out + (t0 + row_a) * out_row + h * kHd + d) =
          Pack2<T>(o[i][0] * inv_a, o[i][1] * inv_a);
    }
    if (row_b < count) {
      *reinterpret_cast<uint32_t*>(out + (t0 + row_b) * out_row + h * kHd + d) =
          Pack2<T>(o[i][2] * inv_b, o[i][3] * inv_b);
    }
  }
}

template <typename T, int kHd>
__global__ void __launch_bounds__(kAttnThreads) FlashMixedAttentionKernel(PagedAttentionArgs a) {
  extern __shared__ __align__(16) unsigned char flash_smem[];
  PdlWait();
  const int h = blockIdx.x;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kFlashRows;
  const int64_t t_end = min(a.n, t0 + kFlashRows);
  const int num_reqs = a.num_reqs[0];
  const int64_t real = a.query_start_loc[num_reqs];
  if (t_end <= real) {
    const int r = RequestOf(a, num_reqs, t0);
    if (RequestOf(a, num_reqs, t_end - 1) == r) {
      T* ks = reinterpret_cast<T*>(flash_smem);
      T* vt = ks + kFlashKeys * (kHd + kFlashPad);
      FlashTile<T, kHd>(a, h, t0, r, static_cast<int>(t_end - t0), ks, vt);
      return;
    }
  }
  for (int64_t t = t0; t < t_end; t += kQueryTile) AttendMixedTile<T>(a, h, t, num_reqs);
}

// The compute capability's major version, set by PrepareKernels (0: the
// tensor-core kernels are not used).
int compute_major = 0;

template <typename T, int kHd>
cudaError_t ConfigureFlash() {
  return cudaFuncSetAttribute(FlashMixedAttentionKernel<T, kHd>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(FlashSharedBytes<kHd>()));
}

template <typename T, int kHd>
void LaunchFlash(const PagedAttentionArgs& a, cudaStream_t stream) {
  Launch(FlashMixedAttentionKernel<T, kHd>, dim3(a.num_heads, (a.n + kFlashRows - 1) / kFlashRows),
         kAttnThreads, FlashSharedBytes<kHd>(), stream, a);
}

// Keys per split for a request of `ctx` keys: the context spread over all
// kDecodeSplits blocks (a multiple of 32, at least kMinDecodePartition), so a
// short context still keeps many blocks busy and a long one is bounded in
// splits (and workspace).
__device__ __forceinline__ int DecodePartition(int ctx) {
  const int part = (ctx + kDecodeSplits - 1) / kDecodeSplits;
  return max(kMinDecodePartition, (part + 31) / 32 * 32);
}

// Workspace layout for decode: m[R][H][S], l[R][H][S], acc[R][H][S][hd].
struct DecodeWorkspace {
  float* m;
  float* l;
  float* acc;
  __device__ DecodeWorkspace(float* base, int64_t rows, int heads, int splits)
      : m(base),
        l(base + rows * heads * splits),
        acc(base + 2 * rows * heads * splits) {}
};

template <typename T>
__global__ void DecodeSplitKernel(PagedAttentionArgs a, int splits) {
  PdlWait();
  __shared__ float q[kMaxHeadDim];
  __shared__ float merged[kMaxHeadDim];
  const int h = blockIdx.x, r = blockIdx.y, s = blockIdx.z;
  const int hd = a.head_dim;
  if (r >= a.num_reqs[0]) return;
  const int ctx = a.seq_lens[r];
  const int first = FirstKey(a, ctx);
  const int part = DecodePartition(ctx - first);
  const int begin = first + s * part;
  if (begin >= ctx) return;
  const int end = min(ctx, begin + part);
  const int64_t row = (static_cast<int64_t>(a.num_heads) + 2 * a.num_kv_heads) * hd;
  const int64_t t = a.query_start_loc[r];
  const T* qs = static_cast<const T*>(a.qkv) + t * row + static_cast<int64_t>(h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) q[d] = ToF(qs[d]) * a.scale;
  __syncthreads();
  BlockSoftmax st;
  const int kv_head = h / (a.num_heads / a.num_kv_heads);
  AttendRange<T>(a, q, a.block_tables + static_cast<int64_t>(r) * a.table_width, kv_head, begin,
                 end, st);
  MergeGroups(st, hd, merged);
  DecodeWorkspace ws(a.workspace, a.max_num_seqs, a.num_heads, splits);
  const int64_t cell = (static_cast<int64_t>(r) * a.num_heads + h) * splits + s;
  if (threadIdx.x == 0) {
    ws.m[cell] = st.m;
    ws.l[cell] = st.l;
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) ws.acc[cell * hd + d] = merged[d];
}

template <typename T>
__global__ void DecodeReduceKernel(PagedAttentionArgs a, int splits) {
  PdlWait();
  const int h = blockIdx.x, r = blockIdx.y;
  const int hd = a.head_dim;
  T* o = static_cast<T*>(a.out) + static_cast<int64_t>(r) * a.num_heads * hd +
         static_cast<int64_t>(h) * hd;
  if (r >= a.num_reqs[0]) {
    for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = FromF<T>(0.f);
    return;
  }
  const int keys = a.seq_lens[r] - FirstKey(a, a.seq_lens[r]);
  const int part = DecodePartition(keys);
  const int valid = (keys + part - 1) / part;
  DecodeWorkspace ws(a.workspace, a.max_num_seqs, a.num_heads, splits);
  const int64_t first = (static_cast<int64_t>(r) * a.num_heads + h) * splits;
  float m = -FLT_MAX;
  for (int s = 0; s < valid; ++s) m = fmaxf(m, ws.m[first + s]);
  float l = 0.f;
  for (int s = 0; s < valid; ++s) l += ws.l[first + s] * __expf(ws.m[first + s] - m);
  const float inv = 1.f / l;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float sum = 0.f;
    for (int s = 0; s < valid; ++s) sum += ws.acc[(first + s) * hd + d] * __expf(ws.m[first + s] - m);
    o[d] = FromF<T>(sum * inv);
  }
}

int DecodeSplits(int max_seq_len) {
  return min(kDecodeSplits, (max_seq_len + kMinDecodePartition - 1) / kMinDecodePartition);
}

}  // namespace

cudaError_t Embedding(Storage s, const int32_t* ids, const void* table, int64_t vocab,
                      int64_t hidden, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(s, [&](auto t) {
    LaunchGather<decltype(t)>(table, ids, vocab, hidden, out, n, stream);
  });
}

cudaError_t RmsNorm(Storage s, const void* x, void* residual, const void* weight, float eps,
                    int64_t hidden, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(s, [&](auto t) {
    using T = decltype(t);
    constexpr int64_t kPerVec = 16 / sizeof(T);
    const bool vec = hidden % kPerVec == 0 && hidden / kPerVec <= kThreads * kNormVecs &&
                     Aligned16(x) && Aligned16(weight) && Aligned16(out) &&
                     (residual == nullptr || Aligned16(residual));
    const T* xt = static_cast<const T*>(x);
    const T* wt = static_cast<const T*>(weight);
    T* rt = static_cast<T*>(residual);
    T* ot = static_cast<T*>(out);
    if (vec && residual != nullptr) {
      Launch(RmsNormVecKernel<T, true>, static_cast<unsigned>(n), kThreads, 0, stream, xt, rt, wt,
             eps, hidden, ot);
    } else if (vec) {
      Launch(RmsNormVecKernel<T, false>, static_cast<unsigned>(n), kThreads, 0, stream, xt, nullptr,
             wt, eps, hidden, ot);
    } else if (residual != nullptr) {
      Launch(RmsNormKernel<T, true>, static_cast<unsigned>(n), kThreads, 0, stream, xt, rt, wt, eps,
             hidden, ot);
    } else {
      Launch(RmsNormKernel<T, false>, static_cast<unsigned>(n), kThreads, 0, stream, xt, nullptr,
             wt, eps, hidden, ot);
    }
  });
}

cudaError_t Rope(Storage s, const int32_t* positions, void* qkv, int64_t row_stride,
                 const float* inv_freq, int num_rotated_heads, int head_dim, int64_t n,
                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(s, [&](auto t) {
    using T = decltype(t);
    Launch(RopeKernel<T>, static_cast<unsigned>(n), kThreads, 0, stream, positions,
           static_cast<T*>(qkv), row_stride, inv_freq, num_rotated_heads, head_dim);
  });
}

cudaError_t AddBias(Storage s, void* x, const void* bias, int64_t width, int64_t n,
                    cudaStream_t stream) {
  const int64_t total = n * width;
  if (total == 0) return cudaSuccess;
  return Dispatch(s, [&](auto t) {
    using T = decltype(t);
    Launch(AddBiasKernel<T>, static_cast<unsigned>(Blocks(total, kThreads)), kThreads, 0, stream,
           static_cast<T*>(x), static_cast<const T*>(bias), width, total);
  });
}

cudaError_t HeadRmsNorm(Storage s, void* qkv, int64_t row_stride, const void* q_weight,
                        const void* k_weight, int q_heads, int k_heads, int head_dim, float eps,
                        int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return Dispatch(s, [&](auto t) {
    using T = decltype(t);
    const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(q_heads + k_heads));
    Launch(HeadRmsNormKernel<T>, grid, 32, 0, stream, static_cast<T*>(qkv), row_stride,
           static_cast<const T*>(q_weight), static_cast<const T*>(k_weight), q_heads, head_dim,
           eps);
  });
}

cudaError_t SiluMul(Storage s, const void* gate_up, int64_t inter, void* out, int64_t n,
                    cudaStream_t stream) {
  const int64_t total = n * inter;
  if (total == 0) return cudaSuccess;
  return Dispatch(s, [&](auto t) {
    using T = decltype(t);
    Launch(SiluMulKernel<T>, static_cast<unsigned>(Blocks(total, kThreads)), kThreads, 0, stream,
           static_cast<const T*>(gate_up), inter, static_cast<T*>(out), total);
  });
}

cudaError_t GatherRows(Storage s, const void* src, const int32_t* indices, int64_t width,
                       void* out, int64_t rows, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return Dispatch(s, [&](auto t) {
    LaunchGather<decltype(t)>(src, indices, /*rows=*/0, width, out, rows, stream);
  });
}

bool GemvFits(Storage s, const void* x, const void* w, int64_t m, int64_t k) {
  const int64_t elem = s == Storage::kF32 ? 4 : 2;
  return m >= 1 && m <= kMaxGemvRows && k > 0 && (k * elem) % 16 == 0 && Aligned16(x) &&
         Aligned16(w);
}

cudaError_t Gemv(Storage s, const void* x, const void* w, void* out, bool out_f32, int64_t m,
                 int64_t n, int64_t k, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  return Dispatch(s, [&](auto t) {
    using T = decltype(t);
    if (out_f32) {
      LaunchGemvRows<T, float>(x, w, out, m, n, k, stream);
    } else {
      LaunchGemvRows<T, T>(x, w, out, m, n, k, stream);
    }
  });
}

cudaError_t GemvSiluMul(Storage s, const void* x, const void* w, void* act, int64_t m, int64_t n,
                        int64_t k, cudaStream_t stream) {
  if (m == 0 || n == 0) return cudaSuccess;
  return Dispatch(s, [&](auto t) {
    using T = decltype(t);
    LaunchGemvRows<T, T, true>(x, w, act, m, n, k, stream);
  });
}

cudaError_t WriteKvCache(Storage s, const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  return Dispatch(s, [&](auto t) {
    using T = decltype(t);
    const int64_t kv_row = static_cast<int64_t>(a.num_kv_heads) * a.head_dim;
    const int64_t row = (static_cast<int64_t>(a.num_heads) + 2 * a.num_kv_heads) * a.head_dim;
    const int64_t k_offset = static_cast<int64_t>(a.num_heads) * a.head_dim;
    constexpr int64_t kPerVec = 16 / sizeof(T);
    if (a.head_dim % kPerVec == 0 && Aligned16(a.qkv) && Aligned16(a.k_cache) &&
        Aligned16(a.v_cache)) {
      Launch(WriteKvKernel<uint4>, static_cast<unsigned>(a.n), kAttnThreads, 0, stream,
             static_cast<const uint4*>(a.qkv), static_cast<uint4*>(a.k_cache),
             static_cast<uint4*>(a.v_cache), a.slot_mapping, row / kPerVec, k_offset / kPerVec,
             kv_row / kPerVec);
    } else {
      Launch(WriteKvKernel<T>, static_cast<unsigned>(a.n), kAttnThreads, 0, stream,
             static_cast<const T*>(a.qkv), static_cast<T*>(a.k_cache), static_cast<T*>(a.v_cache),
             a.slot_mapping, row, k_offset, kv_row);
    }
  });
}

cudaError_t PrepareKernels() {
  int device = 0, major = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
      e != cudaSuccess) {
    return e;
  }
  if (major >= 8) {
    for (cudaError_t e : {ConfigureFlash<__nv_bfloat16, 64>(), ConfigureFlash<__nv_bfloat16, 128>(),
                          ConfigureFlash<__half, 64>(), ConfigureFlash<__half, 128>()}) {
      if (e != cudaSuccess) return e;
    }
  }
  compute_major = major;
  pdl_enabled = major >= 9;
  MultiprocessorCount();  // cached now, never first asked while a stream captures
  return cudaSuccess;
}

cudaError_t MixedAttention(Storage s, const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  if (compute_major >= 8 && s != Storage::kF32 && (a.head_dim == 64 || a.head_dim == 128)) {
    if (s == Storage::kBF16) {
      a.head_dim == 64 ? LaunchFlash<__nv_bfloat16, 64>(a, stream)
                       : LaunchFlash<__nv_bfloat16, 128>(a, stream);
    } else {
      a.head_dim == 64 ? LaunchFlash<__half, 64>(a, stream) : LaunchFlash<__half, 128>(a, stream);
    }
    return cudaGetLastError();
  }
  return Dispatch(s, [&](auto t) {
    using T = decltype(t);
    Launch(MixedAttentionKernel<T>, dim3(a.num_heads, (a.n + kQueryTile - 1) / kQueryTile),
           kAttnThreads, 0, stream, a);
  });
}

cudaError_t DecodeAttention(Storage s, const PagedAttentionArgs& a, int max_seq_len,
                            cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  const int splits = DecodeSplits(max_seq_len);
  return Dispatch(s, [&](auto t) {
    using T = decltype(t);
    Launch(DecodeSplitKernel<T>, dim3(a.num_heads, a.n, splits), kAttnThreads, 0, stream, a,
           splits);
    Launch(DecodeReduceKernel<T>, dim3(a.num_heads, a.n), kAttnThreads, 0, stream, a, splits);
  });
}

size_t DecodeWorkspaceFloats(int max_num_seqs, int num_heads, int head_dim, int max_seq_len) {
  return static_cast<size_t>(max_num_seqs) * num_heads * DecodeSplits(max_seq_len) *
         (static_cast<size_t>(head_dim) + 2);
}

}  // namespace cuda_kernels
}  // namespace tandem
