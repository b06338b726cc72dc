// Reading GGUF files (llama.cpp's model format, versions 2 and 3): header,
// metadata key/values, tensor infos and the aligned data section, mapped into
// memory read-only.
//
// Every count, length and offset read from the file is checked against the
// bytes that remain, so a truncated or hostile file is an INVALID_ARGUMENT that
// names the file and what was wrong, never a crash or a huge allocation.
//
// Tensor data types: F32, F16, BF16 and ggml's block formats Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1, the K-quants Q2_K-Q6_K and the non-linear IQ4_NL and IQ4_XS;
// any other type is refused when the tensor is read, naming tensor and type.
//
// Immutable after Open(); safe to read from several threads.
#ifndef TANDEM_COMMON_MODEL_GGUF_H_
#define TANDEM_COMMON_MODEL_GGUF_H_

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/backend/tensor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// ggml tensor types, by their number in the file.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
};

// "F32", "Q4_1", ... or "type N" for a number this reader does not know.
std::string GgmlTypeName(uint32_t type);
// Elements per block and bytes per block of a supported type; false otherwise.
bool GgmlBlockLayout(uint32_t type, int64_t* block_elems, int64_t* block_bytes);
// The supported types' names, comma separated, for messages.
std::string SupportedGgmlTypeNames();
// The engine's dtype with the same layout: F32, F16, BF16 and the block
// types the kernels multiply as stored (Q8_0, Q4_0, Q4_1); none for the
// other types the reader decodes (Q5_0, Q5_1, the K-quants, IQ4_NL, IQ4_XS).
std::optional<DType> GgmlTypeToDType(GgmlType type);

// Decodes `n` elements (a multiple of the type's block size) of a supported
// type to f32, as llama.cpp's dequantize_row_* (bit layouts in gguf.cc). The
// block decoders shared by every reader of ggml data.
void DequantizeGgml(GgmlType type, const uint8_t* src, float* dst, int64_t n);

// The block type the CPU kernels keep a tensor of `type` in (weights kept as
// the file's blocks): its own for Q8_0, Q4_0 and Q4_1, Q4_1 for Q4_K, Q8_0
// for the other block types; none for F32, F16 and BF16.
std::optional<DType> KeptBlockType(GgmlType type);
// Writes `n` elements of `type` (whole blocks of both types) as
// KeptBlockType(type) blocks into `dst`: copied (its own type); repacked
// exactly (Q5_0 and IQ4_NL as Q8_0 blocks of the same scale and values);
// repacked sub-block by sub-block (Q4_K as Q4_1: the same quants, each
// sub-block's scale and minimum rounded to f16, a relative 2^-11); or
// decoded and requantized (the rest).
void ToKeptBlocks(GgmlType type, const uint8_t* src, int64_t n, void* dst);

// GGUF metadata value types.
enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// One metadata value. Scalars are widened: integers and bools to `i`
// (u64 above INT64_MAX clamps), floats to `f`. Arrays hold their elements in
// `array` (strings in `strings`, numbers in `ints`/`floats`).
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  int64_t i = 0;
  double f = 0;
  std::string s;
  GgufValueType elem_type = GgufValueType::kU8;  // arrays only
  std::vector<std::string> strings;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  bool is_integer() const;
  bool is_float() const { return type == GgufValueType::kF32 || type == GgufValueType::kF64; }
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ggml order: dims[0] varies fastest
  uint32_t type = 0;
  uint64_t offset = 0;        // from the start of the data section
  uint64_t nbytes = 0;
  int64_t numel() const;
};

class GgufFile {
 public:
  // Maps `path` and parses header, metadata and tensor infos. NOT_FOUND when
  // the file cannot be opened; INVALID_ARGUMENT names the file and the fault.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  const GgufValue* Find(absl::string_view key) const;
  const GgufTensorInfo* FindTensor(absl::string_view name) const;

  // Typed accessors: NOT_FOUND names the missing key, INVALID_ARGUMENT a key of
  // another type.
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  absl::StatusOr<double> GetFloat(absl::string_view key) const;  // ints accepted
  absl::StatusOr<bool> GetBool(absl::string_view key) const;

  // The tensor's raw bytes (inside the mapping).
  const uint8_t* TensorData(const GgufTensorInfo& t) const { return data_ + t.offset; }
  // Decodes the whole tensor to f32 into `dst` (numel() floats).
  // INVALID_ARGUMENT names the tensor and an unsupported type.
  absl::Status ReadF32(const GgufTensorInfo& t, float* dst) const;
  // OK when this reader decodes the tensor's type; else ReadF32's error.
  absl::Status CheckDecodable(const GgufTensorInfo& t) const;

 private:
  GgufFile() = default;
  absl::Status Parse();
  friend absl::StatusOr<std::unique_ptr<GgufFile>> ParseGgufBytes(const uint8_t*, size_t,
                                                                  const std::string&);

  std::string path_;  // or the name given to ParseGgufBytes()
  bool owns_map_ = false;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Parses GGUF bytes already in memory (the file reader and the fuzz target):
// the same checks as Open(), over `bytes`, which must outlive the result.
absl::StatusOr<std::unique_ptr<GgufFile>> ParseGgufBytes(const uint8_t* bytes, size_t size,
                                                         const std::string& name);

// A GGUF writer for tests and fixtures: metadata (strings, integers as u32 or
// i32/u64 as given, floats as f32, bools, arrays of strings / i32 / f32) and
// tensors whose raw bytes are given in the tensor's type.
class GgufWriter {
 public:
  void AddString(const std::string& key, const std::string& v);
  void AddU32(const std::string& key, uint32_t v);
  void AddF32(const std::string& key, float v);
  void AddBool(const std::string& key, bool v);
  void AddStringArray(const std::string& key, const std::vector<std::string>& v);
  void AddI32Array(const std::string& key, const std::vector<int32_t>& v);
  void AddF32Array(const std::string& key, const std::vector<float>& v);
  // `dims` in ggml order; `raw` holds the tensor in `type`'s encoding.
  void AddTensor(const std::string& name, std::vector<int64_t> dims, GgmlType type,
                 std::string raw);
  std::string Serialize(uint32_t alignment = 32) const;
  absl::Status WriteFile(const std::string& path) const;

 private:
  std::string kv_;
  uint64_t num_kv_ = 0;
  struct Pending {
    std::string name;
    std::vector<int64_t> dims;
    GgmlType type;
    std::string raw;
  };
  std::vector<Pending> tensors_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_MODEL_GGUF_H_
