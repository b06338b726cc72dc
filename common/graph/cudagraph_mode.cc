#include "common/graph/cudagraph_mode.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem {
namespace {

// Upstream stores composites as the tuple (decode, mixed).
struct Routines {
  CudaGraphMode::Value decode;
  CudaGraphMode::Value mixed;
};

Routines RoutinesOf(CudaGraphMode::Value v) {
  switch (v) {
    case CudaGraphMode::kFullDecodeOnly:
      return {CudaGraphMode::kFull, CudaGraphMode::kNone};
    case CudaGraphMode::kFullAndPiecewise:
      return {CudaGraphMode::kFull, CudaGraphMode::kPiecewise};
    default:
      return {v, v};
  }
}

constexpr CudaGraphMode::Value kAllModes[] = {
    CudaGraphMode::kNone, CudaGraphMode::kPiecewise, CudaGraphMode::kFull,
    CudaGraphMode::kFullDecodeOnly, CudaGraphMode::kFullAndPiecewise};

}  // namespace

bool CudaGraphMode::separate_routine() const {
  return value_ == kFullDecodeOnly || value_ == kFullAndPiecewise;
}

CudaGraphMode CudaGraphMode::decode_mode() const { return RoutinesOf(value_).decode; }

CudaGraphMode CudaGraphMode::mixed_mode() const { return RoutinesOf(value_).mixed; }

bool CudaGraphMode::has_mode(CudaGraphMode target) const {
  TANDEM_CHECK(!target.separate_routine())
      << "has_mode() takes a single mode, got " << target.name();
  if (separate_routine()) {
    const Routines r = RoutinesOf(value_);
    return r.decode == target.value_ || r.mixed == target.value_;
  }
  return value_ == target.value_;
}

bool CudaGraphMode::requires_piecewise_compilation() const {
  return has_mode(kPiecewise);
}

CudaGraphMode CudaGraphMode::max_cudagraph_mode() const {
  if (!separate_routine()) return *this;
  const Routines r = RoutinesOf(value_);
  return std::max(r.decode, r.mixed);
}

bool CudaGraphMode::has_full_cudagraphs() const {
  return max_cudagraph_mode() == kFull;
}

bool CudaGraphMode::has_piecewise_cudagraphs() const {
  return requires_piecewise_compilation();
}

bool CudaGraphMode::valid_runtime_mode() const {
  return value_ == kNone || value_ == kPiecewise || value_ == kFull;
}

absl::string_view CudaGraphMode::name() const {
  switch (value_) {
    case kNone: return "NONE";
    case kPiecewise: return "PIECEWISE";
    case kFull: return "FULL";
    case kFullDecodeOnly: return "FULL_DECODE_ONLY";
    case kFullAndPiecewise: return "FULL_AND_PIECEWISE";
  }
  return "UNKNOWN";
}

absl::StatusOr<CudaGraphMode> CudaGraphMode::Parse(absl::string_view text) {
  const std::string upper =
      absl::AsciiStrToUpper(absl::StripAsciiWhitespace(text));
  for (Value v : kAllModes) {
    if (CudaGraphMode(v).name() == upper) return CudaGraphMode(v);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "cudagraph mode '", text,
      "' is not one of NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, "
      "FULL_AND_PIECEWISE"));
}

std::ostream& operator<<(std::ostream& os, CudaGraphMode mode) {
  return os << mode.name();
}

}  // namespace tandem
