#include "common/model/gguf.h"

#include <algorithm>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/model/safetensors.h"

namespace tandem {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
// Limits far above any real model, far below what would exhaust memory.
constexpr uint64_t kMaxTensors = 1u << 20;
constexpr uint64_t kMaxKeyValues = 1u << 20;
constexpr uint64_t kMaxDims = 4;

// A bounds-checked little-endian reader over the mapped bytes.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t size, const std::string& name)
      : p_(p), size_(size), name_(name) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  absl::Status Need(uint64_t n, absl::string_view what) {
    if (n > remaining()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name_, ": truncated at byte ", pos_, " reading ", what, " (", n, " bytes needed, ",
          remaining(), " left)"));
    }
    return absl::OkStatus();
  }
  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  absl::StatusOr<std::string> ReadString(absl::string_view what) {
    ASSIGN_OR_RETURN(uint64_t n, Read<uint64_t>(what));
    RETURN_IF_ERROR(Need(n, what));
    std::string s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": ", what, " (at byte ", pos_, ")"));
  }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& name_;
};

size_t ScalarSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kBool: return 1;
    case GgufValueType::kU16: case GgufValueType::kI16: return 2;
    case GgufValueType::kU32: case GgufValueType::kI32: case GgufValueType::kF32: return 4;
    case GgufValueType::kU64: case GgufValueType::kI64: case GgufValueType::kF64: return 8;
    default: return 0;
  }
}

// Reads one scalar of type `t` into (i, f).
absl::Status ReadScalar(Cursor& c, GgufValueType t, int64_t* i, double* f) {
  switch (t) {
    case GgufValueType::kU8: { ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>("u8")); *i = v; break; }
    case GgufValueType::kI8: { ASSIGN_OR_RETURN(int8_t v, c.Read<int8_t>("i8")); *i = v; break; }
    case GgufValueType::kBool: { ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>("bool")); *i = v != 0; break; }
    case GgufValueType::kU16: { ASSIGN_OR_RETURN(uint16_t v, c.Read<uint16_t>("u16")); *i = v; break; }
    case GgufValueType::kI16: { ASSIGN_OR_RETURN(int16_t v, c.Read<int16_t>("i16")); *i = v; break; }
    case GgufValueType::kU32: { ASSIGN_OR_RETURN(uint32_t v, c.Read<uint32_t>("u32")); *i = v; break; }
    case GgufValueType::kI32: { ASSIGN_OR_RETURN(int32_t v, c.Read<int32_t>("i32")); *i = v; break; }
    case GgufValueType::kU64: {
      ASSIGN_OR_RETURN(uint64_t v, c.Read<uint64_t>("u64"));
      *i = v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(v);
      break;
    }
    case GgufValueType::kI64: { ASSIGN_OR_RETURN(int64_t v, c.Read<int64_t>("i64")); *i = v; break; }
    case GgufValueType::kF32: { ASSIGN_OR_RETURN(float v, c.Read<float>("f32")); *f = v; break; }
    case GgufValueType::kF64: { ASSIGN_OR_RETURN(double v, c.Read<double>("f64")); *f = v; break; }
    default: return c.Error(absl::StrCat("unknown metadata value type ", static_cast<uint32_t>(t)));
  }
  return absl::OkStatus();
}

