// TANDEM_CUDA_CHECK: the one way CUDA runtime and cuBLAS calls are checked.
//
//   TANDEM_CUDA_CHECK(cudaMemcpyAsync(...));
//   TANDEM_CUDA_CHECK(cublasGemmEx(...));
//
// On failure the enclosing function returns an absl::Status (INTERNAL, or
// RESOURCE_EXHAUSTED for out-of-memory, FAILED_PRECONDITION for a missing
// device or driver) whose message names the call, the error, the file and
// the line. Kernel launchers return cudaGetLastError() so launches go through
// the same macro.
#ifndef TANDEM_COMMON_BACKEND_CUDA_CUDA_CHECK_H_
#define TANDEM_COMMON_BACKEND_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace tandem {

absl::Status CudaCallStatus(cudaError_t result, const char* call, const char* file, int line);
absl::Status CudaCallStatus(cublasStatus_t result, const char* call, const char* file, int line);

}  // namespace tandem

#define TANDEM_CUDA_CHECK(call)                                                              \
  do {                                                                                       \
    if (absl::Status _tandem_cuda_status =                                                   \
            ::tandem::CudaCallStatus((call), #call, __FILE__, __LINE__);                     \
        !_tandem_cuda_status.ok()) {                                                         \
      return _tandem_cuda_status;                                                            \
    }                                                                                        \
  } while (0)

#endif  // TANDEM_COMMON_BACKEND_CUDA_CUDA_CHECK_H_
