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

// kQ8_0, kQ4_0 and kQ4_1 are block types for weights only (GGML's): every
// 32 consecutive elements of a row are one block; rows are whole blocks.
//   Q8_0: f16 scale d, 32 int8 q; value d * q.
//   Q4_0: f16 d, 16 bytes of 4-bit q (element j in the low nibble of byte j,
//         element j + 16 in its high nibble); value d * (q - 8).
//   Q4_1: f16 d, f16 minimum m, 16 bytes of q as Q4_0; value d * q + m.
enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kQ8_0, kQ4_0, kQ4_1 };

inline constexpr int64_t kBlockElems = 32;  // elements of every block type
inline constexpr size_t kQ8BlockBytes = 2 + 32;

// Whether `dtype` is one of the block types, and the bytes of one block.
bool IsBlockType(DType dtype);
size_t BlockBytes(DType dtype);
// Bytes of one element; 0 for a block type (see DTypeBytes).
size_t DTypeSize(DType dtype);
// Bytes of `n` elements (for a block type, n a multiple of kBlockElems).
size_t DTypeBytes(DType dtype, int64_t n);
absl::string_view DTypeName(DType dtype);

// Host-side conversions between f32 and a storage dtype (f32, f16, bf16, or
// a block type with n a multiple of 32), rounding to nearest (even); the
// block types quantize as GGML's reference code does. Used when weights are
// loaded (and GGUF tensors read) and when tests read device buffers back.
void ConvertFromF32(const float* src, DType dtype, void* dst, int64_t n);
void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n);
// One IEEE half (a block's scale) to f32, exactly; and f32 to the nearest
// half (ties to even).
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);

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