absl::Status ReadValue(Cursor& c, GgufValue* v, bool nested) {
  ASSIGN_OR_RETURN(uint32_t raw_type, c.Read<uint32_t>("value type"));
  v->type = static_cast<GgufValueType>(raw_type);
  if (v->type == GgufValueType::kString) {
    ASSIGN_OR_RETURN(v->s, c.ReadString("string value"));
    return absl::OkStatus();
  }
  if (v->type != GgufValueType::kArray) return ReadScalar(c, v->type, &v->i, &v->f);
  if (nested) return c.Error("nested arrays are not supported");
  ASSIGN_OR_RETURN(uint32_t elem, c.Read<uint32_t>("array element type"));
  v->elem_type = static_cast<GgufValueType>(elem);
  ASSIGN_OR_RETURN(uint64_t n, c.Read<uint64_t>("array length"));
  if (v->elem_type == GgufValueType::kString) {
    // Each string needs at least its 8-byte length.
    if (n > c.remaining() / 8) return c.Error(absl::StrCat("array of ", n, " strings overruns the file"));
    v->strings.reserve(n);
    for (uint64_t k = 0; k < n; ++k) {
      ASSIGN_OR_RETURN(std::string s, c.ReadString("array string"));
      v->strings.push_back(std::move(s));
    }
    return absl::OkStatus();
  }
  const size_t es = ScalarSize(v->elem_type);
  if (es == 0) return c.Error(absl::StrCat("unsupported array element type ", elem));
  if (n > c.remaining() / es) return c.Error(absl::StrCat("array of ", n, " elements overruns the file"));
  const bool is_float = v->elem_type == GgufValueType::kF32 || v->elem_type == GgufValueType::kF64;
  (is_float ? v->floats.reserve(n) : v->ints.reserve(n));
  for (uint64_t k = 0; k < n; ++k) {
    int64_t i = 0;
    double f = 0;
    RETURN_IF_ERROR(ReadScalar(c, v->elem_type, &i, &f));
    if (is_float) {
      v->floats.push_back(f);
    } else {
      v->ints.push_back(i);
    }
  }
  return absl::OkStatus();
}

void PutU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }
void PutStr(std::string* out, const std::string& s) {
  PutU64(out, s.size());
  out->append(s);
}

}  // namespace

std::string GgmlTypeName(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32: return "F32";
    case GgmlType::kF16: return "F16";
    case GgmlType::kQ4_0: return "Q4_0";
    case GgmlType::kQ4_1: return "Q4_1";
    case GgmlType::kQ8_0: return "Q8_0";
    case GgmlType::kBF16: return "BF16";
    default: break;
  }
  // ggml's numbering (ggml.h's enum ggml_type), the types this reader refuses
  // included, so a message names them.
  static const char* const kOthers[] = {
      nullptr,   nullptr, nullptr,  nullptr, "Q4_2",   "Q4_3",    "Q5_0",  "Q5_1",
      nullptr,   "Q8_1",  "Q2_K",   "Q3_K",  "Q4_K",   "Q5_K",    "Q6_K",  "Q8_K",
      "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",  "IQ2_S", "IQ4_XS",
      "I8",      "I16",   "I32",    "I64",   "F64",    "IQ1_M",   nullptr, "Q4_0_4_4",
      "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8",
      "MXFP4"};
  if (type < sizeof(kOthers) / sizeof(kOthers[0]) && kOthers[type] != nullptr) {
    return kOthers[type];
  }
  return absl::StrCat("type ", type);
}

bool GgmlBlockLayout(uint32_t type, int64_t* block_elems, int64_t* block_bytes) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32: *block_elems = 1; *block_bytes = 4; return true;
    case GgmlType::kF16: case GgmlType::kBF16: *block_elems = 1; *block_bytes = 2; return true;
    case GgmlType::kQ4_0: *block_elems = 32; *block_bytes = 18; return true;   // f16 d, 16 B
    case GgmlType::kQ4_1: *block_elems = 32; *block_bytes = 20; return true;   // f16 d, m, 16 B
    case GgmlType::kQ8_0: *block_elems = 32; *block_bytes = 34; return true;   // f16 d, 32 i8
    case GgmlType::kQ5_0: *block_elems = 32; *block_bytes = 22; return true;
    case GgmlType::kQ5_1: *block_elems = 32; *block_bytes = 24; return true;
    case GgmlType::kQ2_K: *block_elems = 256; *block_bytes = 84; return true;
    case GgmlType::kQ3_K: *block_elems = 256; *block_bytes = 110; return true;
    case GgmlType::kQ4_K: *block_elems = 256; *block_bytes = 144; return true;
    case GgmlType::kQ5_K: *block_elems = 256; *block_bytes = 176; return true;
    case GgmlType::kQ6_K: *block_elems = 256; *block_bytes = 210; return true;
    case GgmlType::kIQ4_NL: *block_elems = 32; *block_bytes = 18; return true;   // f16 d, 16 B
    case GgmlType::kIQ4_XS: *block_elems = 256; *block_bytes = 136; return true;
  }
  return false;
}

std::string SupportedGgmlTypeNames() {
  std::string names;
  for (uint32_t type = 0; type < 64; ++type) {
    int64_t elems = 0, bytes = 0;
    if (GgmlBlockLayout(type, &elems, &bytes)) {
      absl::StrAppend(&names, names.empty() ? "" : ", ", GgmlTypeName(type));
    }
  }
  return names;
}

