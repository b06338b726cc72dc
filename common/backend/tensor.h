// Tensor: a non-owning view of device memory (dtype, shape, strides, pointer).
// Buffers live in arenas allocated at start-up (see arena.h); a Tensor never
// frees anything and is cheap to copy.
#ifndef TANDEM_COMMON_BACKEND_TENSOR_H_
#define TANDEM_COMMON_BACKEND_TENSOR_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/strings/string_view.h"

namespace tandem {

// kQ8_0 is a block type for weights only (GGML's Q8_0): every 32 consecutive
// elements of a row are one block of an f16 scale d and 32 int8 q, value
// d * q; rows are whole blocks.
enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kQ8_0 };

inline constexpr int64_t kQ8BlockElems = 32;
inline constexpr size_t kQ8BlockBytes = 2 + 32;

// Bytes of one element; 0 for a block type (see DTypeBytes).
size_t DTypeSize(DType dtype);
// Bytes of `n` elements (for kQ8_0, n a multiple of kQ8BlockElems).
size_t DTypeBytes(DType dtype, int64_t n);
absl::string_view DTypeName(DType dtype);

// Host-side conversions between f32 and a storage dtype (f32, f16, bf16, or
// q8_0 with n a multiple of 32), rounding to nearest (even). Used when
// weights are loaded and when tests read device buffers back.
void ConvertFromF32(const float* src, DType dtype, void* dst, int64_t n);
void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n);

struct Tensor {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements

  Tensor() = default;
  // A contiguous (row-major) tensor.
  Tensor(void* ptr, DType type, std::initializer_list<int64_t> dims);

  int64_t dim(int i) const { return shape[i]; }
  int64_t numel() const;
  size_t nbytes() const { return DTypeBytes(dtype, numel()); }
  bool contiguous() const;

  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  float* f32() const { return static_cast<float*>(data); }
  int32_t* i32() const { return static_cast<int32_t*>(data); }

  // The first `rows` rows of dimension 0 (same pointer, smaller shape).
  Tensor Rows(int64_t rows) const;
  // "f32[8, 64]"
  std::string ShapeString() const;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_BACKEND_TENSOR_H_
