// SchedulingPolicy: vLLM's --scheduling-policy (the Scheduler's order of
// its waiting line and choice of whom to preempt). Apart from the scheduler
// so the flag parsers (and their fuzzer) need nothing else of the engine.
#ifndef TANDEM_COMMON_ENGINE_SCHEDULING_POLICY_H_
#define TANDEM_COMMON_ENGINE_SCHEDULING_POLICY_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

enum class SchedulingPolicy { kFcfs, kPriority };

// "fcfs" or "priority" (vLLM's names); INVALID_ARGUMENT names the flag.
absl::StatusOr<SchedulingPolicy> ParseSchedulingPolicy(absl::string_view name);
const char* SchedulingPolicyName(SchedulingPolicy policy);

}  // namespace tandem

#endif  // TANDEM_COMMON_ENGINE_SCHEDULING_POLICY_H_
