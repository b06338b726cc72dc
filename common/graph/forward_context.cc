#include "common/graph/forward_context.h"

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"

namespace tandem {
namespace {
thread_local const ForwardContext* current_context = nullptr;
}  // namespace

const ForwardContext* CurrentForwardContext() { return current_context; }

absl::Status ValidateRuntimeMode(CudaGraphMode mode) {
  if (mode.valid_runtime_mode()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "runtime mode must be NONE, PIECEWISE or FULL, got ", mode.name()));
}

ForwardContextScope::ForwardContextScope(CudaGraphMode runtime_mode,
                                         const BatchDescriptor& descriptor, bool capture_only)
    : context_{runtime_mode, descriptor, capture_only}, previous_(current_context) {
  TANDEM_CHECK(runtime_mode.valid_runtime_mode())
      << "forward context runtime mode must be NONE, PIECEWISE or FULL, got "
      << runtime_mode;
  current_context = &context_;
}

ForwardContextScope::~ForwardContextScope() { current_context = previous_; }

}  // namespace tandem
