// The CUDA backend module's entry point, found by dlsym() (see
// common/kernels/backend.h). The only symbol the loader needs.
#include "common/backend/cuda/cuda_device.h"
#include "common/kernels/backend.h"
#include "common/kernels/cuda/cuda_ops.h"

extern "C" __attribute__((visibility("default"))) void TandemCreateCudaBackend(
    tandem::DType dtype, tandem::Backend* out, absl::Status* status) {
  auto device = tandem::CudaDevice::Create();
  if (!device.ok()) {
    *status = device.status();
    return;
  }
  auto ops = tandem::CreateCudaOps(device->get(), dtype);
  if (!ops.ok()) {
    *status = ops.status();
    return;
  }
  out->device = std::move(device).value();
  out->ops = std::move(ops).value();
  *status = absl::OkStatus();
}