std::optional<DType> GgmlTypeToDType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return DType::kF32;
    case GgmlType::kF16: return DType::kF16;
    case GgmlType::kBF16: return DType::kBF16;
    case GgmlType::kQ8_0: return DType::kQ8_0;
    case GgmlType::kQ4_0: return DType::kQ4_0;
    case GgmlType::kQ4_1: return DType::kQ4_1;
    default: return std::nullopt;
  }
}

namespace {

float F16At(const uint8_t* p) { return F16ToF32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

// The 6-bit scale and minimum of sub-block j (0..7) of a Q4_K / Q5_K block,
// packed in 12 bytes: bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2
// bits of scales 4-7; bytes 4-7 the same for the minimums; bytes 8-11 the
// low 4 bits of scale (low nibble) and minimum (high nibble) 4-7.
void KScaleMin(const uint8_t* s, int j, float* scale, float* min) {
  if (j < 4) {
    *scale = static_cast<float>(s[j] & 63);
    *min = static_cast<float>(s[j + 4] & 63);
  } else {
    *scale = static_cast<float>((s[j + 4] & 0xF) | ((s[j - 4] >> 2) & 0x30));
    *min = static_cast<float>((s[j + 4] >> 4) | ((s[j] >> 2) & 0x30));
  }
}

// One block each. Layouts as ggml's block_* structs; the arithmetic in
// the order of gguf-py's dequantize (f32): scale products first.
void DecodeQ5(const uint8_t* b, bool with_min, float* out) {
  const float d = F16At(b);
  const float m = with_min ? F16At(b + 2) : 0.f;
  const uint8_t* qhp = b + (with_min ? 4 : 2);
  const uint32_t qh = qhp[0] | (qhp[1] << 8) | (qhp[2] << 16) | (uint32_t{qhp[3]} << 24);
  const uint8_t* qs = qhp + 4;
  for (int j = 0; j < 32; ++j) {
    const int low = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
    const int q = low | (((qh >> j) & 1) << 4);
    out[j] = with_min ? d * static_cast<float>(q) + m : d * static_cast<float>(q - 16);
  }
}

void DecodeQ2K(const uint8_t* b, float* out) {  // scales[16], qs[64], d, dmin
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = F16At(b + 80), dmin = F16At(b + 82);
  for (int e = 0; e < 256; ++e) {
    const int i = e / 16, h = e / 128, shift = 2 * ((e % 128) / 32), l = e % 32;
    const float dl = d * static_cast<float>(scales[i] & 0xF);
    const float ml = dmin * static_cast<float>(scales[i] >> 4);
    out[e] = dl * static_cast<float>((qs[h * 32 + l] >> shift) & 3) - ml;
  }
}

void DecodeQ3K(const uint8_t* b, float* out) {  // hmask[32], qs[64], scales[12], d
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = F16At(b + 108);
  float dl[16];
  for (int k = 0; k < 16; ++k) {
    const int low = k < 8 ? sc[k] & 0xF : sc[k - 8] >> 4;
    const int high = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
    dl[k] = d * static_cast<float>((low | (high << 4)) - 32);
  }
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, shift = 2 * ((e % 128) / 32), l = e % 32;
    const int low = (qs[h * 32 + l] >> shift) & 3;
    const int high_bit = (hmask[l] >> (e / 32)) & 1;  // 0 subtracts 4
    out[e] = dl[e / 16] * static_cast<float>(low - (high_bit ? 0 : 4));
  }
}

void DecodeQ45K(const uint8_t* b, bool five_bit, float* out) {
  // Q4_K: d, dmin, scales[12], qs[128]; Q5_K adds qh[32] before qs.
  const float d = F16At(b), dmin = F16At(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five_bit ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    float scale, min;
    KScaleMin(sc, j, &scale, &min);
    const float dj = d * scale, mj = dmin * min;
    for (int l = 0; l < 32; ++l) {
      int q = (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 0xF;
      if (five_bit) q |= ((qh[l] >> j) & 1) << 4;
      out[j * 32 + l] = dj * static_cast<float>(q) - mj;
    }
  }
}

void DecodeQ6K(const uint8_t* b, float* out) {  // ql[128], qh[64], scales[16] (i8), d
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = F16At(b + 208);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, w = e % 128;
    const int low = (ql[h * 64 + w % 64] >> (4 * (w / 64))) & 0xF;
    const int high = (qh[h * 32 + w % 32] >> (2 * (w / 32))) & 3;
    out[e] = d * static_cast<float>(scales[e / 16]) * static_cast<float>((low | (high << 4)) - 32);
  }
}

// IQ4_NL and IQ4_XS index this table of 16 non-uniform levels (ggml's
// kvalues_iq4nl) with 4-bit quants: the 16 low nibbles of a 32-element group
// first, then the 16 high ones.
constexpr int8_t kIq4NlLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                     1,    13,   25,  38,  53,  69,  89,  113};

