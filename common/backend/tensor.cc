#include "common/backend/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
  }
  return "?";
}

Tensor::Tensor(void* ptr, DType type, std::initializer_list<int64_t> dims)
    : data(ptr), dtype(type), ndim(static_cast<int>(dims.size())) {
  int i = 0;
  for (int64_t d : dims) shape[i++] = d;
  int64_t stride = 1;
  for (int k = ndim - 1; k >= 0; --k) {
    strides[k] = stride;
    stride *= shape[k];
  }
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return ndim == 0 ? 0 : n;
}

bool Tensor::contiguous() const {
  int64_t stride = 1;
  for (int k = ndim - 1; k >= 0; --k) {
    if (strides[k] != stride) return false;
    stride *= shape[k];
  }
  return true;
}

Tensor Tensor::Rows(int64_t rows) const {
  Tensor t = *this;
  t.shape[0] = rows;
  return t;
}

std::string Tensor::ShapeString() const {
  return absl::StrCat(DTypeName(dtype), "[",
                      absl::StrJoin(shape.begin(), shape.begin() + ndim, ", "), "]");
}

}  // namespace tandem
