// The CUDA implementation of Ops: kernels from kernels.cu and cuBLAS, all
// issued on the CudaDevice's stream (so they are captured into its graphs).
#ifndef TANDEM_COMMON_KERNELS_CUDA_CUDA_OPS_H_
#define TANDEM_COMMON_KERNELS_CUDA_CUDA_OPS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/backend/cuda/cuda_device.h"
#include "common/kernels/ops.h"

namespace tandem {

// `dtype`: f32, f16 or bf16 storage. Creates the cuBLAS handle bound to the
// device's stream with its workspace, set once.
absl::StatusOr<std::unique_ptr<Ops>> CreateCudaOps(CudaDevice* device, DType dtype);

}  // namespace tandem

#endif  // TANDEM_COMMON_KERNELS_CUDA_CUDA_OPS_H_
