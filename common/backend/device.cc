#include "common/backend/device.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem {

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