void DecodeIq4Group(const uint8_t* qs, float scale, float* out) {
  for (int j = 0; j < 16; ++j) {
    out[j] = scale * static_cast<float>(kIq4NlLevels[qs[j] & 0xF]);
    out[j + 16] = scale * static_cast<float>(kIq4NlLevels[qs[j] >> 4]);
  }
}

void DecodeIq4Xs(const uint8_t* b, float* out) {  // d, scales_h (u16), scales_l[4], qs[128]
  const float d = F16At(b);
  const int scales_h = b[2] | (b[3] << 8);
  for (int g = 0; g < 8; ++g) {
    const int low = (b[4 + g / 2] >> (4 * (g % 2))) & 0xF;
    const int high = (scales_h >> (2 * g)) & 3;
    DecodeIq4Group(b + 8 + 16 * g, d * static_cast<float>((low | (high << 4)) - 32), out + 32 * g);
  }
}

}  // namespace

std::optional<DType> KeptBlockType(GgmlType type) {
  if (const std::optional<DType> dt = GgmlTypeToDType(type)) {
    if (IsBlockType(*dt)) return dt;
    return std::nullopt;
  }
  // Q4_K's 32-element sub-blocks are Q4_1 blocks up to the f16 rounding of
  // their scales: 5 bits a weight instead of Q8_0's 8.5, multiplied by the
  // Q4_1 kernels. Q5_0 and IQ4_NL are Q8_0 blocks of the same values. Q5_1,
  // the other K-quants and IQ4_XS have no kernels of their own: requantized
  // to Q8_0, not widened to f32. (Kernels multiplying Q4_K and Q6_K as
  // stored, int16 lanes, cost 3.4x Q8_0's time per weight on an AVX2 EPYC,
  // where decode of SmolLM2 is bound by arithmetic, not bytes: 27.5-32
  // against 20.6-21.8 ms per step.)
  if (type == GgmlType::kQ4_K) return DType::kQ4_1;
  int64_t elems = 0, bytes = 0;
  if (GgmlBlockLayout(static_cast<uint32_t>(type), &elems, &bytes) && elems > 1) {
    return DType::kQ8_0;
  }
  return std::nullopt;
}

