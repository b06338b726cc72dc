#include "common/backend/device.h"

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

absl::StatusOr<std::unique_ptr<Arena>> Arena::Create(Device* device, size_t bytes,
                                                     std::string name) {
  auto base = device->Allocate(bytes);
  if (!base.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "arena '", name, "': ", base.status().message()));
  }
  return std::unique_ptr<Arena>(new Arena(static_cast<char*>(*base), bytes, std::move(name)));
}

std::unique_ptr<Arena> Arena::Measure(std::string name) {
  return std::unique_ptr<Arena>(new Arena(nullptr, SIZE_MAX, std::move(name)));
}

absl::StatusOr<Tensor> Arena::Allocate(DType dtype, std::initializer_list<int64_t> dims) {
  Tensor t(nullptr, dtype, dims);
  const size_t bytes = (t.nbytes() + 255) / 256 * 256;
  if (measuring()) {
    used_ += bytes;
    return t;
  }
  if (used_ + bytes > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "arena '", name_, "': cannot allocate ", t.ShapeString(), " (", bytes,
        " bytes); ", capacity_ - used_, " of ", capacity_, " bytes left"));
  }
  t.data = base_ + used_;
  used_ += bytes;
  return t;
}

std::unique_ptr<Device> CreateCpuDevice() { return std::make_unique<CpuDevice>(); }

}  // namespace tandem
