// Device: where buffers live and ops run. One per process and backend; the
// engine thread owns it and its stream.
//
// Allocation happens at start-up only: weights, the KV cache and the runner's
// persistent buffers are carved out of arenas (see Arena); nothing is
// allocated inside the step loop.
#ifndef TANDEM_COMMON_BACKEND_DEVICE_H_
#define TANDEM_COMMON_BACKEND_DEVICE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/backend/tensor.h"
#include "common/graph/stream.h"

namespace tandem {

// A span of device memory: one run of a KV cache's rows, say.
struct DeviceRun {
  char* device;
  size_t bytes;
};

// A gather the device was asked for (Device::IssueGather): the copy runs
// while the host goes on; Wait() returns the bytes once it is done. May be
// destroyed on any thread, done or not (a cancelled KV stream drops its
// copies in flight); the bytes are valid while it lives.
class PendingGather {
 public:
  virtual ~PendingGather() = default;
  // Whether Wait() would return at once. Never blocks.
  virtual bool ready() = 0;
  virtual absl::StatusOr<absl::Span<const char>> Wait() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  virtual Stream* stream() = 0;
  // Allocates `bytes` of device memory, 256-byte aligned, owned by the device
  // until it is destroyed. RESOURCE_EXHAUSTED names the size.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // Copies used outside graphs (inputs in, logits out). Both are ordered
  // with the ops on stream(); the host buffer may be reused when they return,
  // and CopyToHost returns with the data in `host`.
  virtual absl::Status CopyToDevice(void* dst, const void* host, size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host, const void* src, size_t bytes) = 0;
  virtual absl::Status Memset(void* dst, int value, size_t bytes) = 0;
  // Many runs at once (a KV chunk's rows, out of the blocks they sit in).
  // IssueGather starts copying `runs`, in order, into one host buffer, after
  // the ops issued on stream() so far, and returns without waiting for them
  // (PendingGather). ScatterToDevice copies the bytes of `host` (pieces, in
  // order: gRPC's slices) into `runs`, in order; the ops issued on stream()
  // afterwards see them, and the pieces may be reused when it returns.
  // INVALID_ARGUMENT when the two sides' sizes differ. These defaults copy
  // piece by piece (CopyToHost, CopyToDevice) at once: memcpy where device
  // memory is host memory. A device that pays per copy (CUDA: a call and a
  // synchronization each) overrides them.
  virtual absl::StatusOr<std::unique_ptr<PendingGather>> IssueGather(
      absl::Span<const DeviceRun> runs);
  virtual absl::Status ScatterToDevice(absl::Span<const absl::string_view> host,
                                       absl::Span<const DeviceRun> runs);
  // Whether an eager run should precede graph capture (vLLM's warm-up: lazy
  // library and allocator initialisation must not happen inside a capture).
  virtual bool warmup_before_capture() const { return true; }
  // Whether device memory is host memory (copies are memcpy, cheap however
  // small).
  virtual bool host_memory() const { return false; }
  // Whether IssueGather returns before its copy is done (a GPU's copy engine;
  // the CPU device in --debug-async-kv-reads).
  virtual bool async_gathers() const { return !host_memory(); }
};

// Bytes in all of `runs` (`pieces`).
size_t TotalBytes(absl::Span<const DeviceRun> runs);
size_t TotalBytes(absl::Span<const absl::string_view> pieces);
// ScatterToDevice's precondition: INVALID_ARGUMENT naming both sizes when
// `host` and `runs` hold different byte counts.
absl::Status CheckScatterSizes(absl::Span<const absl::string_view> host,
                               absl::Span<const DeviceRun> runs);

// Arena: a bump allocator over one Device allocation, for start-up carving of
// many tensors. Not thread-safe.
class Arena {
 public:
  // Allocates the whole arena now.
  static absl::StatusOr<std::unique_ptr<Arena>> Create(Device* device, size_t bytes,
                                                       std::string name);
  // An arena that allocates nothing: Allocate() hands out tensors without
  // data and counts what a real arena would need (ggml-alloc's measure pass).
  // Run the allocation code on it, then Create() an arena of used() bytes and
  // run the same code again, so no size is ever computed by a formula that
  // must track the allocations.
  static std::unique_ptr<Arena> Measure(std::string name);
  // A contiguous tensor of the given shape. RESOURCE_EXHAUSTED names the
  // arena, the request and what is left.
  absl::StatusOr<Tensor> Allocate(DType dtype, std::initializer_list<int64_t> dims);
  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }

 private:
  Arena(char* base, size_t capacity, std::string name)
      : base_(base), capacity_(capacity), name_(std::move(name)) {}
  bool measuring() const { return base_ == nullptr; }
  char* base_;
  size_t capacity_;
  size_t used_ = 0;
  std::string name_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_BACKEND_DEVICE_H_
