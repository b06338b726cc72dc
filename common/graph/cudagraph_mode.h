// CudaGraphMode: vLLM's CUDAGraphMode (vllm/config/compilation.py), the one
// knob that says which graphs exist for which kind of batch.
//
// The three single modes (NONE, PIECEWISE, FULL) are also the runtime modes a
// step is dispatched to. The two composite modes are (decode, mixed) pairs:
//   FULL_DECODE_ONLY   = (FULL, NONE)
//   FULL_AND_PIECEWISE = (FULL, PIECEWISE)
//
//   mode                decode batch  mixed batch  needs piecewise split
//   NONE                NONE          NONE         no
//   PIECEWISE           PIECEWISE     PIECEWISE    yes
//   FULL                FULL          FULL         no
//   FULL_DECODE_ONLY    FULL          NONE         no
//   FULL_AND_PIECEWISE  FULL          PIECEWISE    yes
//
// A value type; thread-compatible.
#ifndef TANDEM_COMMON_GRAPH_CUDAGRAPH_MODE_H_
#define TANDEM_COMMON_GRAPH_CUDAGRAPH_MODE_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include <array>
#include <cstdlib>

#include "absl/strings/string_view.h"

namespace tandem {

class CudaGraphMode {
 public:
  enum Value : uint8_t {
    kNone = 0,
    kPiecewise = 1,
    kFull = 2,
    kFullDecodeOnly = 3,    // (FULL, NONE)
    kFullAndPiecewise = 4,  // (FULL, PIECEWISE)
  };

  constexpr CudaGraphMode() : value_(kNone) {}
  constexpr CudaGraphMode(Value value) : value_(value) {}  // NOLINT: implicit
  constexpr operator Value() const { return value_; }      // NOLINT: switch

  // Upstream methods, same names and meaning.
  // True for the composite (decode, mixed) modes.
  bool separate_routine() const;
  // The single mode used for uniform-decode batches.
  CudaGraphMode decode_mode() const;
  // The single mode used for mixed (prefill / prefill+decode) batches.
  CudaGraphMode mixed_mode() const;
  // Whether `target` is one of this mode's routines. `target` must be a single
  // mode (NONE, PIECEWISE or FULL); a composite target is a programming error
  // and aborts, as upstream asserts.
  bool has_mode(CudaGraphMode target) const;
  bool requires_piecewise_compilation() const;
  // The highest single mode among the routines (NONE < PIECEWISE < FULL).
  CudaGraphMode max_cudagraph_mode() const;
  bool has_full_cudagraphs() const;
  bool has_piecewise_cudagraphs() const;
  // NONE, PIECEWISE and FULL are the only valid runtime modes.
  bool valid_runtime_mode() const;

  // The upstream name: "NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY",
  // "FULL_AND_PIECEWISE".
  absl::string_view name() const;

  // Case-insensitive parse of an upstream name. INVALID_ARGUMENT lists the
  // valid names.
  static absl::StatusOr<CudaGraphMode> Parse(absl::string_view text);

 private:
  Value value_;
};

std::ostream& operator<<(std::ostream& os, CudaGraphMode mode);
inline std::string AbslFormatFlagOrString(CudaGraphMode mode) {
  return std::string(mode.name());
}

// One T per runtime mode (NONE, PIECEWISE, FULL), indexed by the mode itself
// so that no caller keeps a 0/1/2 convention of its own. Indexing with a
// composite mode is a programming error and aborts.
template <typename T>
class PerMode {
 public:
  static constexpr std::array<CudaGraphMode::Value, 3> kModes = {
      CudaGraphMode::kNone, CudaGraphMode::kPiecewise, CudaGraphMode::kFull};
  T& operator[](CudaGraphMode m) { return values_[Index(m)]; }
  const T& operator[](CudaGraphMode m) const { return values_[Index(m)]; }
  bool operator==(const PerMode& other) const { return values_ == other.values_; }

 private:
  static size_t Index(CudaGraphMode m) {
    if (!m.valid_runtime_mode()) std::abort();
    return static_cast<size_t>(static_cast<CudaGraphMode::Value>(m));
  }
  std::array<T, 3> values_{};
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GRAPH_CUDAGRAPH_MODE_H_