void ToKeptBlocks(GgmlType type, const uint8_t* src, int64_t n, void* dst) {
  const std::optional<DType> kept = KeptBlockType(type);
  TANDEM_CHECK(kept.has_value()) << GgmlTypeName(static_cast<uint32_t>(type));
  uint8_t* out = static_cast<uint8_t*>(dst);
  if (GgmlTypeToDType(type) == kept) {
    std::memcpy(out, src, DTypeBytes(*kept, n));
    return;
  }
  switch (type) {
    case GgmlType::kQ5_0:  // d, qh (the fifth bits), 16 B of low nibbles
      for (int64_t b = 0; b < n / 32; ++b, src += 22, out += kQ8BlockBytes) {
        std::memcpy(out, src, 2);
        const uint32_t qh = src[2] | (src[3] << 8) | (src[4] << 16) | (uint32_t{src[5]} << 24);
        for (int j = 0; j < 32; ++j) {
          const int low = j < 16 ? src[6 + j] & 0xF : src[6 + j - 16] >> 4;
          out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>((low | (((qh >> j) & 1) << 4)) - 16));
        }
      }
      return;
    case GgmlType::kIQ4_NL:  // d, 16 B of nibbles indexing the levels
      for (int64_t b = 0; b < n / 32; ++b, src += 18, out += kQ8BlockBytes) {
        std::memcpy(out, src, 2);
        for (int j = 0; j < 16; ++j) {
          out[2 + j] = static_cast<uint8_t>(kIq4NlLevels[src[2 + j] & 0xF]);
          out[2 + 16 + j] = static_cast<uint8_t>(kIq4NlLevels[src[2 + j] >> 4]);
        }
      }
      return;
    case GgmlType::kQ4_K:  // d, dmin, scales[12], qs[128]
      for (int64_t b = 0; b < n / 256; ++b, src += 144) {
        const float d = F16At(src), dmin = F16At(src + 2);
        for (int j = 0; j < 8; ++j, out += 20) {
          float scale, min;
          KScaleMin(src + 4, j, &scale, &min);
          const uint16_t dh = F32ToF16(d * scale), mh = F32ToF16(-(dmin * min));
          std::memcpy(out, &dh, 2);
          std::memcpy(out + 2, &mh, 2);
          // Sub-block j's quants: nibble j % 2 of qs[(j / 2) * 32 + l]; Q4_1
          // keeps element l < 16 in the low nibble of byte l, l + 16 in its high.
          const uint8_t* q = src + 16 + (j / 2) * 32;
          const int shift = 4 * (j % 2);
          for (int l = 0; l < 16; ++l) {
            out[4 + l] = static_cast<uint8_t>(((q[l] >> shift) & 0xF) |
                                              (((q[l + 16] >> shift) & 0xF) << 4));
          }
        }
      }
      return;
    default: {  // decoded, then rounded to Q8_0
      std::vector<float> values(n);
      DequantizeGgml(type, src, values.data(), n);
      ConvertFromF32(values.data(), *kept, dst, n);
      return;
    }
  }
}

void DequantizeGgml(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  if (const std::optional<DType> dt = GgmlTypeToDType(type)) {
    ConvertToF32(src, *dt, dst, n);
    return;
  }
  int64_t elems = 0, bytes = 0;
  TANDEM_CHECK(GgmlBlockLayout(static_cast<uint32_t>(type), &elems, &bytes))
      << GgmlTypeName(static_cast<uint32_t>(type));
  for (int64_t i = 0; i < n / elems; ++i) {
    const uint8_t* b = src + i * bytes;
    float* out = dst + i * elems;
    switch (type) {
      case GgmlType::kQ5_0: DecodeQ5(b, false, out); break;
      case GgmlType::kQ5_1: DecodeQ5(b, true, out); break;
      case GgmlType::kQ2_K: DecodeQ2K(b, out); break;
      case GgmlType::kQ3_K: DecodeQ3K(b, out); break;
      case GgmlType::kQ4_K: DecodeQ45K(b, false, out); break;
      case GgmlType::kQ5_K: DecodeQ45K(b, true, out); break;
      case GgmlType::kQ6_K: DecodeQ6K(b, out); break;
      case GgmlType::kIQ4_NL: DecodeIq4Group(b + 2, F16At(b), out); break;
      case GgmlType::kIQ4_XS: DecodeIq4Xs(b, out); break;
      default: TANDEM_CHECK(false) << GgmlTypeName(static_cast<uint32_t>(type));
    }
  }
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kU16:
    case GgufValueType::kI16: case GgufValueType::kU32: case GgufValueType::kI32:
    case GgufValueType::kU64: case GgufValueType::kI64:
      return true;
    default:
      return false;
  }
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

GgufFile::~GgufFile() {
  if (owns_map_) {
    munmap(const_cast<uint8_t*>(map_), size_);
  }
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open GGUF file ", path));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < 24) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a GGUF file (too short)"));
  }
  void* p = mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("cannot map ", path));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->owns_map_ = true;
  f->map_ = static_cast<const uint8_t*>(p);
  f->size_ = st.st_size;
  RETURN_IF_ERROR(f->Parse());
  return f;
}

absl::StatusOr<std::unique_ptr<GgufFile>> ParseGgufBytes(const uint8_t* bytes, size_t size,
                                                         const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  f->map_ = bytes;
  f->size_ = size;
  RETURN_IF_ERROR(f->Parse());
  return f;
}

