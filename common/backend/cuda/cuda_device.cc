#include "common/backend/cuda/cuda_device.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/backend/cuda/cuda_check.h"
#include "common/base/status_macros.h"
#include "common/base/logging.h"

namespace tandem {

absl::Status CudaCallStatus(cudaError_t result, const char* call, const char* file, int line) {
  if (result == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a non-sticky error so later calls start clean
  const std::string message = absl::StrCat(call, " failed: ", cudaGetErrorName(result), " (",
                                           cudaGetErrorString(result), ") at ", file, ":", line);
  switch (result) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoKernelImageForDevice:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudaCallStatus(cublasStatus_t result, const char* call, const char* file, int line) {
  if (result == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(call, " failed: ", cublasGetStatusName(result), " (",
                                           cublasGetStatusString(result), ") at ", file, ":",
                                           line);
  if (result == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  if (result == CUBLAS_STATUS_NOT_SUPPORTED || result == CUBLAS_STATUS_ARCH_MISMATCH) {
    return absl::FailedPreconditionError(message);
  }
  return absl::InternalError(message);
}

// --- CudaGraph ---------------------------------------------------------------

CudaGraph::~CudaGraph() { cudaGraphExecDestroy(exec_); }

absl::Status CudaGraph::Replay() {
  if (!stream_->error().ok()) return stream_->error();
  TANDEM_CUDA_CHECK(cudaGraphLaunch(exec_, stream_->raw()));
  return absl::OkStatus();
}

// --- CudaStream --------------------------------------------------------------

CudaStream::~CudaStream() { cudaStreamDestroy(stream_); }

void CudaStream::RecordError(absl::Status status) {
  if (!status.ok() && error_.ok()) error_ = std::move(status);
}

absl::Status CudaStream::BeginCapture() {
  if (capturing_) return absl::FailedPreconditionError("a CUDA graph capture is in progress");
  if (!error_.ok()) return error_;
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Graph>> CudaStream::EndCapture() {
  if (!capturing_) return absl::FailedPreconditionError("no CUDA graph capture is in progress");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  // End the capture even after a failed launch, so the stream is usable.
  const absl::Status ended = CudaCallStatus(cudaStreamEndCapture(stream_, &graph),
                                            "cudaStreamEndCapture(stream_, &graph)", __FILE__,
                                            __LINE__);
  auto destroy = [&graph] {
    if (graph != nullptr) cudaGraphDestroy(graph);
  };
  if (!error_.ok() || !ended.ok()) {
    destroy();
    return error_.ok() ? ended : error_;
  }
  auto instantiate = [&]() -> absl::StatusOr<std::unique_ptr<Graph>> {
    size_t num_nodes = 0;
    TANDEM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &num_nodes));
    cudaGraphExec_t exec = nullptr;
    TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    return std::unique_ptr<Graph>(new CudaGraph(this, exec, num_nodes));
  };
  auto result = instantiate();
  destroy();
  return result;
}

absl::Status CudaStream::Synchronize() {
  if (!error_.ok()) return error_;
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

// --- CudaDevice --------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create() {
  auto setup = [](std::string* name, cudaStream_t* stream) -> absl::Status {
    int count = 0;
    TANDEM_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (count == 0) return absl::FailedPreconditionError("cudaGetDeviceCount found 0 GPUs");
    int index = 0;
    TANDEM_CUDA_CHECK(cudaGetDevice(&index));
    cudaDeviceProp prop;
    TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    if (prop.major < 8) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GPU ", index, " (", prop.name, ") has compute capability ", prop.major, ".",
          prop.minor, "; this build's kernels target sm_80 and sm_90 (Ampere or newer)"));
    }
    *name = absl::StrFormat("cuda:%d (%s, sm_%d%d, %.0f GiB)", index, prop.name, prop.major,
                            prop.minor, prop.totalGlobalMem / double(1 << 30));
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking));
    return absl::OkStatus();
  };
  std::string name;
  cudaStream_t stream = nullptr;
  if (absl::Status s = setup(&name, &stream); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device=cuda: no usable GPU: ", s.message(),
        ". Check the NVIDIA driver and the visible GPUs (nvidia-smi, CUDA_VISIBLE_DEVICES), "
        "or run with device=cpu"));
  }
  TANDEM_LOG(INFO) << "CUDA device " << name;
  return std::unique_ptr<CudaDevice>(new CudaDevice(std::move(name), stream));
}

CudaDevice::~CudaDevice() {
  cudaStreamSynchronize(stream_.raw());
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
    cudaEventDestroy(compute_done_);
    cudaEventDestroy(copy_done_);
  }
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  if (pinned_runs_ != nullptr) cudaFreeHost(pinned_runs_);
  cudaFree(staged_);
  cudaFree(device_runs_);
  for (void* p : allocations_) cudaFree(p);
}

absl::StatusOr<void*> CudaDevice::Allocate(size_t bytes) {
  const size_t rounded = (bytes + 255) / 256 * 256;
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, rounded == 0 ? 256 : rounded); e != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    return absl::ResourceExhaustedError(absl::StrCat(
        name_, ": cannot allocate ", bytes, " bytes (", cudaGetErrorString(e), "; ",
        free_bytes >> 20, " of ", total >> 20, " MiB free)"));
  }
  allocations_.push_back(p);
  TANDEM_CUDA_CHECK(cudaMemsetAsync(p, 0, rounded == 0 ? 256 : rounded, stream_.raw()));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_.raw()));
  return p;
}

