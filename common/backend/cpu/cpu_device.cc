// The CPU device: host memory (256-byte aligned, zeroed) and a CpuStream.
#include "common/backend/cpu/cpu_device.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_stream.h"

namespace tandem {
namespace {

class CpuDevice : public Device {
 public:
  ~CpuDevice() override {
    for (void* p : allocations_) std::free(p);
  }
  std::string name() const override { return "cpu"; }
  // Nothing on the CPU is initialised lazily by a first run, and recording
  // runs no op: a warm-up forward would only cost start-up time.
  bool warmup_before_capture() const override { return false; }
  Stream* stream() override { return &stream_; }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const size_t rounded = (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu: cannot allocate ", bytes, " bytes"));
    }
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
  CpuStream stream_;
  std::vector<void*> allocations_;
};

}  // namespace

std::unique_ptr<Device> CreateCpuDevice() { return std::make_unique<CpuDevice>(); }

}  // namespace tandem