absl::Status GgufFile::Parse() {
  Cursor c(map_, size_, path_);
  ASSIGN_OR_RETURN(uint32_t magic, c.Read<uint32_t>("magic"));
  if (magic != kMagic) return c.Error("not a GGUF file (bad magic)");
  ASSIGN_OR_RETURN(version_, c.Read<uint32_t>("version"));
  if (version_ != 2 && version_ != 3) {
    return c.Error(absl::StrCat("GGUF version ", version_, " is not supported (2 or 3)"));
  }
  ASSIGN_OR_RETURN(uint64_t n_tensors, c.Read<uint64_t>("tensor count"));
  ASSIGN_OR_RETURN(uint64_t n_kv, c.Read<uint64_t>("metadata count"));
  if (n_tensors > kMaxTensors) return c.Error(absl::StrCat("absurd tensor count ", n_tensors));
  if (n_kv > kMaxKeyValues) return c.Error(absl::StrCat("absurd metadata count ", n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    ASSIGN_OR_RETURN(std::string key, c.ReadString("metadata key"));
    GgufValue v;
    RETURN_IF_ERROR(ReadValue(c, &v, /*nested=*/false));
    metadata_[key] = std::move(v);
  }
  uint64_t alignment = 32;
  if (const GgufValue* a = Find("general.alignment")) {
    if (!a->is_integer() || a->i < 1 || a->i > (1 << 20) || (a->i & (a->i - 1)) != 0) {
      return c.Error("general.alignment must be a power of two");
    }
    alignment = a->i;
  }
  tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    ASSIGN_OR_RETURN(t.name, c.ReadString("tensor name"));
    ASSIGN_OR_RETURN(uint32_t n_dims, c.Read<uint32_t>("tensor rank"));
    if (n_dims < 1 || n_dims > kMaxDims) {
      return c.Error(absl::StrCat("tensor '", t.name, "' has rank ", n_dims));
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ASSIGN_OR_RETURN(uint64_t dim, c.Read<uint64_t>("tensor dim"));
      if (dim == 0 || dim > (uint64_t{1} << 40) || numel > (uint64_t{1} << 40) / dim) {
        return c.Error(absl::StrCat("tensor '", t.name, "' has an absurd shape"));
      }
      numel *= dim;
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    ASSIGN_OR_RETURN(t.type, c.Read<uint32_t>("tensor type"));
    ASSIGN_OR_RETURN(t.offset, c.Read<uint64_t>("tensor offset"));
    int64_t be = 0, bb = 0;
    if (GgmlBlockLayout(t.type, &be, &bb)) {
      if (t.dims[0] % be != 0) {
        return c.Error(absl::StrCat("tensor '", t.name, "': first dim ", t.dims[0],
                                    " is not a multiple of the ", GgmlTypeName(t.type),
                                    " block size ", be));
      }
      t.nbytes = numel / be * bb;
    }
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) {
      return c.Error(absl::StrCat("tensor '", t.name, "' appears twice"));
    }
    tensors_.push_back(std::move(t));
  }
  // A file without tensors (llama.cpp's vocab-only files) may end at its
  // metadata, before the padding to the data section.
  const uint64_t data_start =
      std::min<uint64_t>((c.pos() + alignment - 1) / alignment * alignment, tensors_.empty() ? size_ : UINT64_MAX);
  if (data_start > size_) return c.Error("data section starts past the end of the file");
  data_ = map_ + data_start;
  const uint64_t data_size = size_ - data_start;
  for (const GgufTensorInfo& t : tensors_) {
    if (t.offset % alignment != 0 || t.offset > data_size || t.nbytes > data_size - t.offset) {
      return c.Error(absl::StrCat("tensor '", t.name, "' at offset ", t.offset, " (", t.nbytes,
                                  " bytes) lies outside the data section (", data_size,
                                  " bytes) or is misaligned"));
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(absl::string_view key) const {
  auto it = metadata_.find(std::string(key));
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<std::string> GgufFile::GetString(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": no metadata key ", key));
  if (v->type != GgufValueType::kString) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata ", key, " is not a string"));
  }
  return v->s;
}

absl::StatusOr<int64_t> GgufFile::GetInt(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": no metadata key ", key));
  if (!v->is_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata ", key, " is not an integer"));
  }
  return v->i;
}

absl::StatusOr<double> GgufFile::GetFloat(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": no metadata key ", key));
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata ", key, " is not a number"));
}

absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": no metadata key ", key));
  if (v->type != GgufValueType::kBool) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": metadata ", key, " is not a bool"));
  }
  return v->i != 0;
}