absl::Status CudaDevice::Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (!stream_.error().ok()) return stream_.error();
  if (bytes == 0) return absl::OkStatus();
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream_.raw()));
  // Host to device from pageable memory returns once the source is staged,
  // so the host buffer is free again and stream order does the rest: the
  // step's input copies cost no synchronization. Device to host waits.
  if (kind != cudaMemcpyHostToDevice) TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_.raw()));
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyToDevice(void* dst, const void* host, size_t bytes) {
  return Copy(dst, host, bytes, cudaMemcpyHostToDevice);
}

absl::Status CudaDevice::CopyToHost(void* host, const void* src, size_t bytes) {
  return Copy(host, src, bytes, cudaMemcpyDeviceToHost);
}

absl::Status CudaDevice::Memset(void* dst, int value, size_t bytes) {
  if (!stream_.error().ok()) return stream_.error();
  TANDEM_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream_.raw()));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_.raw()));
  return absl::OkStatus();
}

namespace {

// Frees *pinned (host, page-locked) and *device, then allocates `count`
// elements of each.
template <typename T>
absl::Status ReplaceTransferPair(T** pinned, T** device, size_t count) {
  if (*pinned != nullptr) TANDEM_CUDA_CHECK(cudaFreeHost(*pinned));
  if (*device != nullptr) TANDEM_CUDA_CHECK(cudaFree(*device));
  *pinned = *device = nullptr;
  TANDEM_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(pinned), count * sizeof(T),
                                  cudaHostAllocDefault));
  TANDEM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(device), count * sizeof(T)));
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaDevice::ReserveTransfer(size_t bytes, size_t runs) {
  if (copy_stream_ == nullptr) {
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&copy_done_, cudaEventDisableTiming));
  }
  // Doubling: a KV stream's chunks settle on one size after the first few.
  if (bytes > transfer_bytes_) {
    const size_t size = std::max(bytes, 2 * transfer_bytes_);
    transfer_bytes_ = 0;
    RETURN_IF_ERROR(ReplaceTransferPair(&pinned_, &staged_, size));
    transfer_bytes_ = size;
  }
  if (runs > transfer_runs_) {
    const size_t count = std::max(runs, 2 * transfer_runs_);
    transfer_runs_ = 0;
    RETURN_IF_ERROR(ReplaceTransferPair(&pinned_runs_, &device_runs_, count));
    transfer_runs_ = count;
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyRunsAfterCompute(size_t runs) {
  TANDEM_CUDA_CHECK(cudaEventRecord(compute_done_, stream_.raw()));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, compute_done_, 0));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(device_runs_, pinned_runs_,
                                    runs * sizeof(CopyRun),
                                    cudaMemcpyHostToDevice, copy_stream_));
  TANDEM_CUDA_CHECK(CopyRuns(device_runs_, static_cast<int>(runs), copy_stream_));
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const char>> CudaDevice::GatherToHost(
    absl::Span<const DeviceRun> runs) {
  if (!stream_.error().ok()) return stream_.error();
  const size_t total = TotalBytes(runs);
  if (total == 0) return absl::Span<const char>();
  RETURN_IF_ERROR(ReserveTransfer(total, runs.size()));
  size_t at = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    pinned_runs_[i] = {runs[i].device, staged_ + at, runs[i].bytes};
    at += runs[i].bytes;
  }
  RETURN_IF_ERROR(CopyRunsAfterCompute(runs.size()));
  TANDEM_CUDA_CHECK(
      cudaMemcpyAsync(pinned_, staged_, total, cudaMemcpyDeviceToHost, copy_stream_));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  return absl::Span<const char>(pinned_, total);
}

absl::Status CudaDevice::ScatterToDevice(absl::Span<const absl::string_view> host,
                                         absl::Span<const DeviceRun> runs) {
  if (!stream_.error().ok()) return stream_.error();
  RETURN_IF_ERROR(CheckScatterSizes(host, runs));
  const size_t total = TotalBytes(runs);
  if (total == 0) return absl::OkStatus();
  RETURN_IF_ERROR(ReserveTransfer(total, runs.size()));
  size_t at = 0;
  for (absl::string_view p : host) {
    std::memcpy(pinned_ + at, p.data(), p.size());
    at += p.size();
  }
  at = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    pinned_runs_[i] = {staged_ + at, runs[i].device, runs[i].bytes};
    at += runs[i].bytes;
  }
  TANDEM_CUDA_CHECK(
      cudaMemcpyAsync(staged_, pinned_, total, cudaMemcpyHostToDevice, copy_stream_));
  // The runs are written after the compute stream's work so far (nothing
  // still reads a block that changed hands), and its later work sees them.
  RETURN_IF_ERROR(CopyRunsAfterCompute(runs.size()));
  TANDEM_CUDA_CHECK(cudaEventRecord(copy_done_, copy_stream_));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream_.raw(), copy_done_, 0));
  // The pinned buffer may be refilled by the next call.
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  return absl::OkStatus();
}

}  // namespace tandem
