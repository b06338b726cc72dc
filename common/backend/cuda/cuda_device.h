// The CUDA device: memory from cudaMalloc at start-up (carved by Arenas), one
// non-blocking stream, and real CUDA graphs.
//
// CudaStream::BeginCapture() starts stream capture in
// cudaStreamCaptureModeThreadLocal (other threads' CUDA calls are not
// disturbed); EndCapture() instantiates the graph once; CudaGraph::Replay()
// is one cudaGraphLaunch on the same stream. Nothing is allocated while
// capturing: every kernel reads and writes arena buffers and the static
// workspaces (cuBLAS's, attention's), which all graphs share.
//
// Ops issue asynchronously and return nothing, so a failed launch is kept as
// the stream's error (the first one wins) and returned by the next
// Synchronize(), EndCapture(), Replay() or copy.
//
// Owned and used by the engine thread.
#ifndef TANDEM_COMMON_BACKEND_CUDA_CUDA_DEVICE_H_
#define TANDEM_COMMON_BACKEND_CUDA_CUDA_DEVICE_H_

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/device.h"
#include "common/backend/cuda/copy_runs.h"

namespace tandem {

class CudaStream;
class GatherSlots;

class CudaGraph : public Graph {
 public:
  ~CudaGraph() override;
  absl::Status Replay() override;
  size_t num_nodes() const override { return num_nodes_; }

 private:
  friend class CudaStream;
  CudaGraph(CudaStream* stream, cudaGraphExec_t exec, size_t num_nodes)
      : stream_(stream), exec_(exec), num_nodes_(num_nodes) {}
  CudaStream* stream_;
  cudaGraphExec_t exec_;
  size_t num_nodes_;
};

class CudaStream : public Stream {
 public:
  explicit CudaStream(cudaStream_t stream) : stream_(stream) {}
  ~CudaStream() override;

  cudaStream_t raw() const { return stream_; }
  // Keeps the first error of an asynchronous op; returned by the next
  // synchronizing call.
  void RecordError(absl::Status status);
  absl::Status error() const { return error_; }

  absl::Status BeginCapture() override;
  absl::StatusOr<std::unique_ptr<Graph>> EndCapture() override;
  bool capturing() const override { return capturing_; }
  absl::Status Synchronize() override;
  bool Busy() override { return cudaStreamQuery(stream_) == cudaErrorNotReady; }

 private:
  cudaStream_t stream_;
  bool capturing_ = false;
  absl::Status error_;
};

class CudaDevice : public Device {
 public:
  // The current GPU (CUDA_VISIBLE_DEVICES picks it). FAILED_PRECONDITION with
  // the CUDA error when no usable GPU or driver is present, or when the GPU
  // is older than this build's targets (sm_80).
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create();
  ~CudaDevice() override;

  std::string name() const override { return name_; }
  Stream* stream() override { return &stream_; }
  CudaStream* cuda_stream() { return &stream_; }
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  absl::Status CopyToDevice(void* dst, const void* host, size_t bytes) override;
  absl::Status CopyToHost(void* host, const void* src, size_t bytes) override;
  absl::Status Memset(void* dst, int value, size_t bytes) override;
  // One launch gathers (scatters) every run on the device, and one DMA
  // moves the bytes between the device and pinned host memory, on a stream
  // of their own: ordered after (before) the compute stream's work by
  // events, never synchronizing it. Run by run, each run was a copy and a
  // synchronization of the compute stream: ~7,700 of them for a 2048-token
  // prompt of a 30-layer model in 16-token blocks. A gather returns once it
  // is queued: a layer's KV issued from the layer hook is copied while the
  // GPU computes the next layers, each gather in a pinned slot of its own
  // (GatherSlots) until its PendingGather goes.
  absl::StatusOr<std::unique_ptr<PendingGather>> IssueGather(
      absl::Span<const DeviceRun> runs) override;
  absl::Status ScatterToDevice(absl::Span<const absl::string_view> host,
                               absl::Span<const DeviceRun> runs) override;

 private:
  CudaDevice(std::string name, cudaStream_t stream) : name_(std::move(name)), stream_(stream) {}
  absl::Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
  // Room for `bytes` and `runs` in the transfer buffers below (grown, never
  // shrunk; the copy stream and its events made on first use).
  absl::Status ReserveTransfer(size_t bytes, size_t runs);
  // The copy stream and its events, made on first use.
  absl::Status EnsureCopyStream();
  // The runs' table (pinned `table`) to `device_table`, then the launch that
  // copies them, on copy_stream_ after the work issued on stream_ so far.
  absl::Status CopyRunsAfterCompute(const CopyRun* table, CopyRun* device_table, size_t runs);

  std::string name_;
  CudaStream stream_;
  std::vector<void*> allocations_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr;  // on stream_: what the copies wait for
  cudaEvent_t copy_done_ = nullptr;     // on copy_stream_: what stream_ waits for
  char* pinned_ = nullptr;              // host bytes, page-locked
  char* staged_ = nullptr;              // the same bytes, contiguous on the device
  size_t transfer_bytes_ = 0;
  CopyRun* pinned_runs_ = nullptr;
  CopyRun* device_runs_ = nullptr;
  size_t transfer_runs_ = 0;
  std::shared_ptr<GatherSlots> gather_slots_;  // shared with the gathers in flight
};

}  // namespace tandem

#endif  // TANDEM_COMMON_BACKEND_CUDA_CUDA_DEVICE_H_
