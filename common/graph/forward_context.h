// ForwardContext: the per-step (runtime mode, batch descriptor) that the model
// runner sets from the dispatcher's answer and every CudaGraphWrapper trusts
// (vLLM's set_forward_context).
//
// Thread-local: each engine thread has its own, set by a ForwardContextScope
// for the duration of one forward. Scopes nest; the innermost wins and the
// outer one is restored on exit.
#ifndef TANDEM_COMMON_GRAPH_FORWARD_CONTEXT_H_
#define TANDEM_COMMON_GRAPH_FORWARD_CONTEXT_H_

#include "absl/status/status.h"
#include "common/graph/batch_descriptor.h"
#include "common/graph/cudagraph_mode.h"

namespace tandem {

struct ForwardContext {
  CudaGraphMode runtime_mode = CudaGraphMode::kNone;
  BatchDescriptor descriptor;
  // A start-up capture pass on dummy inputs (vLLM's capture runs): wrappers
  // record their graph and do not run it, since nobody reads the outputs.
  bool capture_only = false;
};

// The context of the current thread, or nullptr outside any scope.
const ForwardContext* CurrentForwardContext();

// INVALID_ARGUMENT unless `mode` is NONE, PIECEWISE or FULL.
absl::Status ValidateRuntimeMode(CudaGraphMode mode);

class ForwardContextScope {
 public:
  // `runtime_mode` must be a valid runtime mode (see ValidateRuntimeMode());
  // a composite mode here is a programming error and aborts.
  ForwardContextScope(CudaGraphMode runtime_mode, const BatchDescriptor& descriptor,
                      bool capture_only = false);
  ~ForwardContextScope();
  ForwardContextScope(const ForwardContextScope&) = delete;
  ForwardContextScope& operator=(const ForwardContextScope&) = delete;

 private:
  ForwardContext context_;
  const ForwardContext* previous_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_GRAPH_FORWARD_CONTEXT_H_
