// The CPU device: host memory (256-byte aligned, zeroed; 2 MiB aligned on
// transparent huge pages from 2 MiB up) and a CpuStream.
#include "common/backend/cpu/cpu_device.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_stream.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// A gather copied when issued (a GPU's copy is ordered there too; the
// default gather's copy) but done only after it has been polled kPolls times.
class LateGather : public PendingGather {
 public:
  explicit LateGather(std::unique_ptr<PendingGather> copied) : copied_(std::move(copied)) {}
  bool ready() override { return ++polls_ >= kPolls; }
  absl::StatusOr<absl::Span<const char>> Wait() override {
    polls_ = kPolls;  // done once waited for
    return copied_->Wait();
  }

 private:
  static constexpr int kPolls = 3;
  std::unique_ptr<PendingGather> copied_;
  int polls_ = 0;
};

class CpuDevice : public Device {
 public:
  explicit CpuDevice(bool late_gathers) : late_gathers_(late_gathers) {}
  ~CpuDevice() override {
    for (void* p : allocations_) std::free(p);
  }
  std::string name() const override { return "cpu"; }
  // Nothing on the CPU is initialised lazily by a first run, and recording
  // runs no op: a warm-up forward would only cost start-up time.
  bool warmup_before_capture() const override { return false; }
  bool host_memory() const override { return true; }
  bool async_gathers() const override { return late_gathers_; }
  absl::StatusOr<std::unique_ptr<PendingGather>> IssueGather(
      absl::Span<const DeviceRun> runs) override {
    ASSIGN_OR_RETURN(std::unique_ptr<PendingGather> copied, Device::IssueGather(runs));
    if (!late_gathers_) return copied;
    return std::make_unique<LateGather>(std::move(copied));
  }
  Stream* stream() override { return &stream_; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    // Arenas of 2 MiB and more (weights, KV cache) on transparent huge
    // pages where the kernel allows them (THP "madvise" or "always"): a
    // decode step streams every weight once, and with 4 KiB pages it walks
    // 130 thousand of them for SmolLM2 in f32. 2-vCPU Zen 5, f32 SmolLM2,
    // medians of 6-8 interleaved runs: decode 24.4 -> 21.6 ms at 1 thread,
    // 16.7 -> 15.3 ms at 2, prefill of 16 and 512 tokens 4-12% faster
    // (docs/benchmarks.md, "Huge pages for the CPU arenas").
    const bool huge = bytes >= kHugePage;
    const size_t align = huge ? kHugePage : 256;
    const size_t rounded = (bytes + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded == 0 ? 256 : rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu: cannot allocate ", bytes, " bytes"));
    }
    // Advice only: a kernel without THP leaves the pages as they are.
    if (huge) (void)madvise(p, rounded, MADV_HUGEPAGE);
    std::memset(p, 0, rounded);
    allocations_.push_back(p);
    return p;
  }
  absl::Status CopyToDevice(void* dst, const void* host, size_t bytes) override {
    std::memcpy(dst, host, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* host, const void* src, size_t bytes) override {
    std::memcpy(host, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Memset(void* dst, int value, size_t bytes) override {
    std::memset(dst, value, bytes);
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;
  bool late_gathers_;
  CpuStream stream_;
  std::vector<void*> allocations_;
};

}  // namespace

std::unique_ptr<Device> CreateCpuDevice(bool late_gathers) {
  return std::make_unique<CpuDevice>(late_gathers);
}

}  // namespace tandem
