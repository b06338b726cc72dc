#include "common/backend/cuda/cuda_device.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/backend/cuda/cuda_check.h"
#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "common/base/status_macros.h"

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

// One gather's pinned buffer, its bytes on the device and its runs' table;
// `done` is recorded on the copy stream after the last copy into `pinned`.
struct GatherSlot {
  char* pinned = nullptr;
  char* staged = nullptr;
  size_t bytes = 0;
  CopyRun* pinned_runs = nullptr;
  CopyRun* device_runs = nullptr;
  size_t runs = 0;
  cudaEvent_t done = nullptr;
};

// The slots of the gathers in flight. Taken on the engine thread, given back
// by whichever thread drops the gather; shared by the device and its gathers,
// so a gather may outlive the device.
class GatherSlots {
 public:
  GatherSlots() = default;
  GatherSlots(const GatherSlots&) = delete;
  GatherSlots& operator=(const GatherSlots&) = delete;
  ~GatherSlots() {
    for (const std::unique_ptr<GatherSlot>& slot : all_) {
      if (slot->done != nullptr) {
        cudaEventSynchronize(slot->done);
        cudaEventDestroy(slot->done);
      }
      if (slot->pinned != nullptr) cudaFreeHost(slot->pinned);
      if (slot->pinned_runs != nullptr) cudaFreeHost(slot->pinned_runs);
      cudaFree(slot->staged);
      cudaFree(slot->device_runs);
    }
  }

  // A free slot with room for `bytes` and `runs`, whose last copies are done.
  absl::StatusOr<GatherSlot*> Take(size_t bytes, size_t runs) {
    GatherSlot* slot = nullptr;
    {
      MutexLock lock(&mu_);
      if (free_.empty()) {
        all_.push_back(std::make_unique<GatherSlot>());
        slot = all_.back().get();
      } else {
        slot = free_.back();
        free_.pop_back();
      }
    }
    absl::Status s = Prepare(slot, bytes, runs);
    if (!s.ok()) {
      Give(slot);
      return s;
    }
    return slot;
  }

  void Give(GatherSlot* slot) {
    MutexLock lock(&mu_);
    free_.push_back(slot);
  }

 private:
  static absl::Status Prepare(GatherSlot* slot, size_t bytes, size_t runs) {
    if (slot->done == nullptr) {
      TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&slot->done, cudaEventDisableTiming));
    }
    // A gather dropped before its copies finished (a cancelled stream) gave
    // its slot back early: its pinned memory is written until then.
    TANDEM_CUDA_CHECK(cudaEventSynchronize(slot->done));
    if (bytes > slot->bytes) {
      slot->bytes = 0;
      RETURN_IF_ERROR(ReplaceTransferPair(&slot->pinned, &slot->staged, bytes));
      slot->bytes = bytes;
    }
    if (runs > slot->runs) {
      slot->runs = 0;
      RETURN_IF_ERROR(ReplaceTransferPair(&slot->pinned_runs, &slot->device_runs, runs));
      slot->runs = runs;
    }
    return absl::OkStatus();
  }

  Mutex mu_;
  std::vector<std::unique_ptr<GatherSlot>> all_ ABSL_GUARDED_BY(mu_);
  std::vector<GatherSlot*> free_ ABSL_GUARDED_BY(mu_);
};

namespace {

class CudaGather : public PendingGather {
 public:
  CudaGather(std::shared_ptr<GatherSlots> slots, GatherSlot* slot, size_t bytes)
      : slots_(std::move(slots)), slot_(slot), bytes_(bytes) {}
  ~CudaGather() override { slots_->Give(slot_); }
  // An error is "ready" too: Wait() reports it.
  bool ready() override { return cudaEventQuery(slot_->done) != cudaErrorNotReady; }
  absl::StatusOr<absl::Span<const char>> Wait() override {
    TANDEM_CUDA_CHECK(cudaEventSynchronize(slot_->done));
    return absl::Span<const char>(slot_->pinned, bytes_);
  }

 private:
  std::shared_ptr<GatherSlots> slots_;
  GatherSlot* slot_;
  size_t bytes_;
};

}  // namespace

absl::Status CudaDevice::EnsureCopyStream() {
  if (copy_stream_ != nullptr) return absl::OkStatus();
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&copy_done_, cudaEventDisableTiming));
  return absl::OkStatus();
}

absl::Status CudaDevice::ReserveTransfer(size_t bytes, size_t runs) {
  RETURN_IF_ERROR(EnsureCopyStream());
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

absl::Status CudaDevice::CopyRunsAfterCompute(const CopyRun* table, CopyRun* device_table,
                                              size_t runs) {
  TANDEM_CUDA_CHECK(cudaEventRecord(compute_done_, stream_.raw()));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, compute_done_, 0));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(device_table, table, runs * sizeof(CopyRun),
                                    cudaMemcpyHostToDevice, copy_stream_));
  TANDEM_CUDA_CHECK(CopyRuns(device_table, static_cast<int>(runs), copy_stream_));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PendingGather>> CudaDevice::IssueGather(
    absl::Span<const DeviceRun> runs) {
  if (!stream_.error().ok()) return stream_.error();
  const size_t total = TotalBytes(runs);
  if (total == 0) return Device::IssueGather(runs);
  RETURN_IF_ERROR(EnsureCopyStream());
  if (gather_slots_ == nullptr) gather_slots_ = std::make_shared<GatherSlots>();
  ASSIGN_OR_RETURN(GatherSlot* slot, gather_slots_->Take(total, runs.size()));
  auto gather = std::make_unique<CudaGather>(gather_slots_, slot, total);  // owns the slot now
  size_t at = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    slot->pinned_runs[i] = {runs[i].device, slot->staged + at, runs[i].bytes};
    at += runs[i].bytes;
  }
  RETURN_IF_ERROR(CopyRunsAfterCompute(slot->pinned_runs, slot->device_runs, runs.size()));
  TANDEM_CUDA_CHECK(
      cudaMemcpyAsync(slot->pinned, slot->staged, total, cudaMemcpyDeviceToHost, copy_stream_));
  TANDEM_CUDA_CHECK(cudaEventRecord(slot->done, copy_stream_));
  return gather;
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
  RETURN_IF_ERROR(CopyRunsAfterCompute(pinned_runs_, device_runs_, runs.size()));
  TANDEM_CUDA_CHECK(cudaEventRecord(copy_done_, copy_stream_));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream_.raw(), copy_done_, 0));
  // The pinned buffer may be refilled by the next call.
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  return absl::OkStatus();
}

}  // namespace tandem
