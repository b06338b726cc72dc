// Backend: a Device and the Ops that run on it, chosen by --device.
//
//   cpu   host memory, recorded graphs, OpenBLAS (always built in)
//   cuda  device memory, CUDA graphs, cuBLAS; lives in a separate module,
//         libtandem_cuda.so, opened with dlopen() only when asked for
//
// The CUDA module is never linked into the workers: cuBLAS reserves a large
// static TLS block per thread in any process that links it, which breaks the
// small-stack threads of the metrics HTTP server. Opened late with dlopen(),
// its TLS is allocated lazily instead, and a CPU process never loads it.
//
// The module is looked for in $TANDEM_CUDA_MODULE, then next to the
// executable (../lib/ and the executable's own directory), then on the
// library search path.
#ifndef TANDEM_COMMON_KERNELS_BACKEND_H_
#define TANDEM_COMMON_KERNELS_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/backend/device.h"
#include "common/kernels/ops.h"

namespace tandem {

struct BackendOptions {
  std::string device = "cpu";  // cpu | cuda
  // f32 | bf16 | f16 | auto (f32 on cpu, bf16 on cuda).
  std::string dtype = "auto";
  int threads = 0;  // cpu: threads of every op (0: every CPU this process may use)
  // Matmul weights: auto (cpu: a GGUF's quantized tensors kept in their blocks,
  // Q4_0, Q4_1 and Q8_0 as stored, Q4_K as Q4_1, the other block types as Q8_0, the rest in
  // the storage dtype; cuda: the storage dtype), dense (every matmul weight in
  // the storage dtype: a GGUF's blocks widened), q8_0 (cpu, weight-only 8-bit)
  // or gguf (the old name of auto's cpu behaviour).
  std::string weight_dtype = "auto";
  // Debug (cpu): KV reads complete after the host has gone on, as a GPU's
  // copies do (CreateCpuDevice's late gathers). No effect on cuda, whose
  // reads are asynchronous anyway.
  bool debug_async_kv_reads = false;
};

struct Backend {
  ~Backend() {
    ops.reset();  // ops hold handles on the device's stream
    device.reset();
  }
  std::unique_ptr<Device> device;
  std::unique_ptr<Ops> ops;
};

// INVALID_ARGUMENT for an unknown device or dtype; FAILED_PRECONDITION when
// the CUDA module is not built or no usable GPU is visible, with the reason.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

// The entry point the CUDA module exports (C linkage, resolved by dlsym):
// fills `out` with the current GPU and its ops in `dtype`, or sets `status`.
using CreateCudaBackendFn = void (*)(DType dtype, Backend* out, absl::Status* status);
inline constexpr char kCudaModuleName[] = "libtandem_cuda.so";
inline constexpr char kCudaModuleEntry[] = "TandemCreateCudaBackend";

// Parses "f32" | "bf16" | "f16"; INVALID_ARGUMENT names the flag and value.
absl::StatusOr<DType> ParseStorageDType(const std::string& name);

}  // namespace tandem

#endif  // TANDEM_COMMON_KERNELS_BACKEND_H_
