// CopyRuns: many device-to-device copies in one launch (CudaDevice's KV
// hand-off). Host-side declarations, read by nvcc and the host compiler.
#ifndef TANDEM_COMMON_BACKEND_CUDA_COPY_RUNS_H_
#define TANDEM_COMMON_BACKEND_CUDA_COPY_RUNS_H_

#include <cuda_runtime.h>

#include <cstddef>

namespace tandem {

// One span of bytes to copy, device memory on both sides.
struct CopyRun {
  const void* src;
  void* dst;
  size_t bytes;
};

// Copies runs[0, n) (an array in device memory; the runs do not overlap) in
// one launch: a KV chunk's rows gathered out of (or scattered into) the
// blocks they sit in. Returns cudaGetLastError().
cudaError_t CopyRuns(const CopyRun* runs, int n, cudaStream_t stream);

}  // namespace tandem

#endif  // TANDEM_COMMON_BACKEND_CUDA_COPY_RUNS_H_
