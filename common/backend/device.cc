#include "common/backend/device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

size_t TotalBytes(absl::Span<const DeviceRun> runs) {
  size_t n = 0;
  for (const DeviceRun& r : runs) n += r.bytes;
  return n;
}

size_t TotalBytes(absl::Span<const absl::string_view> pieces) {
  size_t n = 0;
  for (absl::string_view p : pieces) n += p.size();
  return n;
}

absl::Status CheckScatterSizes(absl::Span<const absl::string_view> host,
                               absl::Span<const DeviceRun> runs) {
  const size_t host_bytes = TotalBytes(host), run_bytes = TotalBytes(runs);
  if (host_bytes == run_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("scatter to device: ", host_bytes,
                                                 " bytes of host pieces for ", run_bytes,
                                                 " bytes of runs"));
}

namespace {

// The default gather: copied when issued.
class CopiedGather : public PendingGather {
 public:
  explicit CopiedGather(size_t bytes) : bytes_(bytes) {}
  bool ready() override { return true; }
  absl::StatusOr<absl::Span<const char>> Wait() override { return absl::Span<const char>(bytes_); }
  char* data() { return bytes_.data(); }

 private:
  std::vector<char> bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PendingGather>> Device::IssueGather(
    absl::Span<const DeviceRun> runs) {
  auto gather = std::make_unique<CopiedGather>(TotalBytes(runs));
  size_t at = 0;
  for (const DeviceRun& r : runs) {
    RETURN_IF_ERROR(CopyToHost(gather->data() + at, r.device, r.bytes));
    at += r.bytes;
  }
  return gather;
}

absl::Status Device::ScatterToDevice(absl::Span<const absl::string_view> host,
                                     absl::Span<const DeviceRun> runs) {
  RETURN_IF_ERROR(CheckScatterSizes(host, runs));
  // One copy wherever a piece and a run overlap.
  size_t piece = 0, at = 0;  // the next byte: host[piece][at]
  for (const DeviceRun& r : runs) {
    for (size_t done = 0; done < r.bytes;) {
      while (at == host[piece].size()) ++piece, at = 0;
      const size_t part = std::min(r.bytes - done, host[piece].size() - at);
      RETURN_IF_ERROR(CopyToDevice(r.device + done, host[piece].data() + at, part));
      done += part;
      at += part;
    }
  }
  return absl::OkStatus();
}

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

}  // namespace tandem