absl::Status GgufFile::CheckDecodable(const GgufTensorInfo& t) const {
  int64_t be = 0, bb = 0;
  if (GgmlBlockLayout(t.type, &be, &bb)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", t.name, "' has type ",
                                                 GgmlTypeName(t.type), ", which is not supported (",
                                                 SupportedGgmlTypeNames(), ")"));
}

absl::Status GgufFile::ReadF32(const GgufTensorInfo& t, float* dst) const {
  RETURN_IF_ERROR(CheckDecodable(t));
  DequantizeGgml(static_cast<GgmlType>(t.type), TensorData(t), dst, t.numel());
  return absl::OkStatus();
}

void GgufWriter::AddString(const std::string& key, const std::string& v) {
  PutStr(&kv_, key);
  PutU32(&kv_, static_cast<uint32_t>(GgufValueType::kString));
  PutStr(&kv_, v);
  ++num_kv_;
}
void GgufWriter::AddU32(const std::string& key, uint32_t v) {
  PutStr(&kv_, key);
  PutU32(&kv_, static_cast<uint32_t>(GgufValueType::kU32));
  PutU32(&kv_, v);
  ++num_kv_;
}
void GgufWriter::AddF32(const std::string& key, float v) {
  PutStr(&kv_, key);
  PutU32(&kv_, static_cast<uint32_t>(GgufValueType::kF32));
  kv_.append(reinterpret_cast<const char*>(&v), 4);
  ++num_kv_;
}
void GgufWriter::AddBool(const std::string& key, bool v) {
  PutStr(&kv_, key);
  PutU32(&kv_, static_cast<uint32_t>(GgufValueType::kBool));
  kv_.push_back(v ? 1 : 0);
  ++num_kv_;
}
void GgufWriter::AddStringArray(const std::string& key, const std::vector<std::string>& v) {
  PutStr(&kv_, key);
  PutU32(&kv_, static_cast<uint32_t>(GgufValueType::kArray));
  PutU32(&kv_, static_cast<uint32_t>(GgufValueType::kString));
  PutU64(&kv_, v.size());
  for (const auto& s : v) PutStr(&kv_, s);
  ++num_kv_;
}
void GgufWriter::AddI32Array(const std::string& key, const std::vector<int32_t>& v) {
  PutStr(&kv_, key);
  PutU32(&kv_, static_cast<uint32_t>(GgufValueType::kArray));
  PutU32(&kv_, static_cast<uint32_t>(GgufValueType::kI32));
  PutU64(&kv_, v.size());
  kv_.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  ++num_kv_;
}
void GgufWriter::AddF32Array(const std::string& key, const std::vector<float>& v) {
  PutStr(&kv_, key);
  PutU32(&kv_, static_cast<uint32_t>(GgufValueType::kArray));
  PutU32(&kv_, static_cast<uint32_t>(GgufValueType::kF32));
  PutU64(&kv_, v.size());
  kv_.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  ++num_kv_;
}
void GgufWriter::AddTensor(const std::string& name, std::vector<int64_t> dims, GgmlType type,
                           std::string raw) {
  tensors_.push_back({name, std::move(dims), type, std::move(raw)});
}

std::string GgufWriter::Serialize(uint32_t alignment) const {
  std::string out;
  PutU32(&out, kMagic);
  PutU32(&out, 3);
  PutU64(&out, tensors_.size());
  PutU64(&out, num_kv_ + (alignment != 32 ? 1 : 0));
  out += kv_;
  if (alignment != 32) {
    PutStr(&out, "general.alignment");
    PutU32(&out, static_cast<uint32_t>(GgufValueType::kU32));
    PutU32(&out, alignment);
  }
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Pending& t : tensors_) {
    PutStr(&out, t.name);
    PutU32(&out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) PutU64(&out, static_cast<uint64_t>(d));
    PutU32(&out, static_cast<uint32_t>(t.type));
    PutU64(&out, offset);
    offsets.push_back(offset);
    offset = (offset + t.raw.size() + alignment - 1) / alignment * alignment;
  }
  out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  const size_t data_start = out.size();
  for (size_t k = 0; k < tensors_.size(); ++k) {
    out.resize(data_start + offsets[k], '\0');
    out += tensors_[k].raw;
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  std::ofstream f(path, std::ios::binary);
  const std::string bytes = Serialize();
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace tandem
