#include "common/backend/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/logging.h"

namespace tandem {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t ToBf16(float f) {
  const uint32_t u = Bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

uint16_t ToF16(float f) {
  const uint32_t u = Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal half (or zero): scale by 2^24 and round
    const float scaled = FromBits(abs) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to even.
  const uint32_t rebased = abs - 0x38000000u;
  return static_cast<uint16_t>(sign | ((rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13));
}

float Bf16ToF32(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }


// The blocks of n elements of a block type; n must be whole blocks.
int64_t WholeBlocks(DType dtype, int64_t n) {
  TANDEM_CHECK(n % kBlockElems == 0) << DTypeName(dtype) << ": " << n
                                       << " elements is not whole blocks";
  return n / kBlockElems;
}

}  // namespace

uint16_t F32ToF16(float f) { return ToF16(f); }

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return FromBits(sign | 0x7f800000u | (mant << 13));
  return FromBits(sign | ((exp + 112) << 23) | (mant << 13));
}

namespace {

// A corrupt file may hold NaN weights; the quantizers take them as 0 (the
// block's scale stays that of its other values).
void FiniteOrZeroBlock(const float* src, float* x) {
  for (int i = 0; i < kBlockElems; ++i) x[i] = std::isnan(src[i]) ? 0.f : src[i];
}

// `v` truncated to an integer level in [lo, hi]. Converting a float out of
// int range (an infinite weight makes the products inf or NaN) is undefined
// behaviour, so the clamp comes first; NaN gives lo.
int Level(float v, int lo, int hi) {
  if (!(v >= static_cast<float>(lo))) return lo;
  return v <= static_cast<float>(hi) ? static_cast<int>(v) : hi;
}

}  // namespace

void ConvertFromF32(const float* src, DType dtype, void* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = ToBf16(src[i]);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = ToF16(src[i]);
      return;
    case DType::kQ8_0: {
      auto* out = static_cast<uint8_t*>(dst);
      const int64_t blocks = WholeBlocks(dtype, n);
      for (int64_t b = 0; b < blocks; ++b, out += kQ8BlockBytes) {
        float x[kBlockElems];
        FiniteOrZeroBlock(src + b * kBlockElems, x);
        float amax = 0.f;
        for (int i = 0; i < kBlockElems; ++i) amax = std::max(amax, std::fabs(x[i]));
        // As GGML: the f16 scale, and the values rounded against the scale
        // before its rounding.
        const float d = amax / 127.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        const uint16_t dh = ToF16(d);
        std::memcpy(out, &dh, 2);
        for (int i = 0; i < kBlockElems; ++i) {
          const int level = Level(std::nearbyint(x[i] * id), -127, 127);
          out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(level));
        }
      }
      return;
    }
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const bool q4_1 = dtype == DType::kQ4_1;
      auto* out = static_cast<uint8_t*>(dst);
      const int64_t blocks = WholeBlocks(dtype, n);
      for (int64_t b = 0; b < blocks; ++b, out += BlockBytes(dtype)) {
        float x[kBlockElems];
        FiniteOrZeroBlock(src + b * kBlockElems, x);
        float d, m = 0.f;
        if (q4_1) {  // GGML quantize_row_q4_1_ref: [min, max] over 15 steps
          float lo = x[0], hi = x[0];
          for (int i = 1; i < kBlockElems; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
          d = (hi - lo) / 15.f;
          m = lo;
        } else {  // quantize_row_q4_0_ref: the element of largest magnitude maps to -8
          float amax = 0.f, max = 0.f;
          for (int i = 0; i < kBlockElems; ++i) {
            if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
          }
          d = max / -8.f;
        }
        const float id = d != 0.f ? 1.f / d : 0.f;
        const uint16_t dh = ToF16(d), mh = ToF16(m);
        std::memcpy(out, &dh, 2);
        if (q4_1) std::memcpy(out + 2, &mh, 2);
        uint8_t* q = out + (q4_1 ? 4 : 2);
        for (int j = 0; j < kBlockElems / 2; ++j) {
          const float bias = q4_1 ? 0.5f : 8.5f;
          const int lo = Level((x[j] - m) * id + bias, 0, 15);
          const int hi = Level((x[j + 16] - m) * id + bias, 0, 15);
          q[j] = static_cast<uint8_t>(lo | (hi << 4));
        }
      }
      return;
    }
    case DType::kI32:
      break;
  }
  TANDEM_CHECK(false) << "no f32 conversion to " << DTypeName(dtype);
}

namespace {
uint16_t LoadU16(const void* base, int64_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const char*>(base) + 2 * i, 2);
  return v;
}
}  // namespace

void ConvertToF32(const void* src, DType dtype, float* dst, int64_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    // 16-bit elements read byte-wise: a file's tensor data need not be
    // 2-byte aligned (a GGUF's general.alignment may be odd).
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(LoadU16(src, i));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(LoadU16(src, i));
      return;
    case DType::kQ8_0: {
      const auto* in = static_cast<const uint8_t*>(src);
      const int64_t blocks = WholeBlocks(dtype, n);
      for (int64_t b = 0; b < blocks; ++b, in += kQ8BlockBytes) {
        uint16_t dh;
        std::memcpy(&dh, in, 2);
        const float d = F16ToF32(dh);
        for (int i = 0; i < kBlockElems; ++i) {
          dst[b * kBlockElems + i] = d * static_cast<int8_t>(in[2 + i]);
        }
      }
      return;
    }
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const bool q4_1 = dtype == DType::kQ4_1;
      const auto* in = static_cast<const uint8_t*>(src);
      const int64_t blocks = WholeBlocks(dtype, n);
      for (int64_t b = 0; b < blocks; ++b, in += BlockBytes(dtype), dst += 32) {
        uint16_t dh, mh = 0;
        std::memcpy(&dh, in, 2);
        if (q4_1) std::memcpy(&mh, in + 2, 2);
        const float d = F16ToF32(dh), m = F16ToF32(mh);
        const uint8_t* q = in + (q4_1 ? 4 : 2);
        const int offset = q4_1 ? 0 : 8;
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * static_cast<float>((q[j] & 0x0f) - offset) + m;
          dst[j + 16] = d * static_cast<float>((q[j] >> 4) - offset) + m;
        }
      }
      return;
    }
    case DType::kI32:
      break;
  }
  TANDEM_CHECK(false) << "no f32 conversion from " << DTypeName(dtype);
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kQ8_0: case DType::kQ4_0: case DType::kQ4_1: return 0;
  }
  return 0;
}

bool IsBlockType(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || dtype == DType::kQ4_1;
}

size_t BlockBytes(DType dtype) {
  switch (dtype) {
    case DType::kQ8_0: return kQ8BlockBytes;
    case DType::kQ4_0: return 2 + 16;
    case DType::kQ4_1: return 4 + 16;
    default: return 0;
  }
}

size_t DTypeBytes(DType dtype, int64_t n) {
  if (IsBlockType(dtype)) {
    return static_cast<size_t>((n + kBlockElems - 1) / kBlockElems) * BlockBytes(dtype);
  }
  return static_cast<size_t>(n) * DTypeSize(dtype);
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_0: return "q4_0";
    case DType::kQ4_1: return "q4_1";
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
