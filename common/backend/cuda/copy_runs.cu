#include "common/backend/cuda/copy_runs.h"

#include <cstdint>

namespace tandem {
namespace {

// One thread block a run at a time; 16-byte words where both ends are
// aligned (a KV block's rows always are), bytes otherwise.
__global__ void CopyRunsKernel(const CopyRun* __restrict__ runs, int n) {
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const CopyRun run = runs[r];
    const char* src = static_cast<const char*>(run.src);
    char* dst = static_cast<char*>(run.dst);
    size_t done = 0;
    if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
      const size_t words = run.bytes / 16;
      for (size_t w = threadIdx.x; w < words; w += blockDim.x) {
        reinterpret_cast<uint4*>(dst)[w] = reinterpret_cast<const uint4*>(src)[w];
      }
      done = words * 16;
    }
    for (size_t b = done + threadIdx.x; b < run.bytes; b += blockDim.x) dst[b] = src[b];
  }
}

}  // namespace

cudaError_t CopyRuns(const CopyRun* runs, int n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  CopyRunsKernel<<<n < 1024 ? n : 1024, 256, 0, stream>>>(runs, n);
  return cudaGetLastError();
}

}  // namespace tandem
